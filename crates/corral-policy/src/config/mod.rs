//! Config files: TOML profiles on top of the built-in ones.
//!
//! ```toml
//! [profile.analysis]
//! extends = "code"
//! hostname = "analysis"
//! [profile.analysis.commands]
//! deny_args = ["* -m pip *"]
//! ```
//!
//! Unknown keys, bad sizes, relative or `..` paths and conflicting rules are
//! errors naming the key and the line. A field given in a profile replaces
//! the inherited one whole (lists are not appended), so what a profile says
//! is what it gets.
//!
//! The module is split along its jobs: `raw` holds what the TOML
//! deserialises into, `apply` lays a raw profile over its base one
//! section at a time, `server` applies the `[server]` section, `mcp_server` its
//! `[[server.mcp_server]]` entries, `deploy` the `[deploy]` section, and
//! `checks` holds the rules that need the merged profile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use crate::builtin;
use crate::profile::Profile;

mod apply;
mod checks;
mod deploy;
mod mcp_server;
#[cfg(test)]
mod mcp_tests;
mod plain;
mod raw;
mod server;
#[cfg(test)]
mod tests;

pub use checks::{reserved_destination, validate_hostname, HostnameError};
pub use deploy::{DeployConfig, RegistryAuth, DEFAULT_MAX_TREE_BYTES};

use raw::{RawConfig, RawProfile};

/// A config error, with the file, line and key it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", location(.file, .line, .key))]
pub struct ConfigError {
    /// The config file, when the error came from one.
    pub file: Option<PathBuf>,
    /// 1-based line in that file.
    pub line: Option<usize>,
    /// Dotted key, e.g. `profile.web.filesystem.read_only`.
    pub key: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// `FILE:line N: KEY: ` with the parts that are known.
fn location(file: &Option<PathBuf>, line: &Option<usize>, key: &str) -> String {
    let mut parts = Vec::new();
    if let Some(f) = file {
        parts.push(f.display().to_string());
    }
    if let Some(l) = line {
        parts.push(format!("line {l}"));
    }
    if !key.is_empty() {
        parts.push(key.to_string());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{}: ", parts.join(": "))
    }
}

/// All profiles known to a run: the built-ins plus a config file's.
#[derive(Debug, Clone)]
pub struct Config {
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// `corral serve` settings (defaults when the file has no `[server]`).
    pub server: crate::server::ServerConfig,
    /// `corral deploy` settings (defaults when the file has no `[deploy]`).
    pub deploy: DeployConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profiles: builtin::all(),
            server: crate::server::ServerConfig::default(),
            deploy: DeployConfig::default(),
        }
    }
}
/// Turns byte offsets into line numbers and builds errors.
pub(crate) struct Source<'a> {
    text: &'a str,
    file: Option<&'a Path>,
}

impl Source<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }

    pub(crate) fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.map(Path::to_path_buf),
            line: span.map(|s| self.line_of(s.start)),
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Loads a config file on top of the built-in profiles.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(&read(path)?, Some(path))
    }

    /// Parses config text on top of the built-in profiles. `file` is only
    /// used in error messages.
    pub fn parse(text: &str, file: Option<&Path>) -> Result<Config, ConfigError> {
        Config::parse_with(text, file, Wanted::All)
    }

    /// Like [`Config::load`] (or the built-in profiles alone when `path` is
    /// `None`), for a caller that uses only the profiles named in `wanted`,
    /// such as `corral run`: of the built-in profiles, only those `wanted`
    /// names and those the file's profiles extend are built; the others
    /// are missing from [`Config::profiles`]. Everything else is as with
    /// [`Config::load`]: every profile of the file is built and checked,
    /// so a file that `load` refuses is refused with the same error; a
    /// `wanted` profile is the same profile; [`Config::profile`]'s error
    /// for an unknown name lists every profile, built or not; and the
    /// `[server]` and `[deploy]` sections are applied.
    pub fn load_wanted(path: Option<&Path>, wanted: &[&str]) -> Result<Config, ConfigError> {
        match path {
            Some(path) => Config::parse_wanted(&read(path)?, Some(path), wanted),
            None => Ok(Config {
                profiles: add_builtins(BTreeMap::new(), Wanted::Only(wanted)),
                server: crate::server::ServerConfig::default(),
                deploy: DeployConfig::default(),
            }),
        }
    }

    /// [`Config::parse`] building only the built-in profiles `wanted` names
    /// or the text's profiles extend; see [`Config::load_wanted`].
    pub fn parse_wanted(
        text: &str,
        file: Option<&Path>,
        wanted: &[&str],
    ) -> Result<Config, ConfigError> {
        Config::parse_with(text, file, Wanted::Only(wanted))
    }

    fn parse_with(text: &str, file: Option<&Path>, wanted: Wanted) -> Result<Config, ConfigError> {
        let src = Source { text, file };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .and_then(|span| plain::key_at(text, span.start))
                .unwrap_or_default();
            src.err(e.span(), key, plain::plain_message(e.message().trim()))
        })?;
        // A built-in profile is built when a file profile names it (as its
        // base or as itself) and, at the end, when `wanted` asks for it.
        let mut config = Config {
            profiles: BTreeMap::new(),
            server: crate::server::ServerConfig::default(),
            deploy: DeployConfig::default(),
        };
        let raw_server = raw.server;
        if let Some(d) = raw.deploy {
            config.deploy = deploy::apply_deploy(&src, d)?;
        }
        // Resolve `extends` in dependency order; a round that resolves
        // nothing means the rest extend each other in a cycle.
        let mut pending: Vec<(String, Spanned<RawProfile>)> = raw.profile.into_iter().collect();
        while !pending.is_empty() {
            let unresolved: Vec<String> = pending.iter().map(|(n, _)| n.clone()).collect();
            let mut next = Vec::new();
            for (name, raw) in pending {
                let key = format!("profile.{name}");
                if name.is_empty()
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
                {
                    return Err(src.err(
                        Some(raw.span()),
                        "profile",
                        format!("profile name {name:?} is invalid: use letters, digits, `_`, `-` and `.`"),
                    ));
                }
                let base_name = raw.get_ref().extends.as_ref().map(|s| s.get_ref().clone());
                // Wait while the base is a file profile not yet built.
                if base_name
                    .as_ref()
                    .is_some_and(|b| b != &name && unresolved.contains(b))
                {
                    next.push((name, raw));
                    continue;
                }
                let base = match &base_name {
                    Some(b) if b == &name => builtin::by_name(b),
                    Some(b) => match config.profiles.get(b) {
                        Some(p) => Some(p.clone()),
                        None => builtin::by_name(b),
                    },
                    None => builtin::by_name(&name),
                };
                let base = match (base, &base_name) {
                    (Some(mut p), _) => {
                        p.name = name.clone();
                        p
                    }
                    (None, None) => builtin::base(&name),
                    (None, Some(b)) => {
                        let span = raw.get_ref().extends.as_ref().map(|s| s.span());
                        return Err(src.err(
                            span,
                            format!("{key}.extends"),
                            format!("unknown profile `{b}` (known: {})", known(&config)),
                        ));
                    }
                };
                let span = raw.span();
                let profile = apply::apply(&src, &key, base, raw.into_inner())?;
                checks::check_merged(&src, &key, span, &profile)?;
                config.profiles.insert(name, profile);
            }
            if next.len() == unresolved.len() {
                let (name, raw) = &next[0];
                let span = raw.get_ref().extends.as_ref().map(|s| s.span());
                return Err(src.err(
                    span,
                    format!("profile.{name}.extends"),
                    "profiles extend each other in a cycle",
                ));
            }
            pending = next;
        }
        config.profiles = add_builtins(config.profiles, wanted);
        if let Some(server) = raw_server {
            config.server = server::apply_server(&src, server, &config)?;
        }
        Ok(config)
    }

    /// Whether a profile called `name` exists: one of the file's or a
    /// built-in one, built or not.
    pub fn has_profile(&self, name: &str) -> bool {
        self.profiles.contains_key(name) || builtin::NAMES.contains(&name)
    }

    /// The named profile, or an error listing the known ones.
    pub fn profile(&self, name: &str) -> Result<&Profile, ConfigError> {
        self.profiles.get(name).ok_or_else(|| ConfigError {
            file: None,
            line: None,
            key: String::from("profile"),
            message: format!("unknown profile `{name}` (known: {})", known(self)),
        })
    }
}

/// The names of every profile, sorted: the file's and the built-in ones,
/// also those not built.
fn known(config: &Config) -> String {
    let names: std::collections::BTreeSet<&str> = config
        .profiles
        .keys()
        .map(String::as_str)
        .chain(builtin::NAMES.iter().copied())
        .collect();
    names.into_iter().collect::<Vec<_>>().join(", ")
}

/// Reads a config file.
fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: Some(path.to_path_buf()),
        line: None,
        key: String::new(),
        message: format!("cannot read config file: {e}"),
    })
}

/// Which built-in profiles end up in [`Config::profiles`] besides those a
/// file's profiles extend.
#[derive(Clone, Copy)]
enum Wanted<'a> {
    /// Every one (what [`Config::load`] and [`Config::parse`] give).
    All,
    /// Only these names (names that are no built-in are ignored).
    Only(&'a [&'a str]),
}

/// `profiles` (the file's) with the built-in profiles `wanted` names
/// added, except those the file overrides.
fn add_builtins(
    mut profiles: BTreeMap<String, Profile>,
    wanted: Wanted,
) -> BTreeMap<String, Profile> {
    let names: &[&str] = match wanted {
        Wanted::All => builtin::NAMES,
        Wanted::Only(names) => names,
    };
    for &name in names {
        if profiles.contains_key(name) {
            continue;
        }
        if let Some(p) = builtin::by_name(name) {
            profiles.insert(name.to_string(), p);
        }
    }
    profiles
}
