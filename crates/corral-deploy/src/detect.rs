//! Which kind of project a source tree is (seed 000's table), read from
//! its files only: nothing of the source runs here.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::DeployError;

/// The runtime a tree is deployed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Runtime {
    /// CPython 3, in a venv at `.venv`.
    #[serde(rename = "python3")]
    Python3,
    /// Node.js, with `node_modules`.
    #[serde(rename = "node")]
    Node,
}

impl Runtime {
    /// `python3` or `node`, as in `--runtime` and the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Python3 => "python3",
            Runtime::Node => "node",
        }
    }
}

impl std::str::FromStr for Runtime {
    type Err = DeployError;
    fn from_str(s: &str) -> Result<Runtime, DeployError> {
        match s {
            "python3" | "python" => Ok(Runtime::Python3),
            "node" => Ok(Runtime::Node),
            other => Err(DeployError::Config(format!(
                "--runtime {other}: unknown runtime; use python3 or node"
            ))),
        }
    }
}

/// The project pattern, which decides the install commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// `pyproject.toml` with `[build-system]` and a package: the project
    /// itself is installed (`uv sync --no-dev`, or `pip install .`).
    PythonPackage,
    /// `pyproject.toml` without a package, and `server.py`: a venv with
    /// the `[project] dependencies` (and `requirements.txt`, if any).
    PythonScript,
    /// `requirements.txt` only: a venv and `pip install -r`.
    PythonRequirements,
    /// `package.json` with `package-lock.json` or `npm-shrinkwrap.json`:
    /// `npm ci`.
    NodeCi,
    /// `package.json` without a lockfile: `npm install`.
    NodeInstall,
}

impl Pattern {
    /// The runtime of this pattern.
    pub fn runtime(self) -> Runtime {
        match self {
            Pattern::PythonPackage | Pattern::PythonScript | Pattern::PythonRequirements => {
                Runtime::Python3
            }
            Pattern::NodeCi | Pattern::NodeInstall => Runtime::Node,
        }
    }
}

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    /// The pattern.
    pub pattern: Pattern,
    /// Why this pattern, in one sentence.
    pub reason: String,
    /// `[project] requires-python`, if given.
    pub requires_python: Option<String>,
    /// `[project] dependencies` (the script pattern installs them).
    pub dependencies: Vec<String>,
    /// Whether a `requirements.txt` is there.
    pub requirements_txt: bool,
    /// `package.json`'s `scripts` (every one is checked before any phase).
    pub scripts: BTreeMap<String, String>,
}

impl Detection {
    /// The runtime of the detected pattern.
    pub fn runtime(&self) -> Runtime {
        self.pattern.runtime()
    }

    /// Whether `package.json` has a `build` script (the build phase).
    pub fn has_build_script(&self) -> bool {
        self.scripts.contains_key("build")
    }
}

/// Directories at the top of a project that are never its package.
const NOT_PACKAGES: &[&str] = &[
    "tests",
    "test",
    "docs",
    "doc",
    "examples",
    "build",
    "dist",
    "scripts",
    "benchmarks",
];

/// Reads a project file: a regular file, never through a symlink (a
/// source or a phase could point one at a host file corral may read).
pub(crate) fn read_text(path: &Path) -> Result<Option<String>, DeployError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let err = |reason: String| DeployError::Source {
        path: path.to_path_buf(),
        reason,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(format!("cannot read it: {e}"))),
    };
    if !meta.is_file() {
        return Err(err(
            "not a regular file (a link, or a directory); corral reads project files only as files"
                .into(),
        ));
    }
    let f = std::fs::File::open(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    let opened = f
        .metadata()
        .map_err(|e| err(format!("cannot read it: {e}")))?;
    if opened.ino() != meta.ino() || opened.dev() != meta.dev() {
        return Err(err("it changed while corral read it".into()));
    }
    let mut text = String::new();
    f.take(16 << 20)
        .read_to_string(&mut text)
        .map_err(|e| err(format!("cannot read it as UTF-8 text: {e}")))?;
    Ok(Some(text))
}

/// Reads `pyproject.toml`, if there is one.
pub(crate) fn pyproject(dir: &Path) -> Result<Option<toml::Table>, DeployError> {
    let path = dir.join("pyproject.toml");
    let Some(text) = read_text(&path)? else {
        return Ok(None);
    };
    text.parse::<toml::Table>()
        .map(Some)
        .map_err(|e| DeployError::Source {
            path,
            reason: format!("not valid TOML: {}", e.message()),
        })
}

/// Reads `package.json`, if there is one.
pub(crate) fn package_json(dir: &Path) -> Result<Option<serde_json::Value>, DeployError> {
    let path = dir.join("package.json");
    let Some(text) = read_text(&path)? else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| DeployError::Source {
        path: path.clone(),
        reason: format!("not valid JSON: {e}"),
    })?;
    if !v.is_object() {
        return Err(DeployError::Source {
            path,
            reason: "not a JSON object".into(),
        });
    }
    Ok(Some(v))
}

fn is_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

/// A directory holding `__init__.py` at the top of `dir` or of `dir/src`,
/// or a module named after the project, or setuptools' explicit lists.
fn has_package(dir: &Path, project: Option<&toml::Table>, py: &toml::Table) -> Option<String> {
    let setuptools = py
        .get("tool")
        .and_then(|t| t.get("setuptools"))
        .and_then(|t| t.as_table());
    if let Some(st) = setuptools {
        if st.contains_key("packages") || st.contains_key("py-modules") {
            return Some("[tool.setuptools] lists its packages".into());
        }
    }
    for base in [dir.to_path_buf(), dir.join("src")] {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.') && !NOT_PACKAGES.contains(&n.as_str()))
            .filter(|n| is_file(&base.join(n).join("__init__.py")))
            .collect();
        names.sort();
        if let Some(n) = names.first() {
            let rel = base.strip_prefix(dir).unwrap_or(Path::new(""));
            return Some(format!("package {}", rel.join(n).display()));
        }
    }
    let name = project
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())?;
    let module = name.to_ascii_lowercase().replace(['-', '.'], "_");
    for rel in [format!("{module}.py"), format!("src/{module}.py")] {
        if is_file(&dir.join(&rel)) {
            return Some(format!("module {rel}"));
        }
    }
    None
}

fn python(dir: &Path) -> Result<Option<Detection>, DeployError> {
    let py = pyproject(dir)?;
    let requirements_txt = is_file(&dir.join("requirements.txt"));
    let Some(py) = py else {
        if requirements_txt {
            return Ok(Some(Detection {
                pattern: Pattern::PythonRequirements,
                reason: "requirements.txt and no pyproject.toml".into(),
                requires_python: None,
                dependencies: vec![],
                requirements_txt,
                scripts: BTreeMap::new(),
            }));
        }
        return Ok(None);
    };
    let project = py.get("project").and_then(|p| p.as_table());
    let requires_python = project
        .and_then(|p| p.get("requires-python"))
        .and_then(|v| v.as_str())
        .map(str::to_string);
    let dependencies: Vec<String> = project
        .and_then(|p| p.get("dependencies"))
        .and_then(|d| d.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let build_system = py.contains_key("build-system");
    let package = has_package(dir, project, &py);
    let server = is_file(&dir.join("server.py"));
    let (pattern, reason) = match (build_system, package, server) {
        (true, Some(what), _) => (
            Pattern::PythonPackage,
            format!("pyproject.toml with [build-system] and {what}"),
        ),
        (_, _, true) => (
            Pattern::PythonScript,
            "pyproject.toml without a package, and server.py".to_string(),
        ),
        (true, None, false) if !requirements_txt => (
            Pattern::PythonPackage,
            "pyproject.toml with [build-system] (the build backend finds the package)".to_string(),
        ),
        _ if requirements_txt => (
            Pattern::PythonRequirements,
            "requirements.txt (pyproject.toml names no package and there is no server.py)"
                .to_string(),
        ),
        _ => (
            Pattern::PythonScript,
            "pyproject.toml without [build-system] or a package".to_string(),
        ),
    };
    Ok(Some(Detection {
        pattern,
        reason,
        requires_python,
        dependencies,
        requirements_txt,
        scripts: BTreeMap::new(),
    }))
}

fn node(dir: &Path) -> Result<Option<Detection>, DeployError> {
    let Some(pkg) = package_json(dir)? else {
        return Ok(None);
    };
    let mut scripts = BTreeMap::new();
    if let Some(s) = pkg.get("scripts") {
        let obj = s.as_object().ok_or_else(|| DeployError::Source {
            path: dir.join("package.json"),
            reason: "`scripts` is not an object".into(),
        })?;
        for (k, v) in obj {
            let text = v.as_str().ok_or_else(|| DeployError::Source {
                path: dir.join("package.json"),
                reason: format!("script `{k}` is not a string"),
            })?;
            scripts.insert(k.clone(), text.to_string());
        }
    }
    let lock = ["package-lock.json", "npm-shrinkwrap.json"]
        .into_iter()
        .find(|l| is_file(&dir.join(l)));
    let (pattern, reason) = match lock {
        Some(l) => (Pattern::NodeCi, format!("package.json with {l}")),
        None => (
            Pattern::NodeInstall,
            "package.json without a lockfile".to_string(),
        ),
    };
    Ok(Some(Detection {
        pattern,
        reason,
        requires_python: None,
        dependencies: vec![],
        requirements_txt: false,
        scripts,
    }))
}

/// Detects the project pattern of `dir`. With `runtime` given only that
/// runtime's patterns are considered; without it a tree that looks like
/// both a Python and a Node project is refused, naming the flag.
pub fn detect(dir: &Path, runtime: Option<Runtime>) -> Result<Detection, DeployError> {
    let py = match runtime {
        None | Some(Runtime::Python3) => python(dir)?,
        Some(Runtime::Node) => None,
    };
    let js = match runtime {
        None | Some(Runtime::Node) => node(dir)?,
        Some(Runtime::Python3) => None,
    };
    match (py, js) {
        (Some(p), None) => Ok(p),
        (None, Some(n)) => Ok(n),
        (Some(p), Some(n)) => Err(DeployError::Detect(format!(
            "{} looks like a Python project ({}) and a Node project ({}); say which with --runtime python3 or --runtime node",
            dir.display(),
            p.reason,
            n.reason
        ))),
        (None, None) => Err(DeployError::Detect(format!(
            "{} is no project corral can deploy{}: it looks for pyproject.toml or requirements.txt (Python) and package.json (Node)",
            dir.display(),
            runtime.map(|r| format!(" as {}", r.as_str())).unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::test_support::tree;

    const BS: &str = "[build-system]\nrequires = []\nbuild-backend = \"x\"\n";

    #[test]
    fn python_patterns() {
        let d = tree(&[
            (
                "pyproject.toml",
                &format!("{BS}[project]\nname = \"app\"\n"),
            ),
            ("app/__init__.py", ""),
        ]);
        assert_eq!(
            detect(d.path(), None).unwrap().pattern,
            Pattern::PythonPackage
        );
        let d = tree(&[
            (
                "pyproject.toml",
                &format!("{BS}[project]\nname = \"a-b\"\n"),
            ),
            ("src/a_b.py", ""),
        ]);
        assert_eq!(
            detect(d.path(), None).unwrap().pattern,
            Pattern::PythonPackage
        );
        let d = tree(&[
            (
                "pyproject.toml",
                "[project]\nname = \"s\"\nrequires-python = \">=3.10\"\ndependencies = [\"x==1\"]\n",
            ),
            ("server.py", ""),
            ("tests/__init__.py", ""),
        ]);
        let det = detect(d.path(), None).unwrap();
        assert_eq!(det.pattern, Pattern::PythonScript);
        assert_eq!(det.dependencies, vec!["x==1".to_string()]);
        assert_eq!(det.requires_python.as_deref(), Some(">=3.10"));
        let d = tree(&[("requirements.txt", "x\n"), ("main.py", "")]);
        assert_eq!(
            detect(d.path(), None).unwrap().pattern,
            Pattern::PythonRequirements
        );
        // tests/ is not the package: no package, no server.py.
        let d = tree(&[
            ("pyproject.toml", &format!("{BS}[project]\nname = \"q\"\n")),
            ("tests/__init__.py", ""),
            ("requirements.txt", ""),
        ]);
        assert_eq!(
            detect(d.path(), None).unwrap().pattern,
            Pattern::PythonRequirements
        );
    }

    #[test]
    fn node_patterns_and_ambiguity() {
        let d = tree(&[("package.json", "{\"scripts\": {\"build\": \"tsc\"}}")]);
        let det = detect(d.path(), None).unwrap();
        assert_eq!(det.pattern, Pattern::NodeInstall);
        assert!(det.has_build_script());
        let d = tree(&[("package.json", "{}"), ("package-lock.json", "{}")]);
        assert_eq!(detect(d.path(), None).unwrap().pattern, Pattern::NodeCi);
        let d = tree(&[("package.json", "{}"), ("requirements.txt", "")]);
        let e = detect(d.path(), None).unwrap_err();
        assert_eq!(e.code(), "deploy.detect");
        assert!(e.to_string().contains("--runtime"), "{e}");
        assert_eq!(
            detect(d.path(), Some(Runtime::Node)).unwrap().pattern,
            Pattern::NodeInstall
        );
        let d = tree(&[("README", "")]);
        assert_eq!(detect(d.path(), None).unwrap_err().code(), "deploy.detect");
        let d = tree(&[("package.json", "{\"scripts\": {\"x\": 1}}")]);
        assert_eq!(detect(d.path(), None).unwrap_err().code(), "deploy.source");
        // Project files are never read through a link.
        let d = tree(&[("real.json", "{}")]);
        std::os::unix::fs::symlink("real.json", d.path().join("package.json")).unwrap();
        let e = detect(d.path(), None).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
