//! What a config needs from this host's filesystem that the host lacks.
//! A config may be written for another machine, so this is a warning, not
//! an error: `corral check` prints it and `corral serve` logs it at start,
//! since every run of such a profile is refused here.

use corral_policy::{Config, Profile};

use crate::plan::{refuse_symlinks, PlanError};

/// A bind source or runtime tree of a profile that a run would refuse on
/// this host: missing, or reached through a symlink.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MissingHostPath {
    /// The profile.
    pub profile: String,
    /// Its key: `filesystem.read_only`, `filesystem.read_write` or
    /// `filesystem.runtime`.
    pub key: &'static str,
    /// The host path.
    pub path: String,
    /// The error code a run of the profile gets here: `mount.invalid`
    /// (missing) or `mount.symlink`.
    pub code: &'static str,
    /// One sentence for people.
    pub message: String,
}

/// Every bind source and runtime tree of `config`'s profiles that a run
/// would refuse on this host, in profile order: one that does not exist
/// (`lstat` fails with ENOENT or ENOTDIR; one this user may not read is
/// left to the run, which may run as another), or one with a symlink on
/// its way (corral binds only paths without symlinks).
pub fn missing_host_paths(config: &Config) -> Vec<MissingHostPath> {
    (config.profiles.iter())
        .flat_map(|(name, profile)| missing_for_profile(name, profile))
        .collect()
}

/// [`missing_host_paths`] of one profile, `name`.
pub fn missing_for_profile(name: &str, profile: &Profile) -> Vec<MissingHostPath> {
    let fs = &profile.filesystem;
    // A runtime tree is also one of the read-only binds (at its own path):
    // named once, under its own key.
    let binds = (fs.read_only.iter())
        .filter(|m| fs.runtime.as_ref() != Some(&m.source) || m.dest != m.source)
        .map(|m| ("filesystem.read_only", &m.source))
        .chain(
            fs.read_write
                .iter()
                .map(|m| ("filesystem.read_write", &m.source)),
        )
        .chain(fs.runtime.iter().map(|r| ("filesystem.runtime", r)));
    let mut out = Vec::new();
    for (key, path) in binds {
        let problem = match refuse_symlinks(path.as_path()) {
            Err(e @ PlanError::Symlink { .. }) => Some((e.code(), e.to_string())),
            _ => std::fs::symlink_metadata(path.as_path())
                .err()
                .filter(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    )
                })
                .map(|_| {
                    (
                        "mount.invalid",
                        "it does not exist on this host".to_string(),
                    )
                }),
        };
        if let Some((code, why)) = problem {
            out.push(MissingHostPath {
                profile: name.to_string(),
                key,
                path: path.as_str().to_string(),
                code,
                message: format!(
                    "profile `{name}`: {key} `{}`: {why}; runs of the profile are refused here ({code})",
                    path.as_str()
                ),
            });
        }
    }
    out
}
