//! Which commands a request may run.
//!
//! A request names a command from the profile's allowlist (`python3`), never
//! a path, unless the profile says paths are fine. The whole command line is
//! then matched against the profile's argument deny patterns. Name-to-path
//! resolution happens once in the runtime, against the sandbox's view of
//! the filesystem; this module only decides.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::audit::{AuditEvent, Level, ReasonCode};
use crate::path::SandboxPath;
use crate::profile::CommandPolicy;

/// An accepted command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandDecision {
    /// An allowlisted name, still to be resolved to its path.
    Named(String),
    /// An absolute path the profile allows as is.
    Path(SandboxPath),
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandRejection {
    /// No command was given.
    #[error("no command given")]
    Empty,
    /// An argument contains a NUL byte (it could not reach execve intact).
    #[error("argument {index} contains a NUL byte")]
    Nul {
        /// Position in argv.
        index: usize,
    },
    /// The name is not in the allowlist.
    #[error("command `{command}` is not allowed by profile `{profile}` (allowed: {allowed})")]
    NotAllowed {
        /// The command as requested.
        command: String,
        /// The profile's name.
        profile: String,
        /// The allowlist, comma-separated.
        allowed: String,
    },
    /// A path was given and the profile only allows names.
    #[error("command `{command}` is a path; profile `{profile}` only runs allowlisted command names (allowed: {allowed})")]
    PathRejected {
        /// The command as requested.
        command: String,
        /// The profile's name.
        profile: String,
        /// The allowlist, comma-separated.
        allowed: String,
    },
    /// The command line matched a deny pattern.
    #[error("command line refused by argument rule `{rule}` of profile `{profile}`")]
    ArgsDenied {
        /// The pattern that matched.
        rule: String,
        /// The profile's name.
        profile: String,
    },
    /// A deny pattern in the profile does not compile.
    #[error("argument rule `{rule}` is not a valid glob: {why}")]
    BadRule {
        /// The pattern as written.
        rule: String,
        /// The glob parser's complaint.
        why: String,
    },
}

impl CommandRejection {
    /// The audit event that records this refusal.
    pub fn audit_event(&self, argv: &[String]) -> AuditEvent {
        let code = match self {
            CommandRejection::Empty
            | CommandRejection::Nul { .. }
            | CommandRejection::BadRule { .. } => ReasonCode::CommandInvalid,
            CommandRejection::NotAllowed { .. } => ReasonCode::CommandNotAllowed,
            CommandRejection::PathRejected { .. } => ReasonCode::CommandPathRejected,
            CommandRejection::ArgsDenied { .. } => ReasonCode::CommandArgsDenied,
        };
        let mut event = AuditEvent::new(Level::Error, code, self.to_string()).with(
            "argv",
            serde_json::Value::from(
                argv.iter()
                    .map(|a| a.replace('\0', "\\0"))
                    .collect::<Vec<_>>(),
            ),
        );
        if let CommandRejection::ArgsDenied { rule, .. } = self {
            event = event.with("rule", rule.as_str());
        }
        event
    }
}

/// Compiles argument deny patterns. `*` matches any characters, `/` and
/// spaces included.
pub fn compile_deny_args(rules: &[String]) -> Result<GlobSet, CommandRejection> {
    let mut builder = GlobSetBuilder::new();
    for rule in rules {
        let glob = GlobBuilder::new(rule)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| CommandRejection::BadRule {
                rule: rule.clone(),
                why: e.kind().to_string(),
            })?;
        builder.add(glob);
    }
    builder.build().map_err(|e| CommandRejection::BadRule {
        rule: String::from("(set)"),
        why: e.to_string(),
    })
}

/// Decides whether `argv` may run under `policy` (of profile `profile`).
pub fn check(
    policy: &CommandPolicy,
    profile: &str,
    argv: &[String],
) -> Result<CommandDecision, CommandRejection> {
    let command = argv.first().ok_or(CommandRejection::Empty)?;
    if let Some(index) = argv.iter().position(|a| a.contains('\0')) {
        return Err(CommandRejection::Nul { index });
    }
    let allowed = || policy.allow.join(", ");
    let decision = if command.contains('/') {
        match SandboxPath::new(command) {
            Ok(path) if policy.allow_paths => CommandDecision::Path(path),
            _ => {
                return Err(CommandRejection::PathRejected {
                    command: command.clone(),
                    profile: profile.to_string(),
                    allowed: allowed(),
                })
            }
        }
    } else if policy.allow.iter().any(|a| a == command) {
        CommandDecision::Named(command.clone())
    } else {
        return Err(CommandRejection::NotAllowed {
            command: command.clone(),
            profile: profile.to_string(),
            allowed: allowed(),
        });
    };
    if !policy.deny_args.is_empty() {
        let set = compile_deny_args(&policy.deny_args)?;
        let line = argv.join(" ");
        if let Some(&i) = set.matches(&line).first() {
            return Err(CommandRejection::ArgsDenied {
                rule: policy.deny_args[i].clone(),
                profile: profile.to_string(),
            });
        }
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow_paths: bool) -> CommandPolicy {
        CommandPolicy {
            allow: vec!["python3".into(), "sh".into()],
            allow_paths,
            deny_args: vec!["* -m pip *".into(), "*--inspect*".into()],
            search_path: vec![],
            restrict_exec: false,
        }
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn allowlist_and_paths() {
        let p = policy(false);
        assert_eq!(
            check(&p, "code", &argv(&["python3", "-c", "1"])).unwrap(),
            CommandDecision::Named("python3".into())
        );
        assert!(matches!(
            check(&p, "code", &argv(&["perl"])),
            Err(CommandRejection::NotAllowed { .. })
        ));
        assert!(matches!(
            check(&p, "code", &argv(&["/bin/sh"])),
            Err(CommandRejection::PathRejected { .. })
        ));
        assert!(matches!(
            check(&p, "code", &argv(&["./sh"])),
            Err(CommandRejection::PathRejected { .. })
        ));
        assert_eq!(
            check(&policy(true), "p", &argv(&["/bin/sh"])).unwrap(),
            CommandDecision::Path(SandboxPath::new("/bin/sh").unwrap())
        );
        assert!(check(&policy(true), "p", &argv(&["../sh"])).is_err());
        assert!(matches!(
            check(&p, "code", &[]),
            Err(CommandRejection::Empty)
        ));
        assert!(matches!(
            check(&p, "code", &argv(&["sh", "a\0b"])),
            Err(CommandRejection::Nul { index: 1 })
        ));
    }

    #[test]
    fn deny_patterns_match_the_whole_line() {
        let p = policy(false);
        let err = check(&p, "code", &argv(&["python3", "-m", "pip", "install", "x"])).unwrap_err();
        assert_eq!(
            err,
            CommandRejection::ArgsDenied {
                rule: "* -m pip *".into(),
                profile: "code".into()
            }
        );
        assert_eq!(
            err.audit_event(&argv(&["python3"])).code,
            ReasonCode::CommandArgsDenied
        );
        assert!(check(&p, "code", &argv(&["python3", "--inspect=0.0.0.0:9229"])).is_err());
        assert!(check(&p, "code", &argv(&["python3", "-m", "json.tool"])).is_ok());
    }
}
