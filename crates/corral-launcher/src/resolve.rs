//! Resolving allowlisted command names to absolute paths, once.
//!
//! A name resolves to the first executable file named so in the invoking
//! `PATH`, then the profile's search path, whose real location is visible
//! inside the sandbox. A shim outside the mounted tree (pyenv's
//! `~/.pyenv/shims/python3`, say) is skipped, because the sandbox could not
//! run it; so are relative `PATH` entries.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use corral_policy::{Profile, SandboxPath};

/// Where a command resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The absolute path to exec inside the sandbox.
    Found(String),
    /// Not installed anywhere the sandbox can see; the directories searched.
    Missing(Vec<String>),
}

/// Every allowlisted name of a profile, resolved. Built once per profile
/// (at CLI start-up, or when the server loads its config), never per
/// request, so a request cannot influence where a name points.
#[derive(Debug, Clone, Default)]
pub struct CommandTable {
    entries: BTreeMap<String, Resolution>,
}

/// The host trees the sandbox sees, as (host source, sandbox destination).
fn visible_trees(profile: &Profile) -> Vec<(PathBuf, SandboxPath)> {
    let fs = &profile.filesystem;
    let mut trees: Vec<(PathBuf, SandboxPath)> = fs
        .system
        .iter()
        .map(|p| (p.as_path().to_path_buf(), p.clone()))
        .collect();
    trees.extend(
        fs.read_only
            .iter()
            .chain(&fs.read_write)
            .map(|m| (m.source.as_path().to_path_buf(), m.dest.clone())),
    );
    trees
}

/// The visible trees with canonical host sources (`/lib` may be a
/// symlink), computed once per resolution.
fn canonical_trees(profile: &Profile) -> Vec<(PathBuf, SandboxPath)> {
    visible_trees(profile)
        .into_iter()
        .map(|(source, dest)| (std::fs::canonicalize(&source).unwrap_or(source), dest))
        .collect()
}

fn locate(profile: &Profile, trees: &[(PathBuf, SandboxPath)], host: &Path) -> Option<String> {
    for (source, dest) in trees {
        if let Ok(rest) = host.strip_prefix(source) {
            let inside = Path::new(dest.as_str()).join(rest);
            let inside = inside.to_str()?.to_string();
            let denied = profile
                .filesystem
                .deny
                .iter()
                .any(|d| SandboxPath::new(&inside).is_ok_and(|p| p.starts_with(d)));
            return (!denied).then_some(inside);
        }
    }
    None
}

impl CommandTable {
    /// Resolves every name in the profile's allowlist against `host_path`
    /// (the invoking `PATH`, if any) and then the profile's search path.
    pub fn resolve(profile: &Profile, host_path: Option<&str>) -> CommandTable {
        let mut dirs: Vec<PathBuf> = host_path
            .unwrap_or_default()
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(PathBuf::from)
            .collect();
        for d in &profile.commands.search_path {
            if !dirs.iter().any(|x| x == d.as_path()) {
                dirs.push(d.as_path().to_path_buf());
            }
        }
        // A runtime tree's commands come first: `python3` is the venv's.
        if let Some(bin) = profile
            .filesystem
            .runtime
            .as_ref()
            .and_then(|t| Profile::runtime_bin(t).ok())
        {
            dirs.retain(|d| d != bin.as_path());
            dirs.insert(0, bin.as_path().to_path_buf());
        }
        let trees = canonical_trees(profile);
        let entries = profile
            .commands
            .allow
            .iter()
            .map(|name| (name.clone(), resolve_one(profile, &trees, &dirs, name)))
            .collect();
        CommandTable { entries }
    }

    /// The resolution of `name`, if it is allowlisted.
    pub fn get(&self, name: &str) -> Option<&Resolution> {
        self.entries.get(name)
    }

    /// All entries, for `corral explain`.
    pub fn entries(&self) -> &BTreeMap<String, Resolution> {
        &self.entries
    }
}

fn resolve_one(
    profile: &Profile,
    trees: &[(PathBuf, SandboxPath)],
    dirs: &[PathBuf],
    name: &str,
) -> Resolution {
    let mut searched = Vec::new();
    for dir in dirs {
        searched.push(dir.display().to_string());
        let candidate = dir.join(name);
        let Ok(real) = std::fs::canonicalize(&candidate) else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(&real) else {
            continue;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        if let Some(inside) = locate(profile, trees, &real) {
            return Resolution::Found(inside);
        }
    }
    Resolution::Missing(searched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_sh_inside_the_system_tree() {
        let profile = corral_policy::builtin::code();
        let table = CommandTable::resolve(&profile, None);
        match table.get("sh") {
            Some(Resolution::Found(path)) => {
                assert!(
                    path.starts_with("/usr/") || path.starts_with("/bin/"),
                    "{path}"
                );
            }
            other => panic!("sh should resolve, got {other:?}"),
        }
        assert!(
            table.get("perl").is_none(),
            "only allowlisted names are resolved"
        );
    }

    #[test]
    fn names_outside_the_visible_tree_are_missing() {
        let mut profile = corral_policy::builtin::code();
        profile
            .filesystem
            .system
            .retain(|p| p.as_str() == "/etc/ld.so.cache");
        let table = CommandTable::resolve(&profile, None);
        assert!(matches!(table.get("sh"), Some(Resolution::Missing(_))));
    }

    #[test]
    fn shims_outside_the_sandbox_are_skipped() {
        use std::os::unix::fs::PermissionsExt;
        let shims = std::env::temp_dir().join(format!("corral-shims-{}", std::process::id()));
        std::fs::create_dir_all(&shims).unwrap();
        let shim = shims.join("sh");
        std::fs::write(&shim, "#!/bin/sh\nexec /home/me/.pyenv/bin/sh \"$@\"\n").unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        let profile = corral_policy::builtin::code();
        let path = format!("relative/bin:{}:/usr/bin:/bin", shims.display());
        let table = CommandTable::resolve(&profile, Some(&path));
        let found = table.get("sh").cloned();
        std::fs::remove_dir_all(&shims).unwrap();
        match found {
            Some(Resolution::Found(p)) => assert!(!p.contains("corral-shims"), "{p}"),
            other => panic!("{other:?}"),
        }
    }
}
