//! `corral deploy`: a Python or Node source tree turned into a pinned,
//! read-only tree that `corral run` and the supervisor use directly.
//!
//! The steps ([`deploy`]): detect the project pattern ([`detect`], seed
//! 000's table), re-check `package.json` scripts and requirements
//! ([`check_scripts`]), pick the interpreter ([`select_python`]), hash the
//! source, stop if the tree is already up to date, copy the source into a
//! staging directory next to the tree, run the install phase (network
//! through corral's proxy to the registries only) and the build phase (no
//! network) in sandboxes ([`plan_phases`]), resolve the entry point
//! ([`resolve_entry`]), write `corral-manifest.json` ([`Manifest`]), make
//! the tree read-only and rename it into place. A failure anywhere removes
//! the staging directory: there is never a half tree.
//!
//! Nothing of the source runs outside a sandbox: on the host corral only
//! reads its files (TOML, JSON, the bytes it hashes and copies).
#![forbid(unsafe_code)]

mod deploy;
mod detect;
mod entry;
mod error;
mod manifest;
mod package;
mod phases;
mod python;
mod scripts;
mod secrets;
mod tree;

pub use deploy::{
    deploy, DeployOptions, DeployReport, DeploySource, Deployment, PhaseAudit, Registry,
};
pub use detect::{detect, Detection, Pattern, Runtime};
pub use entry::{resolve_entry, Entry};
pub use error::DeployError;
pub use manifest::{Manifest, PhaseRecord, MANIFEST_FILE, MANIFEST_FORMAT};
pub use package::PackageRecord;
pub use phases::{plan_phases, PhaseInputs, PhaseKind, PhaseSpec, VENV};
pub use python::{
    discover_interpreters, select_python, Interpreter, PyVersion, PythonChoice, RequiresPython,
    NEWEST_STABLE, PYTHON_SEARCH,
};
pub use scripts::check_scripts;
pub use secrets::RegistryToken;

/// Fixtures the unit tests share.
#[cfg(test)]
mod test_support {
    #![allow(clippy::unwrap_used)]

    /// A temporary directory holding `files` (path, text).
    pub fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let path = d.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, c).unwrap();
        }
        d
    }
}
