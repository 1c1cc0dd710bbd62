//! Protected entries: files and directories inside a writable bind that the
//! sandbox may read but never change, create, remove or replace.
//!
//! A sandbox that can write a project directory can plant code the user
//! runs later, outside any sandbox: a git hook or an `fsmonitor` command in
//! `.git/config` (run by the next `git status`, shell prompts included),
//! shell start-up files, an editor's tasks (`.vscode`, `.idea`), an agent's
//! configuration (`.mcp.json`, `.claude`, `.cursor`, `.codex`). Codex and
//! sandbox-runtime refuse writes to such paths by default; corral does too,
//! for every writable bind of the caller's (the workdir included).

use std::fmt;

use serde::{Serialize, Serializer};

/// One protected path, relative to the root of a writable bind: a file
/// or a directory (a trailing `/` is accepted and dropped). Written
/// `~/NAME`, it applies only to binds of home directories (shell start-up
/// files, `~/.gitconfig`), which are read from there only. A component
/// `*` stands for every directory there when the run starts
/// (`.git/modules/*/hooks`); it never makes a placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProtectEntry {
    /// The relative path, `/`-separated, without `~/` or a trailing `/`.
    path: String,
    /// Written `~/...`: only in binds of home directories.
    home: bool,
}

/// Why a protect entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtectError {
    /// Empty, absolute, or with an empty, `.` or `..` component.
    #[error(
        "protect entry {0:?} must be a relative path inside the bind (such as \".git/hooks\" or \".mcp.json\"), \
         without `.`, `..` or empty components; `*` only as a whole component"
    )]
    Invalid(String),
}

impl ProtectEntry {
    /// Parses `".git/hooks"`, `".mcp.json"` or `"~/.bashrc"`.
    pub fn parse(s: &str) -> Result<ProtectEntry, ProtectError> {
        let (path, home) = match s.strip_prefix("~/") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let path = path.strip_suffix('/').unwrap_or(path);
        let valid = !path.is_empty()
            && !path.starts_with('/')
            && !path.contains('\0')
            && path
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && (c == "*" || !c.contains('*')));
        if !valid {
            return Err(ProtectError::Invalid(s.to_string()));
        }
        Ok(ProtectEntry {
            path: path.to_string(),
            home,
        })
    }

    /// The relative path, without a trailing `/`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the entry applies only to binds of home directories.
    pub fn home_only(&self) -> bool {
        self.home
    }

    /// Whether a component is the wildcard `*`.
    pub fn has_wildcard(&self) -> bool {
        self.components().any(|c| c == "*")
    }

    /// The path's components, first to last.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.path.split('/')
    }
}

impl fmt::Display for ProtectEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.home {
            f.write_str("~/")?;
        }
        f.write_str(&self.path)
    }
}

impl Serialize for ProtectEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The entries every built-in profile protects: what Codex and
/// sandbox-runtime protect, and the start-up files of the common shells.
pub const DEFAULT_PROTECT: &[&str] = &[
    // git: hooks run on commit, checkout, merge; the config can name
    // commands run by almost any git command (core.fsmonitor,
    // core.hooksPath, core.sshCommand, aliases, filters). Submodules keep
    // theirs under .git/modules (one level deep covers the usual case).
    ".git/hooks",
    ".git/config",
    ".git/modules/*/hooks",
    ".git/modules/*/config",
    ".gitmodules",
    // Editors and agents run tasks and servers named in these.
    ".vscode",
    ".idea",
    ".mcp.json",
    ".claude",
    ".cursor",
    // Codex's project configuration (MCP servers, commands), which Codex's
    // own sandbox keeps read-only next to .git.
    ".codex",
    // Read from a home directory only: git's global config, the shells'
    // start-up files, ripgrep's config.
    "~/.gitconfig",
    "~/.bashrc",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.bash_logout",
    "~/.profile",
    "~/.zshrc",
    "~/.zprofile",
    "~/.zshenv",
    "~/.zlogin",
    "~/.ripgreprc",
];

/// [`DEFAULT_PROTECT`], parsed.
pub fn default_protect() -> Vec<ProtectEntry> {
    DEFAULT_PROTECT
        .iter()
        .filter_map(|s| ProtectEntry::parse(s).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_relative_paths() {
        let d = ProtectEntry::parse(".git/hooks/").expect("valid");
        assert_eq!(d.path(), ".git/hooks");
        assert_eq!(d.to_string(), ".git/hooks");
        let f = ProtectEntry::parse(".mcp.json").expect("valid");
        assert_eq!(f.path(), ".mcp.json");
        assert_eq!(f.components().collect::<Vec<_>>(), vec![".mcp.json"]);
        assert!(!f.home_only());
        let h = ProtectEntry::parse("~/.bashrc").expect("valid");
        assert_eq!((h.path(), h.home_only()), (".bashrc", true));
        assert_eq!(h.to_string(), "~/.bashrc");
    }

    #[test]
    fn refuses_paths_that_leave_the_bind() {
        let w = ProtectEntry::parse(".git/modules/*/hooks").expect("valid");
        assert!(w.has_wildcard());
        for bad in [
            "a*",
            "*.json",
            "",
            "/",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/.",
            "//",
            "~/",
            "~/../x",
        ] {
            assert!(ProtectEntry::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_default_list_parses_whole() {
        assert_eq!(default_protect().len(), DEFAULT_PROTECT.len());
    }
}
