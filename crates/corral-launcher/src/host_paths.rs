//! What a config needs from this host's filesystem that the host lacks.
//! A config may be written for another machine, so this is a warning, not
//! an error: `corral check` prints it and `corral serve` logs it at start,
//! since every run of such a profile is refused here (`mount.invalid`).

use corral_policy::Config;

/// A bind source or runtime tree of a profile that does not exist here.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MissingHostPath {
    /// The profile.
    pub profile: String,
    /// Its key: `filesystem.read_only`, `filesystem.read_write` or
    /// `filesystem.runtime`.
    pub key: &'static str,
    /// The host path.
    pub path: String,
    /// One sentence for people.
    pub message: String,
}

/// Every bind source and runtime tree of `config`'s profiles that this
/// host does not have (`lstat` fails with ENOENT or ENOTDIR), in profile
/// order.
pub fn missing_host_paths(config: &Config) -> Vec<MissingHostPath> {
    let mut out = Vec::new();
    for (name, profile) in &config.profiles {
        let fs = &profile.filesystem;
        let needed = (fs.read_only.iter())
            .map(|m| ("filesystem.read_only", &m.source))
            .chain(
                fs.read_write
                    .iter()
                    .map(|m| ("filesystem.read_write", &m.source)),
            )
            .chain(fs.runtime.iter().map(|r| ("filesystem.runtime", r)));
        for (key, path) in needed {
            let missing = std::fs::symlink_metadata(path.as_path()).is_err_and(|e| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                )
            });
            if missing {
                out.push(MissingHostPath {
                    profile: name.clone(),
                    key,
                    path: path.as_str().to_string(),
                    message: format!(
                        "profile `{name}`: {key} `{}` does not exist on this host; runs of the profile are refused here (mount.invalid)",
                        path.as_str()
                    ),
                });
            }
        }
    }
    out
}
