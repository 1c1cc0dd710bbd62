//! `[deploy]`: settings of `corral deploy` that are the operator's, not a
//! profile's.
//!
//! ```toml
//! [deploy]
//! max_tree_bytes = "1GiB"
//! ```

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
}

impl Default for DeployConfig {
    fn default() -> Self {
        DeployConfig {
            max_tree_bytes: DEFAULT_MAX_TREE_BYTES,
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
        let e = Config::parse("[deploy]\nbogus = 1\n", None).unwrap_err();
        assert!(e.message.contains("unknown field `bogus`"), "{e}");
    }
}
