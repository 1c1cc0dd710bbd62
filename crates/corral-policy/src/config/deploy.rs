//! `[deploy]`: settings of `corral deploy` that are the operator's, not a
//! profile's.
//!
//! ```toml
//! [deploy]
//! max_tree_bytes = "1GiB"
//! ca_bundle = "/etc/corral/corp-ca.pem"
//!
//! [[deploy.registry_auth]]
//! registry = "https://npm.internal/"
//! token_env = "NPM_TOKEN"
//! ```

use std::path::{Component, PathBuf};

use toml::Spanned;

use super::apply::size;
use super::raw::RawDeploy;
use super::{ConfigError, Source};
use crate::size::ByteSize;

/// The default of `max_tree_bytes`: 1 GiB, room for a large
/// `node_modules` while a runaway install stops long before the disk is
/// full.
pub const DEFAULT_MAX_TREE_BYTES: ByteSize = ByteSize(1 << 30);

/// The `[deploy]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployConfig {
    /// The most a deployed tree may hold on disk (source copy, venv or
    /// `node_modules`, build output); a phase that writes more is stopped.
    pub max_tree_bytes: ByteSize,
    /// A PEM bundle of CA certificates the install phase trusts (a
    /// TLS-intercepting network, a registry with a private CA).
    pub ca_bundle: Option<PathBuf>,
    /// Credentials for private registries, given to the install phase
    /// only.
    pub registry_auth: Vec<RegistryAuth>,
}

/// One `[[deploy.registry_auth]]`: the token for a registry, by the name
/// of the environment variable of corral's that holds it (never the value
/// in the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    /// The registry's URL as `--index-url`/`--npm-registry` give it; it
    /// applies to the registry with the same scheme, host and port.
    pub registry: String,
    /// The variable of corral's environment holding the token.
    pub token_env: String,
    /// The user name for basic authentication (pip and uv, through
    /// `.netrc`); npm sends the token as a bearer token.
    pub username: String,
}

impl Default for DeployConfig {
    fn default() -> Self {
        DeployConfig {
            max_tree_bytes: DEFAULT_MAX_TREE_BYTES,
            ca_bundle: None,
            registry_auth: Vec::new(),
        }
    }
}

/// Applies `[deploy]`.
pub(super) fn apply_deploy(
    src: &Source,
    raw: Spanned<RawDeploy>,
) -> Result<DeployConfig, ConfigError> {
    let raw = raw.into_inner();
    let mut d = DeployConfig::default();
    if let Some(m) = raw.max_tree_bytes {
        let span = m.span();
        let v = size(src, "deploy.max_tree_bytes", m)?;
        if v.bytes() < 1 << 20 {
            return Err(src.err(
                Some(span),
                "deploy.max_tree_bytes",
                "at least 1MiB: a tree holds a venv or node_modules",
            ));
        }
        d.max_tree_bytes = v;
    }
    if let Some(ca) = raw.ca_bundle {
        let p = PathBuf::from(ca.get_ref());
        if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
            return Err(src.err(
                Some(ca.span()),
                "deploy.ca_bundle",
                format!(
                    "{:?} is not an absolute path without `..`: write the PEM file's full path",
                    ca.get_ref()
                ),
            ));
        }
        d.ca_bundle = Some(p);
    }
    for a in raw.registry_auth.unwrap_or_default() {
        let span = a.span();
        let a = a.into_inner();
        let key = "deploy.registry_auth";
        let url = a.registry.get_ref();
        if !(url.starts_with("https://") || url.starts_with("http://"))
            || url.contains('@')
            || url.chars().any(char::is_control)
        {
            return Err(src.err(
                Some(a.registry.span()),
                format!("{key}.registry"),
                format!("{url:?}: write the registry's http(s):// URL as --index-url or --npm-registry gives it, without credentials"),
            ));
        }
        let name = a.token_env.get_ref();
        if name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || name.as_bytes()[0].is_ascii_digit()
        {
            return Err(src.err(
                Some(a.token_env.span()),
                format!("{key}.token_env"),
                format!("{name:?} is not an environment variable name: the token itself never goes in the file; name the variable of corral's environment that holds it"),
            ));
        }
        let username = a
            .username
            .map(|u| u.into_inner())
            .unwrap_or_else(|| "__token__".into());
        if username.is_empty()
            || username
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(src.err(
                Some(span),
                format!("{key}.username"),
                "a user name without spaces or control characters",
            ));
        }
        d.registry_auth.push(RegistryAuth {
            registry: url.clone(),
            token_env: name.clone(),
            username,
        });
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::Config;

    #[test]
    fn max_tree_bytes() {
        assert_eq!(
            Config::parse("", None).unwrap().deploy.max_tree_bytes,
            super::DEFAULT_MAX_TREE_BYTES
        );
        let c = Config::parse("[deploy]\nmax_tree_bytes = \"300MiB\"\n", None).unwrap();
        assert_eq!(c.deploy.max_tree_bytes.bytes(), 300 << 20);
        let e = Config::parse("[deploy]\nmax_tree_bytes = \"4KiB\"\n", None).unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("deploy.max_tree_bytes", Some(2)));
        assert!(e.message.contains("at least 1MiB"), "{e}");
        let c = Config::parse(
            "[deploy]\nca_bundle = \"/etc/corral/ca.pem\"\n[[deploy.registry_auth]]\nregistry = \"https://npm.internal/\"\ntoken_env = \"NPM_TOKEN\"\n",
            None,
        )
        .unwrap();
        assert_eq!(
            c.deploy.ca_bundle.as_deref(),
            Some(std::path::Path::new("/etc/corral/ca.pem"))
        );
        assert_eq!(c.deploy.registry_auth[0].token_env, "NPM_TOKEN");
        assert_eq!(c.deploy.registry_auth[0].username, "__token__");
        for (text, key) in [
            ("ca_bundle = \"ca.pem\"", "deploy.ca_bundle"),
            (
                "[[deploy.registry_auth]]\nregistry = \"https://npm.internal/\"\ntoken_env = \"npm_s3cr3t-value!\"",
                "deploy.registry_auth.token_env",
            ),
            (
                "[[deploy.registry_auth]]\nregistry = \"https://u:p@npm.internal/\"\ntoken_env = \"T\"",
                "deploy.registry_auth.registry",
            ),
        ] {
            let e = Config::parse(&format!("[deploy]\n{text}\n"), None).unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
        let e = Config::parse("[deploy]\nbogus = 1\n", None).unwrap_err();
        assert!(e.message.contains("unknown field `bogus`"), "{e}");
    }
}
