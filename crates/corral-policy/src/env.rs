//! The environment a sandboxed program receives.
//!
//! The program starts from nothing. The profile adds a small base (`PATH`,
//! `HOME`, ...), names to pass from the invoking environment and fixed
//! values; the request may add more. A blocklist of names that load code
//! into interpreters and the dynamic loader always wins, and every name it
//! strips becomes an `env.blocked` audit event.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::audit::{AuditEvent, Level, ReasonCode};
use crate::profile::EnvPolicy;

/// Names (globs, matched case-insensitively) that are never passed, with the
/// reason each is dangerous.
pub const ALWAYS_BLOCKED: &[(&str, &str)] = &[
    (
        "LD_*",
        "dynamic loader injection (ld.so(8): LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)",
    ),
    (
        "GLIBC_TUNABLES",
        "glibc tunables; CVE-2023-4911 (Looking Glass)",
    ),
    ("GCONV_PATH", "loads gconv modules as shared objects"),
    ("MALLOC_*", "glibc malloc debugging hooks"),
    ("HOSTALIASES", "redirects name resolution through a file"),
    ("RES_OPTIONS", "resolver options"),
    ("LOCALDOMAIN", "resolver search domains"),
    ("NLSPATH", "message catalogues loaded from a path"),
    (
        "DYLD_*",
        "macOS loader injection, refused everywhere for symmetry",
    ),
    ("NODE_OPTIONS", "injects node flags such as --require"),
    ("NODE_PATH", "node module search path"),
    (
        "NODE_REPL_EXTERNAL_MODULE",
        "loads a module into the node REPL",
    ),
    ("PYTHONPATH", "python module search path"),
    ("PYTHONSTARTUP", "python runs this file at start"),
    ("PYTHONHOME", "relocates the python standard library"),
    ("PYTHONINSPECT", "drops python into interactive mode"),
    ("PYTHONUSERBASE", "python user site directory"),
    ("PYTHONBREAKPOINT", "imports a callable on breakpoint()"),
    ("BASH_ENV", "bash sources this file when non-interactive"),
    ("ENV", "sh sources this file"),
    (
        "BASH_FUNC_*",
        "exported bash functions (Shellshock-style injection)",
    ),
    ("SHELLOPTS", "bash options such as xtrace"),
    ("BASHOPTS", "bash shopt options"),
    ("PS4", "evaluated by bash under xtrace"),
    ("PROMPT_COMMAND", "run by interactive bash"),
    ("IFS", "word splitting of shell scripts"),
    ("CDPATH", "changes what `cd` resolves to in scripts"),
    ("PERL5OPT", "injects perl options such as -M"),
    ("PERL5LIB", "perl module search path"),
    ("PERLLIB", "perl module search path"),
    ("RUBYOPT", "injects ruby options such as -r"),
    ("RUBYLIB", "ruby library search path"),
    ("JAVA_TOOL_OPTIONS", "injects JVM agents"),
    ("_JAVA_OPTIONS", "injects JVM options"),
    ("JDK_JAVA_OPTIONS", "injects JVM options"),
];

/// The base `PATH`.
pub const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Base variables every sandbox gets unless the profile overrides them.
pub const BASE_ENV: &[(&str, &str)] = &[
    ("PATH", BASE_PATH),
    ("HOME", "/workspace"),
    ("TMPDIR", "/tmp"),
    ("LANG", "C.UTF-8"),
];

/// Why an environment entry could not be used at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The name is empty or has `=` or NUL in it.
    #[error("environment name {0:?} is invalid: names are non-empty and contain no `=` or NUL")]
    BadName(String),
    /// The value has a NUL byte.
    #[error("environment value of {0} contains a NUL byte")]
    NulValue(String),
    /// A `NAME=VALUE` assignment has no `=`.
    #[error("`{0}` is not NAME=VALUE")]
    NotAssignment(String),
    /// A block pattern is not a valid glob.
    #[error("env block pattern `{pattern}` is not a valid glob: {why}")]
    BadPattern {
        /// The pattern as written.
        pattern: String,
        /// The glob parser's complaint.
        why: String,
    },
}

/// A blocklist: the built-in names plus a profile's own patterns. Matching
/// is a plain wildcard match (`*` any run, `?` one character, ASCII case
/// ignored), cheap enough to build on every launch.
#[derive(Debug, Clone)]
pub struct Blocklist {
    /// (pattern, why): the built-in ones borrowed, not copied.
    patterns: Vec<(Cow<'static, str>, Cow<'static, str>)>,
}

impl Blocklist {
    /// The built-in list plus `extra` patterns. A pattern must be a
    /// non-empty name made of name characters and `*`/`?` wildcards.
    pub fn new(extra: &[String]) -> Result<Self, EnvError> {
        let mut patterns: Vec<(Cow<'static, str>, Cow<'static, str>)> =
            Vec::with_capacity(ALWAYS_BLOCKED.len() + extra.len());
        patterns.extend(
            ALWAYS_BLOCKED
                .iter()
                .map(|&(p, why)| (Cow::Borrowed(p), Cow::Borrowed(why))),
        );
        for p in extra {
            if p.is_empty() || p.contains(['=', '\0', '[', ']', '{', '}', '\\']) {
                return Err(EnvError::BadPattern {
                    pattern: p.clone(),
                    why: String::from("use letters, digits, `_`, and the wildcards `*` and `?`"),
                });
            }
            patterns.push((
                Cow::Owned(p.clone()),
                Cow::Borrowed("blocked by the profile"),
            ));
        }
        Ok(Blocklist { patterns })
    }

    /// The pattern and reason that block `name`, if any.
    pub fn matching(&self, name: &str) -> Option<(&str, &str)> {
        self.patterns
            .iter()
            .find(|(p, _)| wildcard_match(p.as_bytes(), name.as_bytes()))
            .map(|(p, why)| (p.as_ref(), why.as_ref()))
    }
}

/// `*`/`?` wildcard match, ASCII case-insensitive, without backtracking
/// blow-up (the classic two-pointer algorithm).
fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&text[t])) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Checks that `name` may be an environment variable name at all.
pub fn validate_name(name: &str) -> Result<(), EnvError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(EnvError::BadName(name.to_string()));
    }
    Ok(())
}

/// Splits `NAME=VALUE`.
pub fn parse_assignment(text: &str) -> Result<(String, String), EnvError> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| EnvError::NotAssignment(text.to_string()))?;
    validate_name(name)?;
    if value.contains('\0') {
        return Err(EnvError::NulValue(name.to_string()));
    }
    Ok((name.to_string(), value.to_string()))
}

/// Environment variables as (name, value), sorted by name.
pub type EnvVars = Vec<(String, String)>;

/// What the request adds on top of the profile.
#[derive(Debug, Clone, Default)]
pub struct EnvRequest {
    /// Names to copy from the invoking environment.
    pub pass: Vec<String>,
    /// Fixed values.
    pub set: Vec<(String, String)>,
}

/// Builds the program's environment. `lookup` reads the invoking
/// environment. Returns the variables (sorted by name) and one warning event
/// per stripped name.
pub fn build(
    policy: &EnvPolicy,
    request: &EnvRequest,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(EnvVars, Vec<AuditEvent>), EnvError> {
    let blocklist = Blocklist::new(&policy.block)?;
    let mut env: BTreeMap<String, String> = BASE_ENV
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut events = Vec::new();
    let mut offer = |name: &str, value: Option<String>, source: &str| -> Result<(), EnvError> {
        validate_name(name)?;
        if let Some((pattern, why)) = blocklist.matching(name) {
            events.push(
                AuditEvent::new(
                    Level::Warn,
                    ReasonCode::EnvBlocked,
                    format!("environment variable {name} stripped: {why}"),
                )
                .with("name", name)
                .with("rule", pattern)
                .with("source", source),
            );
            return Ok(());
        }
        if let Some(value) = value {
            if value.contains('\0') {
                return Err(EnvError::NulValue(name.to_string()));
            }
            env.insert(name.to_string(), value);
        }
        Ok(())
    };
    for name in &policy.pass {
        offer(name, lookup(name), "profile.pass")?;
    }
    for (name, value) in &policy.set {
        offer(name, Some(value.clone()), "profile.set")?;
    }
    for name in &request.pass {
        offer(name, lookup(name), "request.pass")?;
    }
    for (name, value) in &request.set {
        offer(name, Some(value.clone()), "request.set")?;
    }
    Ok((env.into_iter().collect(), events))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EnvPolicy {
        EnvPolicy {
            pass: vec!["LANG".into()],
            set: BTreeMap::from([("PYTHONUNBUFFERED".to_string(), "1".to_string())]),
            block: vec!["AWS_*".into()],
        }
    }

    #[test]
    fn blocklist_wins_everywhere_and_is_reported() {
        let host = |n: &str| match n {
            "LD_PRELOAD" => Some("/evil.so".to_string()),
            "LANG" => Some("de_DE.UTF-8".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("s3cr3t".to_string()),
            _ => None,
        };
        let req = EnvRequest {
            pass: vec!["LD_PRELOAD".into(), "AWS_SECRET_ACCESS_KEY".into()],
            set: vec![
                ("NODE_OPTIONS".into(), "--require /x".into()),
                ("ld_library_path".into(), "/x".into()),
                ("GREETING".into(), "hi".into()),
            ],
        };
        let (env, events) = build(&policy(), &req, &host).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "GREETING",
                "HOME",
                "LANG",
                "PATH",
                "PYTHONUNBUFFERED",
                "TMPDIR"
            ]
        );
        assert!(env.contains(&("LANG".into(), "de_DE.UTF-8".into())));
        let stripped: Vec<_> = events.iter().map(|e| e.fields["name"].clone()).collect();
        assert_eq!(
            stripped,
            [
                "LD_PRELOAD",
                "AWS_SECRET_ACCESS_KEY",
                "NODE_OPTIONS",
                "ld_library_path"
            ]
        );
        assert!(events.iter().all(|e| e.code == ReasonCode::EnvBlocked));
    }

    #[test]
    fn every_documented_name_is_blocked() {
        let list = Blocklist::new(&[]).unwrap();
        for name in [
            "LD_PRELOAD",
            "LD_AUDIT",
            "NODE_OPTIONS",
            "NODE_PATH",
            "PYTHONPATH",
            "PYTHONSTARTUP",
            "PYTHONHOME",
            "BASH_ENV",
            "ENV",
            "PERL5OPT",
            "RUBYOPT",
            "GCONV_PATH",
            "GLIBC_TUNABLES",
            "BASH_FUNC_x%%",
        ] {
            assert!(list.matching(name).is_some(), "{name} must be blocked");
        }
        assert!(list.matching("PATH").is_none());
        assert!(list.matching("ENVIRONMENT").is_none());
        assert!(
            list.matching("XLD_PRELOAD").is_none(),
            "patterns are anchored"
        );
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"AWS_*", b"aws_secret"));
        assert!(wildcard_match(b"*TOKEN*", b"GITHUB_TOKEN_X"));
        assert!(wildcard_match(b"A?C", b"ABC"));
        assert!(!wildcard_match(b"A?C", b"AC"));
        assert!(wildcard_match(b"*", b""));
        assert!(!wildcard_match(b"ab", b"abc"));
        assert!(wildcard_match(b"a*b*c", b"axxbyyc"));
        assert!(!wildcard_match(b"a*b*c", b"axxbyy"));
        assert!(Blocklist::new(&["BAD[".to_string()]).is_err());
    }

    #[test]
    fn bad_names_and_values_are_errors() {
        assert!(parse_assignment("NOEQUALS").is_err());
        assert!(parse_assignment("=x").is_err());
        assert_eq!(
            parse_assignment("A=b=c").unwrap(),
            ("A".into(), "b=c".into())
        );
        let req = EnvRequest {
            pass: vec![],
            set: vec![("X".into(), "a\0b".into())],
        };
        assert!(build(&policy(), &req, &|_| None).is_err());
    }
}
