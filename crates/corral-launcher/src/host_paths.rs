//! What a config needs from this host's filesystem that the host lacks,
//! and how to look at the host without waiting on it for good ([`all_within`]).
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

/// Runs each job (a look at the host's filesystem, which may wait for good
/// on one that does not answer) on a detached thread named `name`, one
/// that never returns holding neither the caller nor its process's exit,
/// and waits at most `wait` for them all: each one's result, in order, or
/// `None` for one still running then (or that got no thread).
pub fn all_within<T: Send + 'static>(
    wait: std::time::Duration,
    name: &str,
    jobs: Vec<impl FnOnce() -> T + Send + 'static>,
) -> Vec<Option<T>> {
    let deadline = std::time::Instant::now() + wait;
    let (send, results) = std::sync::mpsc::channel();
    let mut out: Vec<Option<T>> = Vec::new();
    for (i, job) in jobs.into_iter().enumerate() {
        out.push(None);
        let send = send.clone();
        let _ = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = send.send((i, job()));
            });
    }
    drop(send);
    let mut left = out.len();
    while left > 0 {
        let Ok((i, result)) =
            results.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        else {
            // The wait is over, or every thread that started has ended.
            break;
        };
        out[i] = Some(result);
        left -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_within_leaves_a_job_that_does_not_return_behind() {
        let (_never, waits) = std::sync::mpsc::channel::<()>();
        let waits = std::sync::Mutex::new(waits);
        let jobs: Vec<Box<dyn FnOnce() -> u8 + Send>> = vec![
            Box::new(|| 1),
            Box::new(move || {
                let _ = waits.lock().unwrap().recv();
                2
            }),
            Box::new(|| 3),
        ];
        let started = std::time::Instant::now();
        let got = all_within(std::time::Duration::from_millis(300), "test", jobs);
        assert_eq!(got, vec![Some(1), None, Some(3)]);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
