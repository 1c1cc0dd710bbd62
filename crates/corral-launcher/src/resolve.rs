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

/// The visible trees, each host source made canonical (`/lib` may be a
/// symlink) the first time a lookup reaches it: `locate` takes the first
/// tree that holds a path, so the trees after it are never resolved
/// (canonicalizing costs a `readlink` per path component).
struct CanonicalTrees {
    trees: Vec<(PathBuf, SandboxPath, bool)>,
}

impl CanonicalTrees {
    fn new(profile: &Profile) -> CanonicalTrees {
        CanonicalTrees {
            trees: visible_trees(profile)
                .into_iter()
                .map(|(source, dest)| (source, dest, false))
                .collect(),
        }
    }

    /// The `i`th tree with its canonical source, if there is one.
    fn get(&mut self, i: usize) -> Option<(&Path, &SandboxPath)> {
        let (source, dest, canonical) = self.trees.get_mut(i)?;
        if !*canonical {
            if let Ok(real) = std::fs::canonicalize(&*source) {
                *source = real;
            }
            *canonical = true;
        }
        Some((source.as_path(), dest))
    }
}

fn locate(profile: &Profile, trees: &mut CanonicalTrees, host: &Path) -> Option<String> {
    let mut i = 0;
    while let Some((source, dest)) = trees.get(i) {
        i += 1;
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
        CommandTable::resolve_matching(profile, host_path, |_| true)
    }

    /// Like [`CommandTable::resolve`], for one run of `argv0`: only that
    /// name is resolved (a run looks up no other), which saves a search of
    /// the path per allowlisted name on every `corral run`. Every name is
    /// resolved when the profile sets `commands.restrict_exec`, whose
    /// Landlock rule lists the paths of all of them.
    pub fn resolve_for_run(
        profile: &Profile,
        host_path: Option<&str>,
        argv0: Option<&str>,
    ) -> CommandTable {
        if profile.commands.restrict_exec {
            return CommandTable::resolve(profile, host_path);
        }
        CommandTable::resolve_matching(profile, host_path, |name| Some(name) == argv0)
    }

    fn resolve_matching(
        profile: &Profile,
        host_path: Option<&str>,
        wanted: impl Fn(&str) -> bool,
    ) -> CommandTable {
        // Each directory once, where it first appears: a `PATH` that names
        // one twice (shell start-up files that append to it) would cost a
        // second `stat` per name there, and the same answer.
        let mut dirs: Vec<PathBuf> = Vec::new();
        let host_dirs = host_path
            .unwrap_or_default()
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(Path::new);
        let search_path = profile.commands.search_path.iter().map(|d| d.as_path());
        for d in host_dirs.chain(search_path) {
            if !dirs.iter().any(|x| x == d) {
                dirs.push(d.to_path_buf());
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
        let names: Vec<&String> = profile
            .commands
            .allow
            .iter()
            .filter(|name| wanted(name))
            .collect();
        let mut trees = CanonicalTrees::new(profile);
        let entries = names
            .into_iter()
            .map(|name| (name.clone(), resolve_one(profile, &mut trees, &dirs, name)))
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
    trees: &mut CanonicalTrees,
    dirs: &[PathBuf],
    name: &str,
) -> Resolution {
    let mut searched = Vec::new();
    for dir in dirs {
        searched.push(dir.display().to_string());
        let candidate = dir.join(name);
        // One stat first (it follows links as canonicalize would): most
        // directories of a PATH do not hold the name, and canonicalizing
        // a missing file costs a readlink per component before it fails.
        let Ok(meta) = std::fs::metadata(&candidate) else {
            continue;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&candidate) else {
            continue;
        };
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
    fn a_run_resolves_only_its_own_command_unless_exec_is_restricted() {
        let mut profile = corral_policy::builtin::code();
        let table = CommandTable::resolve_for_run(&profile, None, Some("sh"));
        assert!(matches!(table.get("sh"), Some(Resolution::Found(_))));
        assert_eq!(table.entries().len(), 1, "{:?}", table.entries());
        // A name not in the allowlist resolves nothing (it is refused).
        let none = CommandTable::resolve_for_run(&profile, None, Some("perl"));
        assert!(none.entries().is_empty());
        // restrict_exec lists every allowed command's path: all resolved.
        profile.commands.restrict_exec = true;
        let all = CommandTable::resolve_for_run(&profile, None, Some("sh"));
        assert_eq!(
            all.entries().keys().collect::<Vec<_>>(),
            profile
                .commands
                .allow
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        );
        assert_eq!(all.get("sh"), table.get("sh"));
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
    fn a_directory_named_twice_is_searched_once() {
        let mut profile = corral_policy::builtin::code();
        profile.commands.allow = vec!["corral-no-such-command".into()];
        let search_path: Vec<String> = profile
            .commands
            .search_path
            .iter()
            .map(|d| d.as_path().display().to_string())
            .collect();
        let first = search_path[0].clone();
        let path = format!("/nonexistent/a:{first}:/nonexistent/a:/nonexistent/b");
        let table = CommandTable::resolve(&profile, Some(&path));
        let Some(Resolution::Missing(searched)) = table.get("corral-no-such-command") else {
            panic!("{:?}", table.entries());
        };
        let mut expected = vec![
            "/nonexistent/a".to_string(),
            first.clone(),
            "/nonexistent/b".into(),
        ];
        expected.extend(search_path.into_iter().filter(|d| *d != first));
        assert_eq!(*searched, expected);
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
