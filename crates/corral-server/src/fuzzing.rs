//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz): thin
//! wrappers over the server's private checks of caller input that run
//! without a server. **Not a stable API**: hidden from the documentation,
//! for `fuzz/` only, and free to change with the checks. Nothing here
//! changes behaviour.

use crate::{base64, exec, workspace};

/// The workspace path check ([`workspace::check_path`] with the default
/// reserved names) on `buf` as UTF-8, as the file tools and input files
/// get it. An accepted path is relative, has no `..` component and no
/// NUL byte. `true` when it was accepted.
pub fn workspace_path(buf: &[u8]) -> bool {
    let Ok(rel) = std::str::from_utf8(buf) else {
        return false;
    };
    if workspace::check_path(rel, workspace::DEFAULT_RESERVED).is_err() {
        return false;
    }
    assert!(!rel.starts_with('/'), "absolute path accepted");
    assert!(!rel.contains('\0'), "NUL byte accepted");
    assert!(
        !rel.split('/').any(|c| c == ".."),
        "`..` component accepted"
    );
    assert!(
        !rel.split('/')
            .find(|c| !c.is_empty() && *c != ".")
            .is_some_and(|c| c.starts_with(".corral")),
        "reserved name accepted"
    );
    true
}

/// A `POST /v1/executions` body: decodes `buf` as the JSON request the
/// API takes, then every `base64` input file's content as the request
/// path does. Decoded base64 must encode back to the same text (padding
/// aside). `true` when the JSON was a request.
pub fn execution_request(buf: &[u8]) -> bool {
    let Ok(req) = serde_json::from_slice::<exec::ExecutionRequest>(buf) else {
        return false;
    };
    for file in req.files.unwrap_or_default() {
        let _ = workspace_path(file.path.as_bytes());
        base64_text(file.content.as_bytes());
    }
    true
}

/// The base64 decoder on `buf` as UTF-8. What decodes must encode back
/// to the input, padding aside, unless the input had trailing bits the
/// decoder drops.
pub fn base64_text(buf: &[u8]) {
    let Ok(text) = std::str::from_utf8(buf) else {
        return;
    };
    if let Some(data) = base64::decode(text) {
        let again = base64::decode(&base64::encode(&data));
        assert_eq!(
            again.as_deref(),
            Some(&data[..]),
            "base64 does not round-trip"
        );
    }
}
