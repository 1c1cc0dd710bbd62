//! Package sources (`npm:NAME@X.Y.Z`, `pypi:NAME==X.Y`): the source
//! directory corral writes for one (a `package.json` or a
//! `requirements.txt` pinning it, so the ordinary `node_install` and
//! `python_requirements` phases install it), the entry point of the
//! installed package, and what the manifest records of it.

use std::collections::BTreeMap;
use std::path::Path;

use corral_policy::{PackageKind, PackageSpec};
use serde::{Deserialize, Serialize};

use crate::detect::{package_json, read_text};
use crate::entry::{inside, node_entry, Entry};
use crate::error::DeployError;
use crate::tree::{sha256, write_new};

/// What the manifest records of a package deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageRecord {
    /// The spec as deployed (`npm:@scope/pkg@1.2.3`, `pypi:pkg==1.0`).
    pub spec: String,
    /// `npm` or `pypi`.
    pub kind: String,
    /// The package's name.
    pub name: String,
    /// Its exact version.
    pub version: String,
    /// npm: the package's `integrity` (the registry's `sha512-...` of its
    /// tarball, checked by npm); PyPI: `sha256:` of the installed
    /// distribution's `RECORD` (which holds the SHA-256 of every file it
    /// installed).
    pub integrity: String,
    /// The same for every package the install put in the tree, by
    /// `name@version` (npm) or `name==version` (PyPI).
    pub installed: BTreeMap<String, String>,
}

/// Writes the source of a package deployment into `dir`: for npm a
/// `package.json` depending on exactly that version, for PyPI a
/// `requirements.txt` of one line. Both are generated from a validated
/// [`PackageSpec`] (serde writes the JSON), never from raw text.
pub(crate) fn write_source(spec: &PackageSpec, dir: &Path) -> Result<(), DeployError> {
    match spec.kind {
        PackageKind::Npm => {
            let mut deps = serde_json::Map::new();
            deps.insert(spec.name.clone(), spec.version.clone().into());
            let pkg = serde_json::json!({
                "name": "corral-deployed-package",
                "version": "0.0.0",
                "private": true,
                "description": format!("corral deploy {spec}"),
                "dependencies": deps,
            });
            let text = serde_json::to_string_pretty(&pkg).unwrap_or_default() + "\n";
            write_new(&dir.join("package.json"), text.as_bytes())
        }
        PackageKind::Pypi => write_new(
            &dir.join("requirements.txt"),
            format!("{}=={}\n", spec.name, spec.version).as_bytes(),
        ),
    }
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` as one `-`.
fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if "-_.".contains(c) {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Every `.dist-info` directory of the venv's site-packages, with its
/// distribution name and version (from the directory's name).
pub(crate) fn dist_infos(tree: &Path, venv: &str) -> Vec<(String, String, std::path::PathBuf)> {
    let mut out = Vec::new();
    let Ok(libs) = std::fs::read_dir(tree.join(venv).join("lib")) else {
        return out;
    };
    for lib in libs.filter_map(|e| e.ok()) {
        let Ok(entries) = std::fs::read_dir(lib.path().join("site-packages")) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let n = e.file_name().to_string_lossy().to_string();
            if let Some((name, version)) = n
                .strip_suffix(".dist-info")
                .and_then(|stem| stem.split_once('-'))
            {
                out.push((name.to_string(), version.to_string(), e.path()));
            }
        }
    }
    out.sort();
    out
}

/// The `[section]` entries of an `entry_points.txt` (an INI file).
fn entry_points(text: &str, section: &str) -> Vec<String> {
    let mut inside_section = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside_section = line == format!("[{section}]");
        } else if inside_section && !line.starts_with('#') && !line.starts_with(';') {
            if let Some((name, _)) = line.split_once('=') {
                out.push(name.trim().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The entry point of the installed package: Python, a console script
/// (then a GUI script) of the distribution's `entry_points.txt` that the
/// install put in `VENV/bin` (the only one, else the one named after the
/// package, else the first by name); npm, the installed package's `bin`,
/// then `main`, then `index.js`, inside `node_modules/NAME`.
pub(crate) fn resolve_entry(
    spec: &PackageSpec,
    tree: &Path,
    venv: &str,
) -> Result<Entry, DeployError> {
    match spec.kind {
        PackageKind::Npm => {
            let dir = format!("node_modules/{}", spec.name);
            let pkg_dir = tree.join(&dir);
            if !std::fs::symlink_metadata(&pkg_dir).is_ok_and(|m| m.is_dir()) {
                return Err(DeployError::Entry(format!(
                    "{spec}: the install left no directory {dir} in the tree"
                )));
            }
            let version = package_json(&pkg_dir)?
                .and_then(|p| {
                    p.get("version")
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                })
                .unwrap_or_default();
            if version != spec.version {
                return Err(DeployError::Entry(format!(
                    "{spec}: the installed package is version `{}`, not {}",
                    version.escape_default(),
                    spec.version
                )));
            }
            match node_entry(&pkg_dir)? {
                Entry::Node { path, rule } => Ok(Entry::Node {
                    path: format!("{dir}/{path}"),
                    rule: format!("{}.{rule}", spec.name),
                }),
                other => Ok(other),
            }
        }
        PackageKind::Pypi => {
            let want = normalize(&spec.name);
            let (_, _, info) = dist_infos(tree, venv)
                .into_iter()
                .find(|(n, _, _)| normalize(n) == want)
                .ok_or_else(|| {
                    DeployError::Entry(format!(
                        "{spec}: the install put no distribution of that name in {venv}"
                    ))
                })?;
            let text = read_text(&info.join("entry_points.txt"))?.unwrap_or_default();
            for section in ["console_scripts", "gui_scripts"] {
                let names: Vec<String> = entry_points(&text, section)
                    .into_iter()
                    .filter(|n| inside(n).is_some_and(|n| !n.contains('/')))
                    .filter(|n| {
                        std::fs::symlink_metadata(tree.join(venv).join("bin").join(n))
                            .is_ok_and(|m| m.is_file())
                    })
                    .collect();
                let pick = if names.len() == 1 {
                    names.first()
                } else {
                    names
                        .iter()
                        .find(|n| normalize(n) == want)
                        .or_else(|| names.first())
                };
                if let Some(n) = pick {
                    return Ok(Entry::ConsoleScript {
                        name: n.clone(),
                        path: format!("{venv}/bin/{n}"),
                        rule: format!("entry_points.{section}"),
                    });
                }
            }
            Err(DeployError::Entry(format!(
                "{spec}: the package installs no console script (no [console_scripts] or [gui_scripts] in its entry_points.txt), so there is nothing to start; deploy a directory with a server.py that imports it instead"
            )))
        }
    }
}

/// What the manifest records: the spec and the hashes of what the install
/// resolved (npm: `package-lock.json`'s `integrity` of each package;
/// PyPI: the SHA-256 of each distribution's `RECORD`).
pub(crate) fn record(
    spec: &PackageSpec,
    tree: &Path,
    venv: &str,
) -> Result<PackageRecord, DeployError> {
    let mut installed = BTreeMap::new();
    match spec.kind {
        PackageKind::Npm => {
            let text = read_text(&tree.join("package-lock.json"))?.unwrap_or_default();
            let lock: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(pkgs) = lock.get("packages").and_then(|p| p.as_object()) {
                for (key, p) in pkgs {
                    let Some(name) = key.rsplit_once("node_modules/").map(|(_, n)| n) else {
                        continue;
                    };
                    let field = |f: &str| p.get(f).and_then(|v| v.as_str()).unwrap_or_default();
                    installed.insert(
                        format!("{name}@{}", field("version")),
                        field("integrity").to_string(),
                    );
                }
            }
        }
        PackageKind::Pypi => {
            for (name, version, info) in dist_infos(tree, venv) {
                let record = std::fs::read(info.join("RECORD")).unwrap_or_default();
                installed.insert(
                    format!("{name}=={version}"),
                    format!("sha256:{}", sha256(&record)),
                );
            }
        }
    }
    let key = match spec.kind {
        PackageKind::Npm => format!("{}@{}", spec.name, spec.version),
        PackageKind::Pypi => installed
            .keys()
            .find(|k| {
                k.split_once("==")
                    .is_some_and(|(n, _)| normalize(n) == normalize(&spec.name))
            })
            .cloned()
            .unwrap_or_default(),
    };
    let integrity = installed
        .get(&key)
        .filter(|i| !i.is_empty())
        .cloned()
        .ok_or_else(|| {
            DeployError::Entry(format!(
                "{spec}: the install recorded no integrity for it (package-lock.json or the dist's RECORD); refusing an unpinned tree"
            ))
        })?;
    Ok(PackageRecord {
        spec: spec.to_string(),
        kind: spec.kind.as_str().into(),
        name: spec.name.clone(),
        version: spec.version.clone(),
        integrity,
        installed,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::test_support::tree;

    #[test]
    fn generated_sources_pin_the_package() {
        let d = tempfile::tempdir().unwrap();
        let spec = PackageSpec::parse("npm:@acme/tool@1.2.3").unwrap();
        write_source(&spec, d.path()).unwrap();
        let pkg = package_json(d.path()).unwrap().unwrap();
        assert_eq!(pkg["dependencies"]["@acme/tool"], "1.2.3");
        let d = tempfile::tempdir().unwrap();
        write_source(
            &PackageSpec::parse("pypi:Weather_MCP==0.4").unwrap(),
            d.path(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("requirements.txt")).unwrap(),
            "Weather_MCP==0.4\n"
        );
    }

    #[test]
    fn python_entry_is_the_dists_console_script() {
        let spec = PackageSpec::parse("pypi:Weather_MCP==0.4").unwrap();
        let info = ".venv/lib/python3.11/site-packages/weather_mcp-0.4.dist-info";
        let t = tree(&[
            (
                &format!("{info}/entry_points.txt"),
                "[console_scripts]\nzz = a:b\nweather-mcp = weather_mcp:main\n[other]\nx = y\n",
            ),
            (&format!("{info}/RECORD"), "weather_mcp.py,sha256=x,1\n"),
            (".venv/bin/zz", ""),
            (".venv/bin/weather-mcp", ""),
        ]);
        let e = resolve_entry(&spec, t.path(), ".venv").unwrap();
        assert_eq!(
            e,
            Entry::ConsoleScript {
                name: "weather-mcp".into(),
                path: ".venv/bin/weather-mcp".into(),
                rule: "entry_points.console_scripts".into()
            }
        );
        let r = record(&spec, t.path(), ".venv").unwrap();
        assert_eq!(
            r.integrity,
            format!("sha256:{}", sha256(b"weather_mcp.py,sha256=x,1\n"))
        );
        assert!(r.installed.contains_key("weather_mcp==0.4"), "{r:?}");
        // No console script: nothing to start, said so.
        let t = tree(&[(&format!("{info}/RECORD"), "")]);
        let e = resolve_entry(&spec, t.path(), ".venv").unwrap_err();
        assert!(e.to_string().contains("no console script"), "{e}");
    }

    #[test]
    fn node_entry_is_inside_the_installed_package() {
        let spec = PackageSpec::parse("npm:@acme/tool@1.2.3").unwrap();
        let t = tree(&[
            (
                "node_modules/@acme/tool/package.json",
                r#"{"name":"@acme/tool","version":"1.2.3","bin":{"tool":"cli.js"}}"#,
            ),
            ("node_modules/@acme/tool/cli.js", ""),
            (
                "package-lock.json",
                r#"{"packages":{"":{},"node_modules/@acme/tool":{"version":"1.2.3","integrity":"sha512-abc"}}}"#,
            ),
        ]);
        let e = resolve_entry(&spec, t.path(), "").unwrap();
        assert_eq!(e.path(), "node_modules/@acme/tool/cli.js");
        let r = record(&spec, t.path(), "").unwrap();
        assert_eq!(r.integrity, "sha512-abc");
        let other = PackageSpec::parse("npm:@acme/tool@1.2.4").unwrap();
        let e = resolve_entry(&other, t.path(), "").unwrap_err();
        assert!(e.to_string().contains("not 1.2.4"), "{e}");
        let t = tree(&[(
            "node_modules/@acme/tool/package.json",
            r#"{"version":"1.2.3","main":"../../x.js"}"#,
        )]);
        let e = resolve_entry(&spec, t.path(), "").unwrap_err();
        assert!(e.to_string().contains("leaves the tree"), "{e}");
    }
}
