//! What only the install phase gets: a CA bundle to trust and private
//! registries' tokens, as files in the phase's HOME (`.corral-ca.pem`,
//! `.npmrc`, `.netrc`) that are removed when the phase ends; and the
//! redaction that keeps a token out of every log, event and tree corral
//! writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral_policy::AuditEvent;

use crate::deploy::Registry;
use crate::error::DeployError;
use crate::tree::{write_new_mode, Owner};

/// A private registry's token, for the install phase only. Its `Debug`
/// never shows the token.
#[derive(Clone)]
pub struct RegistryToken {
    /// The registry it is for (the same scheme, host and port as
    /// `--index-url` or `--npm-registry`).
    pub registry: Registry,
    /// The user name for basic authentication (pip and uv, `.netrc`).
    pub username: String,
    /// The token.
    pub token: String,
}

impl std::fmt::Debug for RegistryToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryToken")
            .field("registry", &self.registry.url)
            .field("username", &self.username)
            .field("token", &"[redacted]")
            .finish()
    }
}

impl RegistryToken {
    /// A token for `registry`. Refused: one shorter than 8 bytes (it
    /// could not be told apart from ordinary text to redact it) or with
    /// whitespace or control characters (it goes into `.netrc`).
    pub fn new(registry: Registry, username: &str, token: &str) -> Result<Self, DeployError> {
        if token.len() < 8 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(DeployError::Config(format!(
                "the token for {} is shorter than 8 characters or holds whitespace: corral cannot pass it safely",
                registry.url
            )));
        }
        Ok(RegistryToken {
            registry,
            username: username.to_string(),
            token: token.to_string(),
        })
    }
}

/// Replaces every secret in `text` with `[redacted]`.
pub(crate) fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "[redacted]");
        }
    }
    out
}

/// An event with every secret replaced, in its message and its fields.
pub(crate) fn redact_event(event: &AuditEvent, secrets: &[String]) -> AuditEvent {
    if secrets.is_empty() {
        return event.clone();
    }
    let mut e = event.clone();
    e.message = redact(&e.message, secrets);
    let fields: BTreeMap<String, serde_json::Value> = e
        .fields
        .iter()
        .map(|(k, v)| {
            let text = v.to_string();
            let clean = redact(&text, secrets);
            let v = if clean == text {
                v.clone()
            } else {
                serde_json::from_str(&clean).unwrap_or(serde_json::Value::String(clean))
            };
            (k.clone(), v)
        })
        .collect();
    e.fields = fields;
    e
}

/// The files an install phase gets in its HOME, removed on drop.
pub(crate) struct PhaseFiles {
    paths: Vec<PathBuf>,
}

impl Drop for PhaseFiles {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The sandbox's view of HOME.
const HOME: &str = "/workspace";

/// A CA bundle's text: a regular file of at most 4 MiB holding at least
/// one PEM certificate.
pub(crate) fn read_ca_bundle(path: &Path) -> Result<Vec<u8>, DeployError> {
    let bad = |why: String| {
        DeployError::Config(format!(
            "CA bundle {}: {why}; give a PEM file of CA certificates",
            path.display()
        ))
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.len() > 4 << 20 {
        return Err(bad("not a regular file of at most 4 MiB".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if !bytes
        .windows(27)
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(bad("no `-----BEGIN CERTIFICATE-----` in it".into()));
    }
    Ok(bytes)
}

/// Writes a new file of mode 0600 owned by the sandbox's identity; what a
/// phase left at that name (a link, with a kept `--cache` HOME) is
/// removed first, never followed (`create_new`).
fn write_private(path: &Path, bytes: &[u8], owner: Owner) -> Result<(), DeployError> {
    let _ = std::fs::remove_file(path);
    write_new_mode(path, bytes, 0o600)?;
    if let Some((uid, gid)) = owner.0 {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| DeployError::io(format!("chown {}", path.display()), e))?;
    }
    Ok(())
}

/// Writes the install phase's CA bundle and registry credentials into
/// `home` and returns the environment that points the installers at them:
/// `PIP_CERT`, `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` (pip),
/// `NODE_EXTRA_CA_CERTS` (Node programs), `NPM_CONFIG_CAFILE` (npm, which
/// then trusts that bundle only), `UV_NATIVE_TLS`
/// (uv, which then reads `SSL_CERT_FILE`); tokens go into `.npmrc` (npm:
/// `//HOST:PORT/PATH/:_authToken=`) and `.netrc` (pip and uv), never into
/// the environment.
pub(crate) fn install_files(
    home: &Path,
    ca: Option<&[u8]>,
    tokens: &[RegistryToken],
    owner: Owner,
) -> Result<(PhaseFiles, BTreeMap<String, String>), DeployError> {
    let mut files = PhaseFiles { paths: Vec::new() };
    let mut env = BTreeMap::new();
    if let Some(ca) = ca {
        let p = home.join(".corral-ca.pem");
        files.paths.push(p.clone());
        write_private(&p, ca, owner)?;
        let inside = format!("{HOME}/.corral-ca.pem");
        for k in [
            "PIP_CERT",
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            // npm sets its own CA list, so Node's extra certificates do
            // not reach its requests: its `cafile` does.
            "NPM_CONFIG_CAFILE",
        ] {
            env.insert(k.to_string(), inside.clone());
        }
        env.insert("UV_NATIVE_TLS".into(), "1".into());
    }
    if !tokens.is_empty() {
        let mut npmrc = String::new();
        let mut netrc = String::new();
        for t in tokens {
            let r = &t.registry;
            let path = r
                .url
                .split_once("://")
                .and_then(|(_, rest)| rest.split_once('/'))
                .map(|(_, p)| p.trim_end_matches('/'))
                .unwrap_or_default();
            let path = if path.is_empty() {
                String::from("/")
            } else {
                format!("/{path}/")
            };
            // npm keys a registry by `//HOST[:PORT]/PATH/`, the port only
            // when it is not the scheme's default.
            let default_port = if r.plain_http { 80 } else { 443 };
            let host = if r.port == default_port {
                r.host.clone()
            } else {
                format!("{}:{}", r.host, r.port)
            };
            npmrc.push_str(&format!("//{host}{path}:_authToken={}\n", t.token));
            netrc.push_str(&format!(
                "machine {} login {} password {}\n",
                r.host, t.username, t.token
            ));
        }
        for (name, text) in [(".npmrc", npmrc), (".netrc", netrc)] {
            let p = home.join(name);
            files.paths.push(p.clone());
            write_private(&p, text.as_bytes(), owner)?;
        }
        env.insert("NPM_CONFIG_USERCONFIG".into(), format!("{HOME}/.npmrc"));
        env.insert("NETRC".into(), format!("{HOME}/.netrc"));
    }
    Ok((files, env))
}

/// Refuses a tree with a token in any of its files: a phase that copied
/// one there would publish it to every server run from the tree.
pub(crate) fn scan_tree(root: &Path, secrets: &[String]) -> Result<(), DeployError> {
    use std::io::Read;
    if secrets.is_empty() {
        return Ok(());
    }
    let longest = secrets.iter().map(String::len).max().unwrap_or(0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.filter_map(|e| e.ok()).map(|e| e.path()));
            }
            continue;
        }
        let mut names = vec![p.as_os_str().as_encoded_bytes().to_vec()];
        if m.file_type().is_symlink() {
            if let Ok(t) = std::fs::read_link(&p) {
                names.push(t.as_os_str().as_encoded_bytes().to_vec());
            }
        }
        let found_in_name = names
            .iter()
            .any(|n| secrets.iter().any(|s| contains(n, s.as_bytes())));
        let mut found = found_in_name;
        if !found && m.is_file() {
            if let Ok(mut f) = std::fs::File::open(&p) {
                // In chunks, keeping the last bytes of each so a token
                // across a boundary is seen.
                let mut carry: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = match f.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    carry.extend_from_slice(&buf[..n]);
                    if secrets.iter().any(|s| contains(&carry, s.as_bytes())) {
                        found = true;
                        break;
                    }
                    let keep = carry.len().saturating_sub(longest);
                    carry.drain(..keep);
                }
            }
        }
        if found {
            let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
            return Err(DeployError::Credential(format!(
                "a registry token was found in the tree ({}); nothing was deployed. The install phase copied a credential it was given into the tree: check the package, and rotate the token",
                redact(&rel, secrets)
            )));
        }
    }
    Ok(())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn token() -> RegistryToken {
        let r = Registry::parse("--npm-registry", "http://registry.test:8080/npm/").unwrap();
        RegistryToken::new(r, "__token__", "tok-0123456789").unwrap()
    }

    #[test]
    fn files_hold_the_token_and_vanish() {
        let home = tempfile::tempdir().unwrap();
        let (files, env) = install_files(
            home.path(),
            Some(b"-----BEGIN CERTIFICATE-----\n"),
            &[token()],
            Owner(None),
        )
        .unwrap();
        let npmrc = std::fs::read_to_string(home.path().join(".npmrc")).unwrap();
        assert_eq!(
            npmrc,
            "//registry.test:8080/npm/:_authToken=tok-0123456789\n"
        );
        let netrc = std::fs::read_to_string(home.path().join(".netrc")).unwrap();
        assert_eq!(
            netrc,
            "machine registry.test login __token__ password tok-0123456789\n"
        );
        assert_eq!(env["PIP_CERT"], "/workspace/.corral-ca.pem");
        assert_eq!(env["NETRC"], "/workspace/.netrc");
        assert!(!env.values().any(|v| v.contains("tok-")));
        assert!(!format!("{:?}", token()).contains("tok-"));
        drop(files);
        assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
        let r = Registry::parse("--npm-registry", "http://registry.test:8080/npm/").unwrap();
        assert!(RegistryToken::new(r.clone(), "u", "short").is_err());
        assert!(RegistryToken::new(r, "u", "has space 12345").is_err());
    }

    #[test]
    fn redaction_and_the_tree_scan() {
        let s = vec!["tok-0123456789".to_string()];
        assert_eq!(redact("a tok-0123456789 b", &s), "a [redacted] b");
        let mut e = AuditEvent::new(
            corral_policy::Level::Info,
            corral_policy::ReasonCode::NetAllowed,
            "x tok-0123456789",
        );
        e.fields
            .insert("url".into(), "http://h/?t=tok-0123456789".into());
        let r = redact_event(&e, &s);
        assert!(
            !serde_json::to_string(&r).unwrap().contains("tok-"),
            "{r:?}"
        );
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/ok.txt"), "nothing").unwrap();
        scan_tree(d.path(), &s).unwrap();
        // Across the 1 MiB read boundary.
        let mut big = vec![b'x'; (1 << 20) - 5];
        big.extend_from_slice(b"tok-0123456789");
        std::fs::write(d.path().join("a/leak.bin"), big).unwrap();
        let e = scan_tree(d.path(), &s).unwrap_err();
        assert_eq!(e.code(), "deploy.credential");
        assert!(e.to_string().contains("a/leak.bin"), "{e}");
    }
}
