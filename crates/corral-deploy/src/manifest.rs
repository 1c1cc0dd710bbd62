//! `corral-manifest.json`: what a deployed tree is, for the supervisor
//! and for the next deployment's no-op check.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::entry::Entry;
use crate::error::DeployError;

/// The manifest's file name, at the tree's root.
pub const MANIFEST_FILE: &str = "corral-manifest.json";

/// The manifest format this corral writes.
pub const MANIFEST_FORMAT: u32 = 1;

/// One phase as the manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    /// `install` or `build`.
    pub name: String,
    /// The command that ran in the sandbox.
    pub argv: Vec<String>,
    /// The profile it ran under.
    pub profile: String,
    /// `allow` (through corral's proxy) or `none`.
    pub network: String,
    /// The domains the proxy allowed (`host:port` patterns).
    pub allowed_domains: Vec<String>,
    /// The program's exit status.
    pub exit_code: i32,
    /// Wall-clock milliseconds.
    pub wall_ms: u64,
    /// Connections the proxy let through.
    pub connections_allowed: u64,
    /// Connections the proxy refused.
    pub connections_denied: u64,
    /// The log, relative to the tree (`.corral/logs/install.log`).
    pub log: String,
    /// SHA-256 of the log.
    pub log_sha256: String,
}

/// `corral-manifest.json`. Paths are relative to the tree's root unless
/// said otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// `python3` or `node`.
    pub runtime: String,
    /// The project pattern (`python_package`, `python_script`,
    /// `python_requirements`, `node_ci`, `node_install`).
    pub pattern: String,
    /// The interpreter's absolute host path (`/usr/bin/python3.11`,
    /// `/usr/bin/node`).
    pub interpreter: String,
    /// Its version (`3.11.2`, `20.20.2`).
    pub interpreter_version: String,
    /// Why that interpreter (Python: the selection rule).
    pub interpreter_reason: String,
    /// How to start the program.
    pub entry: Entry,
    /// The venv (`.venv`), for Python.
    pub venv: Option<String>,
    /// `node_modules`, for Node.
    pub node_modules: Option<String>,
    /// The source directory deployed (absolute host path), or the package
    /// spec (`npm:NAME@X.Y.Z`, `pypi:NAME==X.Y`).
    pub source: String,
    /// For a package deployment: the spec and the integrity of what the
    /// install resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<crate::package::PackageRecord>,
    /// SHA-256 over the source's copied files (names, kinds, executable
    /// bits, contents, link targets).
    pub source_sha256: String,
    /// SHA-256 of the options that shape the tree (runtime, pattern,
    /// interpreter, registries, lifecycle scripts, corral's version): the
    /// same source with other options is deployed again.
    pub options_sha256: String,
    /// SHA-256 of each lockfile in the finished tree (`package-lock.json`,
    /// `requirements.txt`, `uv.lock`, `pyproject.toml`, ...).
    pub lockfiles: BTreeMap<String, String>,
    /// What the install phase put in the tree: Python distributions as
    /// `name==version`, from the venv's metadata.
    pub packages: Vec<String>,
    /// The phases that ran, in order.
    pub phases: Vec<PhaseRecord>,
    /// When the tree was finished (RFC 3339, UTC).
    pub created: String,
    /// The corral that built it.
    pub corral_version: String,
}

impl Manifest {
    /// Reads the manifest of `tree`, if it has a readable, well-formed
    /// one of this format whose paths stay inside the tree.
    pub fn read(tree: &Path) -> Option<Manifest> {
        let text = std::fs::read_to_string(tree.join(MANIFEST_FILE)).ok()?;
        serde_json::from_str::<Manifest>(&text).ok().filter(|m| {
            m.format == MANIFEST_FORMAT
                && crate::entry::inside(m.entry.path()).is_some()
                && m.venv
                    .as_deref()
                    .is_none_or(|v| crate::entry::inside(v).is_some())
        })
    }

    /// The program's argv for a tree at `tree` (absolute): `python3
    /// TREE/PATH` for every Python entry (run with [`Manifest::runtime_dir`]
    /// as `--runtime`, `python3` is the venv's interpreter; a console
    /// script is a Python file), `node TREE/PATH` for Node. Arguments of
    /// the server's own come after.
    pub fn argv(&self, tree: &Path) -> Vec<String> {
        let program = if self.runtime == "node" {
            "node"
        } else {
            "python3"
        };
        vec![
            program.to_string(),
            tree.join(self.entry.path()).to_string_lossy().into_owned(),
        ]
    }

    /// The runtime tree to give `corral run --runtime` (or a profile's
    /// `filesystem.runtime`): the venv, for Python; `None` for Node, whose
    /// `node_modules` is found next to the entry.
    pub fn runtime_dir(&self, tree: &Path) -> Option<std::path::PathBuf> {
        self.venv.as_ref().map(|v| tree.join(v))
    }

    /// Writes the manifest into `tree` as a new file (never through a
    /// link a phase left there: the name must not exist).
    pub(crate) fn write_new(&self, tree: &Path) -> Result<(), DeployError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| DeployError::io("encoding the manifest", std::io::Error::other(e)))?;
        crate::tree::write_new(&tree.join(MANIFEST_FILE), format!("{text}\n").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn manifest(entry: Entry, runtime: &str, venv: Option<&str>) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            runtime: runtime.into(),
            pattern: String::new(),
            interpreter: String::new(),
            interpreter_version: String::new(),
            interpreter_reason: String::new(),
            entry,
            venv: venv.map(str::to_string),
            node_modules: None,
            source: String::new(),
            package: None,
            source_sha256: String::new(),
            options_sha256: String::new(),
            lockfiles: BTreeMap::new(),
            packages: vec![],
            phases: vec![],
            created: String::new(),
            corral_version: String::new(),
        }
    }

    #[test]
    fn argv_and_runtime_for_a_supervisor() {
        let t = Path::new("/srv/t");
        let m = manifest(
            Entry::ConsoleScript {
                name: "x".into(),
                path: ".venv/bin/x".into(),
                rule: "project.scripts".into(),
            },
            "python3",
            Some(".venv"),
        );
        assert_eq!(m.argv(t), ["python3", "/srv/t/.venv/bin/x"]);
        assert_eq!(m.runtime_dir(t).unwrap(), Path::new("/srv/t/.venv"));
        let n = manifest(
            Entry::Node {
                path: "dist/index.js".into(),
                rule: "main".into(),
            },
            "node",
            None,
        );
        assert_eq!(n.argv(t), ["node", "/srv/t/dist/index.js"]);
        assert!(n.runtime_dir(t).is_none());
    }

    #[test]
    fn read_refuses_paths_leaving_the_tree() {
        let d = tempfile::tempdir().unwrap();
        let good = manifest(
            Entry::Script {
                path: "server.py".into(),
                rule: "server.py".into(),
            },
            "python3",
            Some(".venv"),
        );
        good.write_new(d.path()).unwrap();
        assert_eq!(Manifest::read(d.path()).unwrap(), good);
        let mut bad = good.clone();
        bad.entry = Entry::Script {
            path: "../../etc/x".into(),
            rule: "server.py".into(),
        };
        std::fs::remove_file(d.path().join(MANIFEST_FILE)).unwrap();
        bad.write_new(d.path()).unwrap();
        assert!(Manifest::read(d.path()).is_none());
        let mut bad = good;
        bad.venv = Some("/usr".into());
        std::fs::remove_file(d.path().join(MANIFEST_FILE)).unwrap();
        bad.write_new(d.path()).unwrap();
        assert!(Manifest::read(d.path()).is_none());
    }
}
