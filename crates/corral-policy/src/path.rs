//! Paths inside and outside the sandbox, validated once at the edge.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// An absolute, normalised path with no `.`, `..` or empty components and
/// no NUL byte. Every path in a policy is one of these, so no later step has
/// to wonder whether `..` could walk out of a mount.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath(String);

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not start with `/`.
    #[error("path `{0}` is relative; write an absolute path starting with `/`")]
    Relative(String),
    /// The path has a `..` or `.` component.
    #[error("path `{0}` contains `.` or `..`; write the path without them")]
    DotComponent(String),
    /// The path contains a NUL byte.
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    /// The path is empty.
    #[error("path is empty")]
    Empty,
    /// A `SRC:DEST` mount spec has an empty side or too many colons.
    #[error("mount `{0}` is not of the form PATH or PATH:DEST")]
    BadMountSpec(String),
}

impl SandboxPath {
    /// Validates `text` as an absolute path without `.`/`..` components.
    /// Repeated and trailing slashes are folded (`/a//b/` is `/a/b`).
    pub fn new(text: &str) -> Result<Self, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        if text.contains('\0') {
            return Err(PathError::Nul(text.to_string()));
        }
        if !text.starts_with('/') {
            return Err(PathError::Relative(text.to_string()));
        }
        let mut normal = String::with_capacity(text.len());
        for part in text.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." {
                return Err(PathError::DotComponent(text.to_string()));
            }
            normal.push('/');
            normal.push_str(part);
        }
        if normal.is_empty() {
            normal.push('/');
        }
        Ok(SandboxPath(normal))
    }

    /// The path as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path as a [`Path`].
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }

    /// The path relative to `/` (empty for `/` itself), for joining under a
    /// new root.
    pub fn relative(&self) -> &str {
        self.0.trim_start_matches('/')
    }

    /// Whether `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &SandboxPath) -> bool {
        is_at_or_below(&self.0, &other.0)
    }

    /// Whether this is the root directory.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = PathError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        SandboxPath::new(&value)
    }
}

impl From<SandboxPath> for String {
    fn from(value: SandboxPath) -> Self {
        value.0
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// A host path made visible inside the sandbox, written `PATH` (same place
/// inside) or `PATH:DEST`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// Where the files are on the host.
    pub source: SandboxPath,
    /// Where they appear inside the sandbox.
    pub dest: SandboxPath,
}

impl MountSpec {
    /// Parses `PATH` or `PATH:DEST`. A relative host path is resolved
    /// against `cwd` (the CLI passes the current directory; config files
    /// pass `None` and so require absolute paths).
    pub fn parse(text: &str, cwd: Option<&Path>) -> Result<Self, PathError> {
        let (src, dest) = match text.split_once(':') {
            Some((src, dest)) => {
                if src.is_empty() || dest.is_empty() || dest.contains(':') {
                    return Err(PathError::BadMountSpec(text.to_string()));
                }
                (src, Some(dest))
            }
            None => (text, None),
        };
        let source = match cwd {
            Some(cwd) if !src.starts_with('/') => absolutize(cwd, src)?,
            _ => SandboxPath::new(src)?,
        };
        let dest = match dest {
            Some(d) => SandboxPath::new(d)?,
            None => source.clone(),
        };
        Ok(MountSpec { source, dest })
    }
}

impl fmt::Display for MountSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.source == self.dest {
            write!(f, "{}", self.source)
        } else {
            write!(f, "{}:{}", self.source, self.dest)
        }
    }
}

/// Joins a relative host path onto `cwd` lexically (no symlink resolution,
/// which happens when the path is opened), refusing `..`.
fn absolutize(cwd: &Path, rel: &str) -> Result<SandboxPath, PathError> {
    let mut joined = PathBuf::from(cwd);
    for comp in Path::new(rel).components() {
        match comp {
            Component::Normal(part) => joined.push(part),
            Component::CurDir => {}
            _ => return Err(PathError::DotComponent(rel.to_string())),
        }
    }
    let text = joined
        .to_str()
        .ok_or_else(|| PathError::BadMountSpec(rel.to_string()))?;
    SandboxPath::new(text)
}

/// Whether the normalised path `path` is `dir` or lies below it, by whole
/// components (`/etc` holds `/etc/ssl`, not `/etcx`). For absolute and
/// root-relative forms alike (`etc/ssl` below `etc`); a `dir` of `/` or
/// `""` is the root, which holds every path, and a trailing `/` on `dir`
/// is ignored.
pub fn is_at_or_below(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    dir.is_empty()
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_and_rejects() {
        assert_eq!(SandboxPath::new("/a//b/").unwrap().as_str(), "/a/b");
        assert_eq!(SandboxPath::new("/").unwrap().as_str(), "/");
        assert!(matches!(
            SandboxPath::new("a/b"),
            Err(PathError::Relative(_))
        ));
        assert!(matches!(
            SandboxPath::new("/a/../etc"),
            Err(PathError::DotComponent(_))
        ));
        assert!(matches!(
            SandboxPath::new("/a/./b"),
            Err(PathError::DotComponent(_))
        ));
        assert!(matches!(SandboxPath::new("/a\0b"), Err(PathError::Nul(_))));
        assert!(matches!(SandboxPath::new(""), Err(PathError::Empty)));
    }

    #[test]
    fn at_or_below_respects_components_in_both_forms() {
        for (path, dir, below) in [
            ("/etc/ssl", "/etc", true),
            ("/etc", "/etc", true),
            ("/etcx", "/etc", false),
            ("/etc", "/etc/ssl", false),
            ("etc/ssl", "etc", true),
            ("etcx", "etc", false),
            ("etc", "", true),
            ("/usr", "/", true),
            ("/srv/data/x", "/srv/data/", true),
        ] {
            assert_eq!(is_at_or_below(path, dir), below, "{path} below {dir}");
        }
    }

    #[test]
    fn starts_with_respects_components() {
        let usr = SandboxPath::new("/usr").unwrap();
        assert!(SandboxPath::new("/usr/bin").unwrap().starts_with(&usr));
        assert!(SandboxPath::new("/usr").unwrap().starts_with(&usr));
        assert!(!SandboxPath::new("/usrx").unwrap().starts_with(&usr));
        assert!(usr.starts_with(&SandboxPath::new("/").unwrap()));
    }

    #[test]
    fn mount_specs() {
        let m = MountSpec::parse("/data:/in", None).unwrap();
        assert_eq!((m.source.as_str(), m.dest.as_str()), ("/data", "/in"));
        let m = MountSpec::parse("/data", None).unwrap();
        assert_eq!(m.dest.as_str(), "/data");
        let m = MountSpec::parse("sub/dir", Some(Path::new("/home/u"))).unwrap();
        assert_eq!(m.source.as_str(), "/home/u/sub/dir");
        assert!(MountSpec::parse("../x", Some(Path::new("/home/u"))).is_err());
        assert!(MountSpec::parse("rel", None).is_err());
        assert!(MountSpec::parse("/a:", None).is_err());
        assert!(MountSpec::parse("/a:/b:/c", None).is_err());
        assert!(MountSpec::parse("/a:rel", None).is_err());
    }
}
