//! Lexical checks of a caller's relative path: what is refused before
//! the kernel resolves anything (and only to give clearer errors).

use std::ffi::CString;

use super::{WorkspaceError, MAX_NAME_BYTES, MAX_REL_BYTES};

/// What a path must name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// A file: at least one component, no trailing `/`.
    File,
    /// A directory: `""` (or `.`) is the workspace itself.
    Dir,
}

/// Checks a caller's relative path and splits it into its normal
/// components (`.` and empty components from `//` are dropped).
pub(super) fn parse_rel(rel: &str, want: Want) -> Result<Vec<&str>, WorkspaceError> {
    if rel.as_bytes().contains(&0) {
        return Err(invalid(rel, "the path contains a NUL byte"));
    }
    if rel.starts_with('/') {
        return Err(WorkspaceError::Absolute { path: shown(rel) });
    }
    if rel.len() > MAX_REL_BYTES {
        return Err(invalid(rel, "the path is longer than 4095 bytes"));
    }
    let mut comps = Vec::new();
    for comp in rel.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err(WorkspaceError::Traversal { path: shown(rel) }),
            _ if comp.len() > MAX_NAME_BYTES => {
                return Err(invalid(rel, "a path component is longer than 255 bytes"))
            }
            _ => comps.push(comp),
        }
    }
    if want == Want::File {
        if rel.is_empty() {
            return Err(invalid(rel, "the path is empty"));
        }
        if comps.is_empty() || rel.ends_with('/') || rel.ends_with("/.") || rel == "." {
            return Err(invalid(rel, "the path names a directory, not a file"));
        }
    }
    Ok(comps)
}

/// Whether the first component is reserved: an exact entry of `reserved`,
/// or matching an entry `prefix*`.
pub(super) fn check_reserved(
    rel: &str,
    comps: &[&str],
    reserved: &[&str],
) -> Result<(), WorkspaceError> {
    let Some(first) = comps.first() else {
        return Ok(());
    };
    let hit = reserved
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => first.starts_with(prefix),
            None => first == pattern,
        });
    if hit {
        Err(WorkspaceError::Reserved { path: shown(rel) })
    } else {
        Ok(())
    }
}

/// Validates `rel` as a file path the way [`Workspace::write_file`](super::Workspace::write_file) does,
/// including the reserved-name check, without touching the filesystem.
/// For API layers that also want reserved names hidden from reads.
pub fn check_path(rel: &str, reserved: &[&str]) -> Result<(), WorkspaceError> {
    let comps = parse_rel(rel, Want::File)?;
    check_reserved(rel, &comps, reserved)
}

/// The components joined with `/` (`.` when there are none).
pub(super) fn join(rel: &str, comps: &[&str]) -> Result<CString, WorkspaceError> {
    if comps.is_empty() {
        Ok(c".".to_owned())
    } else {
        cstring(rel, comps.join("/").as_bytes())
    }
}

/// `bytes` as a C string; a NUL byte makes `rel` invalid.
pub(super) fn cstring(rel: &str, bytes: &[u8]) -> Result<CString, WorkspaceError> {
    CString::new(bytes).map_err(|_| invalid(rel, "the path contains a NUL byte"))
}

/// `rel` is malformed, for `reason`.
pub(super) fn invalid(rel: &str, reason: &'static str) -> WorkspaceError {
    WorkspaceError::Invalid {
        path: shown(rel),
        reason,
    }
}

/// The caller's path for an error message, cut to a sane length.
pub(super) fn shown(rel: &str) -> String {
    const MAX_CHARS: usize = 256;
    if rel.len() <= MAX_CHARS {
        return rel.to_owned();
    }
    let mut s: String = rel.chars().take(MAX_CHARS).collect();
    s.push('…');
    s
}
