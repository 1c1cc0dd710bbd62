//! The phases of a deployment: what each runs (pure: [`plan_phases`]) and
//! how it runs (in a sandbox, through `corral_launcher::execute`).
//!
//! Each phase is one sandbox running `sh -c SCRIPT`, where the script is
//! a fixed sequence of commands built here with every value shell-quoted;
//! nothing of the source reaches the script text except through paths
//! corral chose.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corral_launcher::{
    execute, CommandTable, EventSink, ExecuteOptions, HelperStart, OutputMode, RunRequest,
};
use corral_policy::{AuditEvent, MountSpec, NetworkMode, Profile, SandboxPath};
use serde::Serialize;

use crate::detect::{Detection, Pattern};
use crate::error::DeployError;
use crate::tree::disk_usage;

/// Which phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// Dependencies from the registries: network through corral's proxy
    /// to the registries only.
    Install,
    /// The project's own build: no network at all.
    Build,
}

impl PhaseKind {
    /// `install` or `build`.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Install => "install",
            PhaseKind::Build => "build",
        }
    }
}

/// One phase: its commands, run in order by `sh -c` in the tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PhaseSpec {
    /// Which phase.
    pub kind: PhaseKind,
    /// The commands, each an argv.
    pub steps: Vec<Vec<String>>,
}

impl PhaseSpec {
    /// The argv of the sandbox: `sh -c 'set -eu; cd TREE; step; step'`.
    pub fn argv(&self, tree: &str) -> Vec<String> {
        let mut script = format!("set -eu\ncd {}\n", quote(tree));
        for step in &self.steps {
            let line: Vec<String> = step.iter().map(|a| quote(a)).collect();
            script.push_str(&format!("echo '+' {}\n", line.join(" ")));
            script.push_str(&line.join(" "));
            script.push('\n');
        }
        vec!["sh".into(), "-c".into(), script]
    }
}

/// A POSIX shell word for `s`.
pub(crate) fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What the phases need to know beyond the detection.
#[derive(Debug, Clone)]
pub struct PhaseInputs {
    /// The tree as the sandbox sees it (its final host path).
    pub tree: String,
    /// The Python interpreter (host path, visible in the sandbox).
    pub python: Option<String>,
    /// uv's path (visible in the sandbox), to use instead of pip.
    pub uv: Option<String>,
    /// The interpreter has a pip of its own: make the venv without pip
    /// and install into it with `python -m pip --python VENV/bin/python`.
    pub interpreter_pip: bool,
    /// Let npm run lifecycle scripts in the install phase.
    pub lifecycle_scripts: bool,
}

/// The venv's directory in the tree.
pub const VENV: &str = ".venv";

/// The phases for a detected project (seed 000's table): Python installs
/// into `.venv` with uv when present, else with the interpreter's venv and
/// pip; Node runs `npm ci` (lockfile) or `npm install`, with
/// `--ignore-scripts` unless lifecycle scripts are allowed, then, when
/// `package.json` has a `build` script, a build phase (`npm run build`,
/// then `npm prune --omit=dev`).
pub fn plan_phases(d: &Detection, i: &PhaseInputs) -> Result<Vec<PhaseSpec>, DeployError> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    let venv = format!("{}/{VENV}", i.tree);
    let vpy = format!("{venv}/bin/python");
    let mut steps: Vec<Vec<String>> = Vec::new();
    match d.pattern {
        Pattern::PythonPackage | Pattern::PythonScript | Pattern::PythonRequirements => {
            let py = i
                .python
                .clone()
                .ok_or_else(|| DeployError::Python("no interpreter chosen".into()))?;
            let mut reqs: Vec<String> = Vec::new();
            if d.pattern == Pattern::PythonScript {
                for dep in &d.dependencies {
                    crate::scripts::check_dependency(dep)?;
                }
            }
            if d.requirements_txt && d.pattern != Pattern::PythonPackage {
                reqs.extend(s(&["-r", "requirements.txt"]));
            }
            let deps: Vec<String> = if d.pattern == Pattern::PythonScript {
                d.dependencies.clone()
            } else {
                vec![]
            };
            if let Some(uv) = &i.uv {
                if d.pattern == Pattern::PythonPackage {
                    // Not editable: the project is installed into the venv
                    // like pip's `install .`, not linked to its files.
                    steps.push(s(&[
                        uv,
                        "sync",
                        "--no-dev",
                        "--no-editable",
                        "--python",
                        &py,
                    ]));
                } else {
                    steps.push(s(&[uv, "venv", "--python", &py, &venv]));
                    if !reqs.is_empty() || !deps.is_empty() {
                        let mut c = s(&[uv, "pip", "install", "--python", &vpy]);
                        c.extend(reqs);
                        if !deps.is_empty() {
                            c.push("--".into());
                            c.extend(deps);
                        }
                        steps.push(c);
                    }
                }
            } else {
                let mut c = if i.interpreter_pip {
                    steps.push(s(&[&py, "-m", "venv", "--without-pip", &venv]));
                    s(&[&py, "-m", "pip", "--python", &vpy, "install"])
                } else {
                    steps.push(s(&[&py, "-m", "venv", &venv]));
                    s(&[&vpy, "-m", "pip", "install"])
                };
                let bare = c.len() + 2;
                c.extend(s(&["--no-input", "--prefer-binary"]));
                match d.pattern {
                    Pattern::PythonPackage => c.push(".".into()),
                    _ => {
                        c.extend(reqs);
                        if !deps.is_empty() {
                            c.push("--".into());
                            c.extend(deps);
                        }
                    }
                }
                if c.len() > bare {
                    steps.push(c);
                }
            }
            Ok(vec![PhaseSpec {
                kind: PhaseKind::Install,
                steps,
            }])
        }
        Pattern::NodeCi | Pattern::NodeInstall => {
            let verb = if d.pattern == Pattern::NodeCi {
                "ci"
            } else {
                "install"
            };
            let mut c = s(&["npm", verb, "--no-audit", "--no-fund"]);
            if !i.lifecycle_scripts {
                c.push("--ignore-scripts".into());
            }
            let build = d.has_build_script();
            if !build {
                // Without a build, devDependencies are never needed.
                c.push("--omit=dev".into());
            }
            let mut phases = vec![PhaseSpec {
                kind: PhaseKind::Install,
                steps: vec![c],
            }];
            if build {
                phases.push(PhaseSpec {
                    kind: PhaseKind::Build,
                    steps: vec![
                        s(&["npm", "run", "build"]),
                        s(&["npm", "prune", "--omit=dev", "--no-audit", "--no-fund"]),
                    ],
                });
            }
            Ok(phases)
        }
    }
}

/// Collects a phase's events and passes each on.
struct PhaseSink {
    inner: Arc<dyn EventSink>,
    kept: Mutex<Vec<AuditEvent>>,
    secrets: Vec<String>,
}

impl EventSink for PhaseSink {
    fn emit(&self, event: &AuditEvent) {
        let event = crate::secrets::redact_event(event, &self.secrets);
        if let Ok(mut k) = self.kept.lock() {
            k.push(event.clone());
        }
        self.inner.emit(&event);
    }
}

/// A phase that ran to its end (successfully or not).
#[derive(Debug, Clone)]
pub(crate) struct PhaseRun {
    pub argv: Vec<String>,
    pub exit_code: i32,
    pub wall_ms: u64,
    pub timed_out: bool,
    pub log: String,
    pub events: Vec<AuditEvent>,
    /// The tree's disk usage when the watcher stopped the phase for
    /// passing the quota.
    pub quota_stop: Option<u64>,
}

/// Where a phase runs.
pub(crate) struct PhaseSetup<'a> {
    pub profile: Profile,
    pub staging: &'a Path,
    pub tree: &'a str,
    pub home: &'a Path,
    pub extra_ro: &'a [PathBuf],
    pub helper: HelperStart,
    /// The tree's quota in bytes: no file may be larger (RLIMIT_FSIZE), and
    /// a watcher stops the phase once the tree takes more.
    pub max_tree_bytes: u64,
    /// Values never to let into the log or the events (registry tokens).
    pub secrets: &'a [String],
}

/// Watches the staging directory and the phase's HOME while a phase runs:
/// every 250 ms (or twice as long as the last walk took) the disk usage of
/// the tree plus what the phase added to HOME (its downloads, caches and
/// `TMPDIR`, on the host disk too) is measured, and past `max` the phase
/// is cancelled (the launcher kills the sandbox within 100 ms). HOME is
/// counted from its size when the phase started, so a warm `--cache` does
/// not count against the tree.
struct QuotaWatch {
    done: Arc<AtomicBool>,
    stopped_at: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl QuotaWatch {
    fn start(dir: PathBuf, home: PathBuf, max: u64, cancel: Arc<AtomicBool>) -> QuotaWatch {
        let home_base = disk_usage(&home, u64::MAX, None);
        let done = Arc::new(AtomicBool::new(false));
        let stopped_at = Arc::new(AtomicU64::new(0));
        let (d, s) = (Arc::clone(&done), Arc::clone(&stopped_at));
        let thread = std::thread::Builder::new()
            .name("corral-deploy-quota".into())
            .spawn(move || {
                while !d.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let tree = disk_usage(&dir, max, Some(&d));
                    let added = disk_usage(&home, home_base.saturating_add(max), Some(&d))
                        .saturating_sub(home_base);
                    let used = tree.saturating_add(added);
                    if used > max {
                        s.store(used, Ordering::Relaxed);
                        cancel.store(true, Ordering::Relaxed);
                        return;
                    }
                    let wait = (t.elapsed() * 2).max(Duration::from_millis(250));
                    let until = Instant::now() + wait;
                    while Instant::now() < until && !d.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(25));
                    }
                }
            })
            .ok();
        QuotaWatch {
            done,
            stopped_at,
            thread,
        }
    }

    /// Stops the watcher; the usage it stopped the phase at, if it did.
    fn finish(mut self) -> Option<u64> {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        Some(self.stopped_at.load(Ordering::Relaxed)).filter(|&u| u > 0)
    }
}

fn sandbox_path(p: &Path) -> Result<SandboxPath, DeployError> {
    let text = p
        .to_str()
        .ok_or_else(|| DeployError::Config(format!("{}: not UTF-8", p.display())))?;
    SandboxPath::new(text).map_err(|e| DeployError::Config(format!("{}: {e}", p.display())))
}

/// Runs one phase in its sandbox: the staging directory bound read-write
/// at the tree's final path (the only writable place besides the phase's
/// own HOME and `/tmp`), no variable of the caller's, output captured into
/// the phase log.
pub(crate) fn run_phase(
    spec: &PhaseSpec,
    setup: PhaseSetup<'_>,
    sink: &Arc<dyn EventSink>,
) -> Result<PhaseRun, DeployError> {
    let mut profile = setup.profile;
    profile.filesystem.read_write.push(MountSpec {
        source: sandbox_path(setup.staging)?,
        dest: sandbox_path(Path::new(setup.tree))?,
    });
    for dir in setup.extra_ro {
        let p = sandbox_path(dir)?;
        profile.filesystem.read_only.push(MountSpec {
            source: p.clone(),
            dest: p,
        });
    }
    if spec.kind == PhaseKind::Build {
        profile.network.mode = NetworkMode::None;
    }
    // Keep a useful log: 4 MiB of each stream, head and tail.
    profile.limits.output_bytes = corral_policy::ByteSize(4 << 20);
    profile.limits.output_kill_bytes = Some(corral_policy::ByteSize(256 << 20));
    // No single file larger than the whole tree may be.
    let fsize = profile
        .limits
        .file_size_bytes
        .map_or(setup.max_tree_bytes, |b| {
            b.bytes().min(setup.max_tree_bytes)
        });
    profile.limits.file_size_bytes = Some(corral_policy::ByteSize(fsize));
    let argv = spec.argv(setup.tree);
    let request = RunRequest {
        argv: argv.clone(),
        workdir: Some(setup.home.to_path_buf()),
        // The HOME is corral's own fresh directory (or the cache the
        // operator named), not a project anyone runs tools in.
        scratch_workdir: true,
        ..Default::default()
    };
    let commands = CommandTable::resolve(&profile, Some(corral_policy::env::BASE_PATH));
    let phase_sink = Arc::new(PhaseSink {
        inner: Arc::clone(sink),
        kept: Mutex::new(Vec::new()),
        secrets: setup.secrets.to_vec(),
    });
    let dyn_sink: Arc<dyn EventSink> = phase_sink.clone();
    let cancel = Arc::new(AtomicBool::new(false));
    let watch = QuotaWatch::start(
        setup.staging.to_path_buf(),
        setup.home.to_path_buf(),
        setup.max_tree_bytes,
        Arc::clone(&cancel),
    );
    let opts = ExecuteOptions {
        output: OutputMode::Capture,
        helper: setup.helper,
        forward_signals: true,
        cancel: Some(cancel),
        stdin: Some(Arc::new(
            std::fs::File::open("/dev/null")
                .map_err(|e| DeployError::io("opening /dev/null", e))?,
        )),
        tap: None,
        prestarted: None,
        prepared: None,
        gate: None,
    };
    // No variable of corral's own environment reaches a phase.
    let lookup = |_: &str| None;
    let run = execute(&profile, &commands, &request, &lookup, opts, &dyn_sink);
    let quota_stop = watch.finish();
    let events = phase_sink
        .kept
        .lock()
        .map(|k| k.clone())
        .unwrap_or_default();
    match run {
        Err(r) => Err(DeployError::Sandbox {
            phase: spec.kind.as_str().into(),
            code: r.code,
            message: r.message,
        }),
        Ok(done) => {
            let r = done.result;
            if let Some(e) = &r.error {
                // The sandbox itself failed to start (a bind that could
                // not be opened, ...): corral's error, not the phase's.
                return Err(DeployError::Sandbox {
                    phase: spec.kind.as_str().into(),
                    code: e.code.clone(),
                    message: e.message.clone(),
                });
            }
            let log = format!(
                "$ {}\n--- stdout ({} bytes{})\n{}\n--- stderr ({} bytes{})\n{}\n--- exit status {}{}\n",
                argv.join(" "),
                r.stdout_bytes,
                if r.stdout_truncated { ", truncated" } else { "" },
                r.stdout,
                r.stderr_bytes,
                if r.stderr_truncated { ", truncated" } else { "" },
                r.stderr,
                r.exit_code,
                if r.timed_out { " (timed out)" } else { "" },
            );
            let log = crate::secrets::redact(&log, setup.secrets);
            Ok(PhaseRun {
                argv,
                exit_code: r.exit_code,
                wall_ms: r.wall_ms,
                timed_out: r.timed_out,
                log,
                events,
                quota_stop,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::BTreeMap;

    fn det(pattern: Pattern, deps: &[&str], req: bool, scripts: &[(&str, &str)]) -> Detection {
        Detection {
            pattern,
            reason: String::new(),
            requires_python: None,
            dependencies: deps.iter().map(|s| s.to_string()).collect(),
            requirements_txt: req,
            scripts: scripts
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn inputs(uv: bool, lifecycle: bool) -> PhaseInputs {
        let uv = uv.then(|| "/opt/uv/bin/uv".to_string());
        PhaseInputs {
            tree: "/srv/t".into(),
            python: Some("/usr/bin/python3.11".into()),
            uv,
            interpreter_pip: false,
            lifecycle_scripts: lifecycle,
        }
    }

    #[test]
    fn python_pip_and_uv() {
        let p = plan_phases(
            &det(Pattern::PythonScript, &["a==1"], true, &[]),
            &inputs(false, false),
        )
        .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].steps[0],
            ["/usr/bin/python3.11", "-m", "venv", "/srv/t/.venv"]
        );
        assert_eq!(
            p[0].steps[1],
            [
                "/srv/t/.venv/bin/python",
                "-m",
                "pip",
                "install",
                "--no-input",
                "--prefer-binary",
                "-r",
                "requirements.txt",
                "--",
                "a==1"
            ]
        );
        let p = plan_phases(
            &det(Pattern::PythonPackage, &[], false, &[]),
            &inputs(false, false),
        )
        .unwrap();
        assert_eq!(p[0].steps[1].last().unwrap(), ".");
        let p = plan_phases(
            &det(Pattern::PythonPackage, &[], false, &[]),
            &inputs(true, false),
        )
        .unwrap();
        assert_eq!(
            p[0].steps,
            vec![vec![
                "/opt/uv/bin/uv",
                "sync",
                "--no-dev",
                "--no-editable",
                "--python",
                "/usr/bin/python3.11"
            ]]
        );
        let p = plan_phases(
            &det(Pattern::PythonRequirements, &[], true, &[]),
            &inputs(true, false),
        )
        .unwrap();
        assert_eq!(
            p[0].steps[1][..4],
            ["/opt/uv/bin/uv", "pip", "install", "--python"]
        );
        let mut host_pip = inputs(false, false);
        host_pip.interpreter_pip = true;
        let p = plan_phases(&det(Pattern::PythonRequirements, &[], true, &[]), &host_pip).unwrap();
        assert_eq!(
            p[0].steps[0],
            [
                "/usr/bin/python3.11",
                "-m",
                "venv",
                "--without-pip",
                "/srv/t/.venv"
            ]
        );
        assert_eq!(
            p[0].steps[1][..5],
            [
                "/usr/bin/python3.11",
                "-m",
                "pip",
                "--python",
                "/srv/t/.venv/bin/python"
            ]
        );
        // A script with nothing to install gets just the venv.
        let p = plan_phases(
            &det(Pattern::PythonScript, &[], false, &[]),
            &inputs(false, false),
        )
        .unwrap();
        assert_eq!(p[0].steps.len(), 1);
        let e = plan_phases(
            &det(Pattern::PythonScript, &["-i http://x"], false, &[]),
            &inputs(false, false),
        )
        .unwrap_err();
        assert_eq!(e.code(), "deploy.dependency");
    }

    #[test]
    fn node_phases() {
        let p = plan_phases(
            &det(Pattern::NodeCi, &[], false, &[]),
            &inputs(false, false),
        )
        .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].steps[0],
            [
                "npm",
                "ci",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--omit=dev"
            ]
        );
        let p = plan_phases(
            &det(Pattern::NodeInstall, &[], false, &[("build", "tsc")]),
            &inputs(false, true),
        )
        .unwrap();
        assert_eq!(p[0].steps[0], ["npm", "install", "--no-audit", "--no-fund"]);
        assert_eq!(p[1].kind, PhaseKind::Build);
        assert_eq!(p[1].steps[0], ["npm", "run", "build"]);
    }

    #[test]
    fn script_quotes_every_word() {
        let spec = PhaseSpec {
            kind: PhaseKind::Install,
            steps: vec![vec![
                "echo".into(),
                "a b".into(),
                "it's".into(),
                "$(id)".into(),
            ]],
        };
        let argv = spec.argv("/srv/my tree");
        assert_eq!(argv[..2], ["sh", "-c"]);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(argv[2].replace("cd '/srv/my tree'", "cd /"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().last().unwrap(),
            "a b it's $(id)"
        );
    }
}
