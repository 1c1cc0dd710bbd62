//! Commands corral suggests in its messages (`chown …`, `corral deploy
//! … --out DIR`) are meant to be copied into a shell. A path or name in
//! them comes from the user or the host and may hold a space, a quote or
//! `;`: [`word`] quotes it so that the pasted command acts on exactly that
//! path and nothing else.

use std::borrow::Cow;

/// `s` as one word of a POSIX shell command line: unchanged when every
/// character is one no shell treats specially (letters, digits and
/// `_ . / : = @ % + , -`, and not empty) and it does not start with `=`
/// (zsh expands `=cmd` to the command's path), else in single quotes, with
/// each `'` written `'\''`.
pub fn word(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c);
    if !s.is_empty() && !s.starts_with('=') && s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(format!("'{}'", s.replace('\'', r"'\''")))
}

/// Whether `path` (absolute) is the root, a top-level directory, a
/// directory of `/var` (`/var/tmp`, `/var/www`, …), or belongs to the
/// operating system (`/etc`, `/usr`, `/proc`, the Nix and Guix stores, …):
/// one whose owner or mode a message must never suggest changing.
pub fn is_system_path(path: &std::path::Path) -> bool {
    const SYSTEM: [&str; 18] = [
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/proc",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var/lib",
        "/var/log",
        "/var/cache",
        "/nix/store",
        "/gnu/store",
    ];
    let depth = path.components().count();
    depth <= 2
        || (depth == 3 && path.starts_with("/var"))
        || SYSTEM.iter().any(|s| path.starts_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_word_with_anything_a_shell_reads_is_single_quoted() {
        assert_eq!(word("/srv/project-1"), "/srv/project-1");
        assert_eq!(word("/srv/my project"), "'/srv/my project'");
        assert_eq!(word("/tmp/a;rm -rf ~"), "'/tmp/a;rm -rf ~'");
        assert_eq!(word("/tmp/it's"), r"'/tmp/it'\''s'");
        assert_eq!(word("$(id)"), "'$(id)'");
        assert_eq!(word("~/x"), "'~/x'");
        assert_eq!(word("=ls"), "'=ls'");
        assert_eq!(word("a\nb"), "'a\nb'");
        assert_eq!(word(""), "''");
    }

    #[test]
    fn the_root_top_level_and_system_directories_are_system_paths() {
        for p in [
            "/",
            "/etc",
            "/home",
            "/srv",
            "/usr/lib",
            "/var/lib/x",
            "/proc/1",
            "/var/tmp",
            "/var/www",
            "/nix/store/abc-pkg",
        ] {
            assert!(is_system_path(Path::new(p)), "{p}");
        }
        for p in [
            "/srv/project",
            "/home/me/code",
            "/var/tmp/work",
            "/opt/app/data",
        ] {
            assert!(!is_system_path(Path::new(p)), "{p}");
        }
    }
}
