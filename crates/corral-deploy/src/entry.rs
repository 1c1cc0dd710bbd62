//! Entry-point resolution in seed 000's order, against the built tree, so
//! the supervisor never guesses at serve time.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::detect::{package_json, pyproject, Runtime};
use crate::error::DeployError;

/// How a deployed tree's program is started. Paths are relative to the
/// tree's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A console script of the venv (`[project.scripts]` or
    /// `[project.gui-scripts]`): run `path` (`.venv/bin/NAME`), whose `#!`
    /// line names the venv's interpreter.
    ConsoleScript {
        /// The script's name.
        name: String,
        /// `.venv/bin/NAME`.
        path: String,
        /// `project.scripts` or `project.gui-scripts`.
        rule: String,
    },
    /// A `__main__.py`: `python3 PATH` with the venv's interpreter.
    Module {
        /// `__main__.py` or `src/__main__.py`.
        path: String,
        /// The file name rule that found it.
        rule: String,
    },
    /// A script file: `python3 PATH` with the venv's interpreter.
    Script {
        /// `server.py`, `main.py`, `app.py` or `run.py`.
        path: String,
        /// The file name rule that found it.
        rule: String,
    },
    /// A Node program: `node PATH`.
    Node {
        /// From `bin`, `main`, or `index.js`.
        path: String,
        /// `bin`, `main` or `index.js`.
        rule: String,
    },
}

impl Entry {
    /// The path of the file that starts, relative to the tree.
    pub fn path(&self) -> &str {
        match self {
            Entry::ConsoleScript { path, .. }
            | Entry::Module { path, .. }
            | Entry::Script { path, .. }
            | Entry::Node { path, .. } => path,
        }
    }
}

/// The Python file fallbacks, in order after the scripts tables.
const PYTHON_FILES: &[(&str, bool)] = &[
    ("__main__.py", true),
    ("src/__main__.py", true),
    ("server.py", false),
    ("main.py", false),
    ("app.py", false),
    ("run.py", false),
];

fn is_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

/// A relative path that stays inside the tree: no `..`, not absolute, no
/// empty or `.` components. Returns it normalised (no leading `./`).
pub(crate) fn inside(path: &str) -> Option<String> {
    let p = path.strip_prefix("./").unwrap_or(path);
    if p.is_empty() || p.starts_with('/') || p.chars().any(|c| c.is_control()) {
        return None;
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return None;
    }
    Some(p.to_string())
}

/// Picks one name of a scripts table: the only one, else the one named
/// after the project, else the first by name.
fn pick<'a>(names: &[&'a String], project: Option<&str>) -> Option<&'a String> {
    if names.len() == 1 {
        return names.first().copied();
    }
    let norm = |s: &str| s.to_ascii_lowercase().replace(['_', '.'], "-");
    project
        .and_then(|p| names.iter().find(|n| norm(n) == norm(p)).copied())
        .or_else(|| names.first().copied())
}

fn python(tree: &Path, venv: &str) -> Result<Entry, DeployError> {
    let py = pyproject(tree)?;
    let project = py
        .as_ref()
        .and_then(|p| p.get("project"))
        .and_then(|p| p.as_table());
    let name = project.and_then(|p| p.get("name")).and_then(|n| n.as_str());
    for rule in ["scripts", "gui-scripts"] {
        let Some(table) = project.and_then(|p| p.get(rule)).and_then(|t| t.as_table()) else {
            continue;
        };
        let names: Vec<&String> = table.keys().collect();
        // Only a script the install phase really put in the venv counts: a
        // script project's tables are not installed.
        let installed: Vec<&String> = names
            .iter()
            .copied()
            .filter(|n| inside(n).is_some_and(|n| !n.contains('/')))
            .filter(|n| is_file(&tree.join(venv).join("bin").join(n)))
            .collect();
        if let Some(n) = pick(&installed, name) {
            return Ok(Entry::ConsoleScript {
                name: n.clone(),
                path: format!("{venv}/bin/{n}"),
                rule: format!("project.{rule}"),
            });
        }
    }
    for (file, module) in PYTHON_FILES {
        if is_file(&tree.join(file)) {
            let path = (*file).to_string();
            let rule = (*file).to_string();
            return Ok(if *module {
                Entry::Module { path, rule }
            } else {
                Entry::Script { path, rule }
            });
        }
    }
    Err(DeployError::Entry(
        "no entry point: the tree has no installed [project.scripts] or [project.gui-scripts] script, and none of __main__.py, src/__main__.py, server.py, main.py, app.py, run.py".into(),
    ))
}

/// Node's rules in the package directory `tree`: `bin`, `main`, `index.js`.
pub(crate) fn node_entry(tree: &Path) -> Result<Entry, DeployError> {
    let pkg = package_json(tree)?.unwrap_or_default();
    let name = pkg.get("name").and_then(|n| n.as_str());
    let check = |path: &str, rule: &str| -> Result<Option<Entry>, DeployError> {
        let rel = inside(path).ok_or_else(|| {
            DeployError::Entry(format!(
                "package.json `{rule}` is `{}`, which leaves the tree; name a file inside it",
                path.escape_default()
            ))
        })?;
        if !is_file(&tree.join(&rel)) {
            return Err(DeployError::Entry(format!(
                "package.json `{rule}` names {rel}, which the tree does not have after the build; build it (a `build` script) or fix the path"
            )));
        }
        Ok(Some(Entry::Node {
            path: rel,
            rule: rule.to_string(),
        }))
    };
    match pkg.get("bin") {
        Some(serde_json::Value::String(s)) => {
            if let Some(e) = check(s, "bin")? {
                return Ok(e);
            }
        }
        Some(serde_json::Value::Object(m)) if !m.is_empty() => {
            let names: Vec<&String> = m.keys().collect();
            let short = name.map(|n| n.rsplit('/').next().unwrap_or(n));
            let key = pick(&names, short).cloned().unwrap_or_default();
            let path = m.get(&key).and_then(|v| v.as_str()).unwrap_or_default();
            if let Some(e) = check(path, &format!("bin.{key}"))? {
                return Ok(e);
            }
        }
        _ => {}
    }
    if let Some(main) = pkg.get("main").and_then(|m| m.as_str()) {
        if let Some(e) = check(main, "main")? {
            return Ok(e);
        }
    }
    if is_file(&tree.join("index.js")) {
        return Ok(Entry::Node {
            path: "index.js".into(),
            rule: "index.js".into(),
        });
    }
    Err(DeployError::Entry(
        "no entry point: package.json has no `bin` or `main`, and there is no index.js".into(),
    ))
}

/// Resolves the entry point of a built tree: for Python
/// `[project.scripts]`, `[project.gui-scripts]` (installed in `venv`),
/// `__main__.py`, `src/__main__.py`, `server.py`, `main.py`, `app.py`,
/// `run.py`; for Node `bin`, then `main`, then `index.js`. The file must
/// exist in the tree.
pub fn resolve_entry(tree: &Path, runtime: Runtime, venv: &str) -> Result<Entry, DeployError> {
    match runtime {
        Runtime::Python3 => python(tree, venv),
        Runtime::Node => node_entry(tree),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::test_support::tree;

    fn py(files: &[(&str, &str)]) -> Entry {
        resolve_entry(tree(files).path(), Runtime::Python3, ".venv").unwrap()
    }

    #[test]
    fn python_rules_in_order() {
        let toml = "[project]\nname = \"w-x\"\n[project.scripts]\nother = \"a:b\"\nw-x = \"a:main\"\n[project.gui-scripts]\ng = \"a:g\"\n";
        let e = py(&[
            ("pyproject.toml", toml),
            (".venv/bin/other", ""),
            (".venv/bin/w-x", ""),
            ("server.py", ""),
        ]);
        assert_eq!(
            e,
            Entry::ConsoleScript {
                name: "w-x".into(),
                path: ".venv/bin/w-x".into(),
                rule: "project.scripts".into()
            }
        );
        // Scripts not installed in the venv do not count; gui-scripts next.
        let e = py(&[
            ("pyproject.toml", toml),
            (".venv/bin/g", ""),
            ("server.py", ""),
        ]);
        assert_eq!(e.path(), ".venv/bin/g");
        let mut files = vec![
            ("__main__.py", ""),
            ("src/__main__.py", ""),
            ("server.py", ""),
            ("main.py", ""),
            ("app.py", ""),
            ("run.py", ""),
        ];
        for want in [
            "__main__.py",
            "src/__main__.py",
            "server.py",
            "main.py",
            "app.py",
            "run.py",
        ] {
            let e = py(&files);
            assert_eq!(e.path(), want);
            let module = want.ends_with("__main__.py");
            assert_eq!(matches!(e, Entry::Module { .. }), module, "{e:?}");
            files.remove(0);
        }
        let e = resolve_entry(tree(&[("x.py", "")]).path(), Runtime::Python3, ".venv").unwrap_err();
        assert_eq!(e.code(), "deploy.entry");
        // The manifest's JSON form.
        let j = serde_json::to_value(Entry::Script {
            path: "server.py".into(),
            rule: "server.py".into(),
        })
        .unwrap();
        assert_eq!(j["kind"], "script");
        assert_eq!(j["path"], "server.py");
    }

    #[test]
    fn node_rules_in_order() {
        let n = |files: &[(&str, &str)]| resolve_entry(tree(files).path(), Runtime::Node, "");
        let e = n(&[
            (
                "package.json",
                r#"{"name":"@s/app","bin":{"zz":"z.js","app":"bin/app.js"},"main":"m.js"}"#,
            ),
            ("bin/app.js", ""),
            ("m.js", ""),
        ])
        .unwrap();
        assert_eq!(
            e,
            Entry::Node {
                path: "bin/app.js".into(),
                rule: "bin.app".into()
            }
        );
        let e = n(&[
            ("package.json", r#"{"bin":"./cli.js","main":"m.js"}"#),
            ("cli.js", ""),
        ])
        .unwrap();
        assert_eq!(e.path(), "cli.js");
        let e = n(&[
            ("package.json", r#"{"main":"dist/index.js"}"#),
            ("dist/index.js", ""),
        ])
        .unwrap();
        assert_eq!(
            e,
            Entry::Node {
                path: "dist/index.js".into(),
                rule: "main".into()
            }
        );
        let e = n(&[("package.json", "{}"), ("index.js", "")]).unwrap();
        assert_eq!(e.path(), "index.js");
        let e = n(&[("package.json", r#"{"main":"../x.js"}"#)]).unwrap_err();
        assert!(e.to_string().contains("leaves the tree"), "{e}");
        let e = n(&[("package.json", r#"{"main":"dist/index.js"}"#)]).unwrap_err();
        assert!(e.to_string().contains("does not have"), "{e}");
        assert_eq!(
            n(&[("package.json", "{}")]).unwrap_err().code(),
            "deploy.entry"
        );
    }
}
