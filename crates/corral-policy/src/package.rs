//! Package sources of `corral deploy`: `npm:NAME@VERSION` and
//! `pypi:NAME==VERSION`, pinned to one exact version and with names
//! checked against each registry's grammar, so nothing untrusted reaches
//! a shell script or a generated `package.json`/`requirements.txt`.

use std::fmt;

use serde::Serialize;

/// Which registry a package comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageKind {
    /// The npm registry (`npm:`).
    Npm,
    /// A Python package index (`pypi:`).
    Pypi,
}

impl PackageKind {
    /// `npm` or `pypi`.
    pub fn as_str(self) -> &'static str {
        match self {
            PackageKind::Npm => "npm",
            PackageKind::Pypi => "pypi",
        }
    }
}

/// A package pinned to one exact version: `npm:@scope/pkg@1.2.3` or
/// `pypi:pkg==1.0`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PackageSpec {
    /// The registry.
    pub kind: PackageKind,
    /// The name as written (npm: `@scope/name` or `name`, lower case; PyPI:
    /// a PEP 508 name).
    pub name: String,
    /// The exact version (npm: a semantic version; PyPI: a PEP 440
    /// version).
    pub version: String,
}

/// Why a package spec was refused: the message says what, why and what to
/// write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("package `{spec}`: {reason}")]
pub struct PackageError {
    /// The spec as given (control characters escaped).
    pub spec: String,
    /// What is wrong and what to do.
    pub reason: String,
}

impl fmt::Display for PackageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PackageKind::Npm => write!(f, "npm:{}@{}", self.name, self.version),
            PackageKind::Pypi => write!(f, "pypi:{}=={}", self.name, self.version),
        }
    }
}

const PIN: &str = "a deployed tree is pinned: ranges, tags and `latest` would install whatever the registry serves that day";

impl PackageSpec {
    /// Parses `npm:NAME@VERSION` or `pypi:NAME==VERSION`. Refused: another
    /// prefix, a name outside the registry's grammar, a missing version,
    /// and anything but one exact version (ranges, wildcards, tags,
    /// `latest`, `===`, extras, markers).
    pub fn parse(text: &str) -> Result<PackageSpec, PackageError> {
        let bad = |reason: String| PackageError {
            spec: text.escape_default().to_string(),
            reason,
        };
        if text.len() > 512 {
            return Err(bad("longer than 512 bytes".into()));
        }
        if let Some(rest) = text.strip_prefix("npm:") {
            let (name, version) = match rest.rsplit_once('@') {
                Some((n, v)) if !n.is_empty() => (n, v),
                _ => {
                    return Err(bad(format!(
                        "no version: write npm:{rest}@X.Y.Z with the exact version ({PIN})"
                    )))
                }
            };
            check_npm_name(name)
                .map_err(|why| bad(format!("`{name}` is not an npm package name: {why}")))?;
            if !is_semver(version) {
                return Err(bad(format!(
                    "`{}` is not an exact version: write npm:{name}@X.Y.Z ({PIN})",
                    version.escape_default()
                )));
            }
            return Ok(PackageSpec {
                kind: PackageKind::Npm,
                name: name.to_string(),
                version: version.to_string(),
            });
        }
        if let Some(rest) = text.strip_prefix("pypi:") {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
                .unwrap_or(rest.len());
            let (name, tail) = rest.split_at(end);
            check_pep508_name(name).map_err(|why| {
                bad(format!(
                    "`{}` is not a Python package name (PEP 508): {why}",
                    name.escape_default()
                ))
            })?;
            let version = match tail.strip_prefix("==") {
                Some(v) if !v.starts_with('=') => v,
                _ if tail.starts_with('[') => {
                    return Err(bad(
                        "extras are not supported: deploy the package itself, pypi:NAME==X.Y"
                            .into(),
                    ))
                }
                _ => {
                    return Err(bad(format!(
                        "not one exact version: write pypi:{name}==X.Y ({PIN})"
                    )))
                }
            };
            if !is_pep440(version) {
                return Err(bad(format!(
                    "`{}` is not an exact version: write pypi:{name}==X.Y, no wildcard, marker or range ({PIN})",
                    version.escape_default()
                )));
            }
            return Ok(PackageSpec {
                kind: PackageKind::Pypi,
                name: name.to_string(),
                version: version.to_string(),
            });
        }
        Err(bad(
            "write npm:NAME@X.Y.Z or pypi:NAME==X.Y (a registry prefix and one exact version)"
                .into(),
        ))
    }
}

/// npm's grammar for new packages: `name` or `@scope/name`, at most 214
/// bytes, lower case letters, digits and `-._~`, neither part starting
/// with `.` or `_`.
fn check_npm_name(name: &str) -> Result<(), String> {
    if name.len() > 214 {
        return Err("longer than 214 bytes".into());
    }
    let part = |p: &str| -> Result<(), String> {
        if p.is_empty() {
            return Err("an empty part".into());
        }
        if p.starts_with('.') || p.starts_with('_') {
            return Err("a part may not start with `.` or `_`".into());
        }
        if let Some(c) = p
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-._~".contains(*c)))
        {
            return Err(format!(
                "`{}` is not allowed (lower case letters, digits and -._~ only)",
                c.escape_default()
            ));
        }
        Ok(())
    };
    match name.strip_prefix('@') {
        Some(scoped) => {
            let (scope, pkg) = scoped
                .split_once('/')
                .ok_or("a scoped name is @scope/name")?;
            part(scope)?;
            part(pkg)
        }
        None => {
            part(name)?;
            if name == "node_modules" || name == "favicon.ico" {
                return Err("a reserved name".into());
            }
            Ok(())
        }
    }
}

/// PEP 508: letters and digits, with `.`, `_` and `-` inside.
fn check_pep508_name(name: &str) -> Result<(), String> {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() {
        return Err("no name".into());
    }
    if !ends(name.chars().next()) || !ends(name.chars().last()) {
        return Err("it must start and end with a letter or digit".into());
    }
    if name.len() > 200 {
        return Err("longer than 200 bytes".into());
    }
    Ok(())
}

/// A number without a leading zero.
fn numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

/// One exact semantic version: `MAJOR.MINOR.PATCH[-PRE][+BUILD]`.
fn is_semver(v: &str) -> bool {
    let (v, build) = match v.split_once('+') {
        Some((a, b)) => (a, Some(b)),
        None => (v, None),
    };
    let (core, pre) = match v.split_once('-') {
        Some((a, b)) => (a, Some(b)),
        None => (v, None),
    };
    let ids = |s: &str| {
        s.split('.')
            .all(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(ids)
        && build.is_none_or(ids)
}

/// One exact PEP 440 version: `[N!]N(.N)*[{a|b|rc}N][.postN][.devN][+LOCAL]`.
fn is_pep440(v: &str) -> bool {
    let (v, local) = match v.split_once('+') {
        Some((a, b)) => (a, Some(b)),
        None => (v, None),
    };
    if local.is_some_and(|l| {
        l.is_empty()
            || !l
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()))
    }) {
        return false;
    }
    let v = v.to_ascii_lowercase();
    let v = match v.split_once('!') {
        Some((e, rest)) if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) => {
            rest.to_string()
        }
        Some(_) => return false,
        None => v,
    };
    let release_end = v
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || (c == '.' && v[i + 1..].starts_with(|d: char| d.is_ascii_digit())))
        })
        .map(|(i, _)| i)
        .unwrap_or(v.len());
    let (release, mut rest) = v.split_at(release_end);
    if release.is_empty() || release.split('.').any(|p| p.is_empty()) {
        return false;
    }
    for tag in ["a", "b", "rc", "post", "dev"] {
        let r = rest.strip_prefix('.').unwrap_or(rest);
        if let Some(after) = r.strip_prefix(tag) {
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return false;
            }
            rest = &after[digits..];
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pinned_specs_parse() {
        let s = PackageSpec::parse("npm:@scope/my-pkg@1.2.3").unwrap();
        assert_eq!(
            (s.kind, s.name.as_str(), s.version.as_str()),
            (PackageKind::Npm, "@scope/my-pkg", "1.2.3")
        );
        assert_eq!(s.to_string(), "npm:@scope/my-pkg@1.2.3");
        let s = PackageSpec::parse("npm:left-pad@1.3.0-beta.1+b7").unwrap();
        assert_eq!(s.version, "1.3.0-beta.1+b7");
        let s = PackageSpec::parse("pypi:My_Pkg.x==1.0").unwrap();
        assert_eq!((s.kind, s.name.as_str()), (PackageKind::Pypi, "My_Pkg.x"));
        assert_eq!(s.to_string(), "pypi:My_Pkg.x==1.0");
        for v in [
            "2024.1",
            "1.0rc1",
            "1.0.post2",
            "1!2.0.dev3",
            "1.0a1.post1",
            "1.0+local.7",
        ] {
            PackageSpec::parse(&format!("pypi:x=={v}")).unwrap();
        }
    }

    #[test]
    fn unpinned_specs_are_refused_saying_so() {
        for spec in [
            "npm:pkg",
            "npm:pkg@latest",
            "npm:pkg@^1.2.3",
            "npm:pkg@~1.2.3",
            "npm:pkg@1.2",
            "npm:pkg@1.x",
            "npm:pkg@>=1.0.0",
            "npm:pkg@01.2.3",
            "npm:@scope/pkg",
            "pypi:pkg",
            "pypi:pkg>=1.0",
            "pypi:pkg~=1.0",
            "pypi:pkg==1.*",
            "pypi:pkg===1.0",
            "pypi:pkg==1.0,<2",
            "pypi:pkg==1.0; python_version<'3'",
            "pypi:pkg==",
        ] {
            let e = PackageSpec::parse(spec).unwrap_err();
            assert!(
                e.reason.contains("pinned") || e.reason.contains("exact version"),
                "{spec}: {e}"
            );
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for spec in [
            "npm:Upper@1.0.0",
            "npm:.hidden@1.0.0",
            "npm:_x@1.0.0",
            "npm:a b@1.0.0",
            "npm:$(id)@1.0.0",
            "npm:a;rm@1.0.0",
            "npm:@scope@1.0.0",
            "npm:@/x@1.0.0",
            "npm:a/b@1.0.0",
            "npm:node_modules@1.0.0",
            "npm:'x'@1.0.0",
            "pypi:-x==1.0",
            "pypi:x-==1.0",
            "pypi:$(id)==1.0",
            "pypi:x[extra]==1.0",
            "pypi:x @ http://h/x.whl",
            "pypi:==1.0",
            "pip:x==1.0",
            "x==1.0",
        ] {
            let e = PackageSpec::parse(spec).unwrap_err();
            assert!(!e.reason.is_empty(), "{spec}");
        }
        let long = format!("npm:{}@1.0.0", "a".repeat(215));
        assert!(PackageSpec::parse(&long).is_err());
    }
}
