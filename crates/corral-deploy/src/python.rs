//! Which Python interpreter a deployment uses (seed 000's "smart"
//! selection): the newest *stable* interpreter present that satisfies
//! `requires-python`, not a just-released one that packages have no wheels
//! for yet; and a sentence saying which and why.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::DeployError;

/// The newest minor series corral treats as stable (Python 3.15 came out
/// in October 2026; its ecosystem of wheels lags for months). A newer
/// series, or any pre-release, is used only when nothing else satisfies
/// the project. `--python-newest-stable` moves it.
pub const NEWEST_STABLE: (u32, u32) = (3, 14);

/// Where interpreters are looked for by default.
pub const PYTHON_SEARCH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// A Python version as `python --version` prints it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PyVersion {
    /// Release numbers (`[3, 13, 1]`).
    pub release: Vec<u32>,
    /// A pre-release tag (`a1`, `b2`, `rc1`), if any. Sorts after the
    /// release numbers, so `3.14.0rc1` > `3.13.9`.
    pub pre: Option<String>,
}

impl PyVersion {
    /// Parses `3.13.1`, `3.14.0rc1`, or `Python 3.13.1`.
    pub fn parse(text: &str) -> Option<PyVersion> {
        let t = text.trim();
        let t = t.strip_prefix("Python ").unwrap_or(t).trim();
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (nums, rest) = t.split_at(end);
        let release: Vec<u32> = nums
            .trim_end_matches('.')
            .split('.')
            .map(|n| n.parse().ok())
            .collect::<Option<_>>()?;
        if release.is_empty() || release.len() > 3 {
            return None;
        }
        let rest = rest.trim();
        let pre = if rest.is_empty() || rest == "+" {
            None
        } else {
            Some(rest.to_string())
        };
        Some(PyVersion { release, pre })
    }

    fn part(&self, i: usize) -> u32 {
        self.release.get(i).copied().unwrap_or(0)
    }

    /// `(major, minor)`.
    pub fn series(&self) -> (u32, u32) {
        (self.part(0), self.part(1))
    }
}

impl std::fmt::Display for PyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nums: Vec<String> = self.release.iter().map(u32::to_string).collect();
        write!(f, "{}{}", nums.join("."), self.pre.as_deref().unwrap_or(""))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
    Ne,
    Compatible,
}

/// A PEP 440 version specifier set as `requires-python` uses it
/// (`>=3.10`, `>=3.9,<3.13`, `~=3.11`, `==3.12.*`, `!=3.12.1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequiresPython {
    text: String,
    clauses: Vec<(Op, Vec<u32>, bool)>,
}

impl RequiresPython {
    /// Parses a specifier set; an unknown form is an error naming it.
    pub fn parse(text: &str) -> Result<RequiresPython, DeployError> {
        let bad = |why: &str| {
            DeployError::Python(format!(
                "requires-python `{text}`: {why}; write specifiers such as `>=3.10` or `>=3.10,<3.14`"
            ))
        };
        let mut clauses = Vec::new();
        for part in text.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (op, rest) = [
                ("~=", Op::Compatible),
                ("===", Op::Eq),
                ("==", Op::Eq),
                ("!=", Op::Ne),
                (">=", Op::Ge),
                ("<=", Op::Le),
                (">", Op::Gt),
                ("<", Op::Lt),
            ]
            .iter()
            .find_map(|(s, op)| p.strip_prefix(s).map(|r| (*op, r.trim())))
            .ok_or_else(|| bad(&format!("`{p}` has no comparison operator")))?;
            let (nums, wildcard) = match rest.strip_suffix(".*") {
                Some(n) => (n, true),
                None => (rest, false),
            };
            if wildcard && !matches!(op, Op::Eq | Op::Ne) {
                return Err(bad(&format!("`{p}`: `.*` only goes with == and !=")));
            }
            let release: Vec<u32> = nums
                .split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<_>>()
                .ok_or_else(|| bad(&format!("`{p}` is not a version")))?;
            if op == Op::Compatible && release.len() < 2 {
                return Err(bad(&format!("`{p}`: ~= needs at least two numbers")));
            }
            clauses.push((op, release, wildcard));
        }
        Ok(RequiresPython {
            text: text.to_string(),
            clauses,
        })
    }

    /// Whether `v` satisfies every clause (its release numbers; a
    /// pre-release is compared by its release).
    pub fn allows(&self, v: &PyVersion) -> bool {
        self.clauses.iter().all(|(op, want, wildcard)| {
            let n = want.len().max(v.release.len()).max(3);
            let pad = |r: &[u32]| -> Vec<u32> {
                (0..n).map(|i| r.get(i).copied().unwrap_or(0)).collect()
            };
            let have = pad(&v.release);
            let want_p = pad(want);
            let prefix_eq = have[..want.len()] == want[..];
            match op {
                Op::Eq if *wildcard => prefix_eq,
                Op::Ne if *wildcard => !prefix_eq,
                Op::Eq => have == want_p,
                Op::Ne => have != want_p,
                Op::Ge => have >= want_p,
                Op::Gt => have > want_p,
                Op::Le => have <= want_p,
                Op::Lt => have < want_p,
                Op::Compatible => {
                    let stem = &want[..want.len() - 1];
                    have >= want_p && have[..stem.len()] == stem[..]
                }
            }
        })
    }
}

impl std::fmt::Display for RequiresPython {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// An interpreter found on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interpreter {
    /// Where it is (as found, not resolved: a venv made with it names it).
    pub path: PathBuf,
    /// What it reported.
    pub version: PyVersion,
}

/// Runs a host interpreter with `args`, an empty environment and a 10 s
/// bound; `None` when it cannot start or does not finish in time.
fn run_bounded(path: &Path, args: &[&str]) -> Option<std::process::Output> {
    let mut child = std::process::Command::new(path)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    child.wait_with_output().ok()
}

/// Asks `path --version`; `None` when it does not answer like a Python 3.
fn ask_version(path: &Path) -> Option<PyVersion> {
    let out = run_bounded(path, &["--version"])?;
    // Python 2 printed its version on stderr.
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    PyVersion::parse(text.lines().next()?).filter(|v| v.part(0) == 3)
}

/// Whether the interpreter has pip of its own (≥ 22.3, for `--python`):
/// then the venv is made without pip (ensurepip costs seconds) and the
/// interpreter's pip installs into it.
pub(crate) fn has_pip(path: &Path) -> bool {
    run_bounded(
        path,
        &["-c", "import pip, sys; v = tuple(int(x) for x in pip.__version__.split('.')[:2]); sys.exit(0 if v >= (22, 3) else 1)"],
    )
    .is_some_and(|o| o.status.success())
}

/// Finds `python3` and `python3.N` in `dirs` (each file once, by its
/// resolved path) and asks each for its version. These are the host's own
/// interpreters, in directories the operator named; nothing of the source
/// runs here.
pub fn discover_interpreters(dirs: &[PathBuf]) -> Vec<Interpreter> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| {
                n == "python3"
                    || n.strip_prefix("python3.")
                        .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect();
        // `python3.N` before `python3`: a venv then names the versioned
        // file, which a change of the `python3` link does not move.
        names.sort_by_key(|n| (n == "python3", n.clone()));
        for name in names {
            let path = dir.join(&name);
            let Ok(real) = std::fs::canonicalize(&path) else {
                continue;
            };
            if !seen.insert(real) {
                continue;
            }
            if let Some(version) = ask_version(&path) {
                out.push(Interpreter { path, version });
            }
        }
    }
    out
}

/// The interpreter picked, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PythonChoice {
    /// The interpreter.
    pub interpreter: Interpreter,
    /// One sentence: the rule that picked it and what was passed over.
    pub reason: String,
}

/// Picks the interpreter (seed 000's order): the newest stable release
/// (series at most `newest_stable`, no pre-release) that satisfies
/// `requires`; failing that, the newest final release of a newer series;
/// failing that, the newest pre-release. None satisfying is an error that
/// lists what was found.
pub fn select_python(
    found: &[Interpreter],
    requires: Option<&RequiresPython>,
    newest_stable: (u32, u32),
) -> Result<PythonChoice, DeployError> {
    if found.is_empty() {
        return Err(DeployError::Python(
            "no python3 interpreter found; install one, or name the directories to search with --python-search DIR".into(),
        ));
    }
    let listed = || {
        found
            .iter()
            .map(|i| format!("{} ({})", i.path.display(), i.version))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ok: Vec<&Interpreter> = found
        .iter()
        .filter(|i| requires.is_none_or(|r| r.allows(&i.version)))
        .collect();
    let constraint = requires
        .map(|r| format!("requires-python `{r}`"))
        .unwrap_or_else(|| "no requires-python".into());
    let stable = |i: &&Interpreter| i.version.pre.is_none() && i.version.series() <= newest_stable;
    let (ns_major, ns_minor) = newest_stable;
    fn best(list: Vec<&Interpreter>) -> Option<&Interpreter> {
        list.into_iter().max_by(|a, b| a.version.cmp(&b.version))
    }
    if let Some(pick) = best(ok.iter().copied().filter(stable).collect()) {
        let passed: Vec<String> = ok
            .iter()
            .filter(|i| !stable(i))
            .map(|i| format!("{} ({})", i.path.display(), i.version))
            .collect();
        let mut reason = format!(
            "picked {} (Python {}): the newest stable interpreter satisfying {constraint}",
            pick.path.display(),
            pick.version
        );
        if !passed.is_empty() {
            reason += &format!(
                "; passed over just-released {} (newer than {ns_major}.{ns_minor} or a pre-release: packages may lack wheels for it)",
                passed.join(", ")
            );
        }
        return Ok(PythonChoice {
            interpreter: (*pick).clone(),
            reason,
        });
    }
    let finals: Vec<&Interpreter> = ok
        .iter()
        .copied()
        .filter(|i| i.version.pre.is_none())
        .collect();
    let pick = best(finals).or_else(|| best(ok.clone()));
    match pick {
        Some(pick) => Ok(PythonChoice {
            interpreter: pick.clone(),
            reason: format!(
                "picked {} (Python {}): only a just-released interpreter (newer than {ns_major}.{ns_minor} or a pre-release) satisfies {constraint}",
                pick.path.display(),
                pick.version
            ),
        }),
        None => Err(DeployError::Python(format!(
            "no interpreter satisfies {constraint}; found {}. Install a matching Python, or point --python-search at one",
            listed()
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn interp(v: &str) -> Interpreter {
        Interpreter {
            path: PathBuf::from(format!("/x/python{v}")),
            version: PyVersion::parse(v).unwrap(),
        }
    }

    #[test]
    fn versions_parse_and_order() {
        let v = PyVersion::parse("Python 3.14.0rc1").unwrap();
        assert_eq!(v.release, vec![3, 14, 0]);
        assert_eq!(v.pre.as_deref(), Some("rc1"));
        assert_eq!(v.to_string(), "3.14.0rc1");
        assert!(PyVersion::parse("3.13.9").unwrap() < v);
        assert!(PyVersion::parse("Python").is_none());
        assert!(PyVersion::parse("nonsense").is_none());
    }

    #[test]
    fn specifiers() {
        let r = |s: &str, v: &str| {
            RequiresPython::parse(s)
                .unwrap()
                .allows(&PyVersion::parse(v).unwrap())
        };
        assert!(r(">=3.10", "3.11.2"));
        assert!(!r(">=3.10", "3.9.18"));
        assert!(r(">=3.9,<3.13", "3.12.4"));
        assert!(!r(">=3.9,<3.13", "3.13.0"));
        assert!(r("~=3.11", "3.13.1"));
        assert!(!r("~=3.11", "4.0"));
        assert!(r("~=3.11.2", "3.11.5"));
        assert!(!r("~=3.11.2", "3.12.0"));
        assert!(r("==3.12.*", "3.12.4"));
        assert!(!r("==3.12.*", "3.13.1"));
        assert!(!r("!=3.12.*", "3.12.1"));
        assert!(r(">3.11", "3.11.1"));
        assert!(r("==3.11", "3.11.0"));
        for bad in ["3.10", ">=x", "~=3", ">=3.*"] {
            assert_eq!(
                RequiresPython::parse(bad).unwrap_err().code(),
                "deploy.python",
                "{bad}"
            );
        }
    }

    #[test]
    fn seed_example_skips_bleeding_edge() {
        // Seed 000: 3.9, 3.10, 3.11, 3.13, 3.14 with 3.14 bleeding-edge
        // picks 3.13.
        let found: Vec<_> = ["3.9.18", "3.10.13", "3.11.7", "3.13.2", "3.14.0"]
            .iter()
            .map(|v| interp(v))
            .collect();
        let c = select_python(&found, None, (3, 13)).unwrap();
        assert_eq!(c.interpreter.version.to_string(), "3.13.2");
        assert!(
            c.reason
                .contains("passed over just-released /x/python3.14.0"),
            "{}",
            c.reason
        );
        // With the default newest stable (3.14), 3.14 is stable.
        let c = select_python(&found, None, NEWEST_STABLE).unwrap();
        assert_eq!(c.interpreter.version.to_string(), "3.14.0");
    }

    #[test]
    fn requires_python_is_respected() {
        let found: Vec<_> = ["3.9.18", "3.12.4", "3.13.1", "3.15.0", "3.16.0a1"]
            .iter()
            .map(|v| interp(v))
            .collect();
        let pick = |s: &str| {
            select_python(&found, Some(&RequiresPython::parse(s).unwrap()), (3, 14))
                .map(|c| c.interpreter.version.to_string())
        };
        assert_eq!(pick(">=3.10").unwrap(), "3.13.1");
        assert_eq!(pick("<3.13").unwrap(), "3.12.4");
        assert_eq!(pick(">=3.15").unwrap(), "3.15.0");
        assert_eq!(pick(">=3.16").unwrap(), "3.16.0a1");
        let e = pick(">=3.17").unwrap_err();
        assert!(e.to_string().contains("3.12.4"), "{e}");
        assert_eq!(
            select_python(&[], None, (3, 14)).unwrap_err().code(),
            "deploy.python"
        );
    }
}
