//! From a `[[server.mcp_server]]` entry to the `corral run` command line
//! that starts it, resolved once at start-up: the tree and its entry must
//! exist, the interpreter must be one the profile allows and the sandbox
//! can see, a `.venv` in the tree supplies the interpreter, and every
//! declared variable must have a value. Secrets go in the child's
//! environment by name (`--env KEY`), never on a command line.

use std::path::{Path, PathBuf};

use corral_launcher::{CommandTable, Resolution};
use corral_policy::{Config, McpRuntime, McpServer, SandboxPath};

/// Why a server cannot start; its message says what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct LaunchRefused {
    /// Stable code: `mcp.dir_missing`, `mcp.dir_reserved`, `mcp.not_deployed`, `mcp.entry_missing`,
    /// `mcp.runtime_missing`, `mcp.env_missing`, `mcp.profile`, `host.unanswered`.
    pub code: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

/// The refusal of a server whose launch could not be resolved within
/// [`crate::host::START_WAIT`]: a path it needs does not answer.
pub fn unanswered(server: &McpServer) -> LaunchRefused {
    refused(
        corral_launcher::PlanGate::CODE,
        format!(
            "server `{}`: resolving its launch waited {} s on the host: a path it needs (its directory {}, its runtime or its profile's binds) does not answer (a network filesystem whose server is down?); check the mounts, then restart corral serve",
            server.name,
            crate::host::START_WAIT.as_secs(),
            server.dir.display()
        ),
    )
}

fn refused(code: &'static str, message: String) -> LaunchRefused {
    LaunchRefused { code, message }
}

/// What starts one process of a server (the same for each of its
/// instances but the host name).
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// `corral run` arguments up to (not including) the host name.
    pub run_args: Vec<String>,
    /// The program and its arguments inside the sandbox.
    pub command: Vec<String>,
    /// Declared variables and their values, passed in the environment.
    pub env: Vec<(String, String)>,
}

/// Resolves `server` against the host. `lookup` reads corral's own
/// environment (for declared keys without a configured value).
pub fn resolve(
    server: &McpServer,
    config: &Config,
    config_file: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<LaunchSpec, LaunchRefused> {
    let dir = &server.dir;
    if server.runtime == McpRuntime::Deployed && !dir.exists() {
        // Not deployed yet: say how.
        deployed(server)?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| {
        refused(
            "mcp.dir_missing",
            format!(
                "server `{}`: its tree {} cannot be read ({e}): install the server there (corral deploy builds such trees)",
                server.name,
                dir.display()
            ),
        )
    })?;
    if !meta.is_dir() {
        return Err(refused(
            "mcp.dir_missing",
            format!(
                "server `{}`: {} is not a directory (a symlink is not followed: give the resolved path)",
                server.name,
                dir.display()
            ),
        ));
    }
    // The tree is bound at its own path (its venv's scripts name it).
    if let Some(why) = sandbox_path(server, dir)
        .ok()
        .as_ref()
        .and_then(corral_policy::config::reserved_destination)
    {
        return Err(refused(
            "mcp.dir_reserved",
            format!(
                "server `{}`: its tree {} cannot be mounted at its own path ({why}): install it elsewhere, e.g. under /srv or /opt",
                server.name,
                dir.display()
            ),
        ));
    }
    let venv = [".venv", "venv"]
        .iter()
        .map(|v| dir.join(v))
        .find(|v| v.join("bin/python3").exists());
    // A deployed tree: its manifest says what runs, with which venv.
    let deployed = match server.runtime {
        McpRuntime::Deployed => Some(deployed(server)?),
        _ => None,
    };
    let (program, script) = match server.runtime {
        McpRuntime::Deployed => match &deployed {
            Some(d) => (d.program, inside(server, &d.script)?),
            None => return Err(refused("mcp.not_deployed", String::new())),
        },
        McpRuntime::Python3 => ("python3", inside(server, &dir.join(&server.entry))?),
        McpRuntime::Node => ("node", inside(server, &dir.join(&server.entry))?),
        McpRuntime::Npx => ("node", inside(server, &npm_bin(server)?)?),
        McpRuntime::Uvx => {
            let candidates = [venv.as_ref().map(|v| v.join("bin")), Some(dir.join("bin"))];
            let script = candidates
                .iter()
                .flatten()
                .map(|b| b.join(&server.entry))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    refused(
                        "mcp.entry_missing",
                        format!(
                            "server `{}`: no console script `{}` in {}/.venv/bin or {}/bin: install the package into the tree's venv",
                            server.name,
                            server.entry,
                            dir.display(),
                            dir.display()
                        ),
                    )
                })?;
            ("python3", inside(server, &script)?)
        }
    };
    let profile_name = match &deployed {
        Some(d) if server.profile.is_empty() => d.profile.to_string(),
        _ => server.profile.clone(),
    };
    let mut profile = config
        .profile(&profile_name)
        .map_err(|e| refused("mcp.profile", format!("server `{}`: {e}", server.name)))?
        .clone();
    let python = matches!(server.runtime, McpRuntime::Python3 | McpRuntime::Uvx)
        || (deployed.is_some() && program == "python3");
    let venv = match &deployed {
        Some(d) => d.venv.clone(),
        None => venv,
    };
    let runtime_tree = match (&venv, python) {
        (Some(v), true) => {
            let tree = sandbox_path(server, v)?;
            profile.set_runtime(tree).map_err(|e| {
                refused(
                    "mcp.runtime_missing",
                    format!("server `{}`: {}: {e}", server.name, v.display()),
                )
            })?;
            Some(v.clone())
        }
        _ => None,
    };
    let path = std::env::var("PATH").ok();
    let table = CommandTable::resolve(&profile, path.as_deref());
    match table.get(program) {
        Some(Resolution::Found(_)) => {}
        Some(Resolution::Missing(searched)) => {
            return Err(refused(
                "mcp.runtime_missing",
                format!(
                    "server `{}`: `{program}` is not installed where the sandbox can see it (searched {})",
                    server.name,
                    searched.join(", ")
                ),
            ))
        }
        None => {
            return Err(refused(
                "mcp.runtime_missing",
                format!(
                    "server `{}`: profile `{profile_name}` does not allow `{program}`: use a profile that does (mcp-python, mcp-node)",
                    server.name
                ),
            ))
        }
    }
    let mut env = Vec::new();
    for key in &server.env {
        let value = server
            .env_values
            .get(key)
            .cloned()
            .or_else(|| lookup(key))
            .ok_or_else(|| {
                refused(
                    "mcp.env_missing",
                    format!(
                        "server `{}` declares `{key}` but it has no value: set it in corral's environment or in [server.mcp_server.env_values]",
                        server.name
                    ),
                )
            })?;
        env.push((key.clone(), value));
    }
    let mut run_args: Vec<String> = vec!["run".into(), "--die-with-parent".into()];
    if let Some(f) = config_file {
        run_args.extend(["--config".into(), f.display().to_string()]);
    }
    run_args.extend(["--profile".into(), profile_name.clone()]);
    run_args.extend(["--ro".into(), dir.display().to_string()]);
    if let Some(v) = runtime_tree {
        run_args.extend(["--runtime".into(), v.display().to_string()]);
    }
    for (key, _) in &env {
        run_args.extend(["--env".into(), key.clone()]);
    }
    let mut command = vec![program.to_string(), script.display().to_string()];
    command.extend(server.args.iter().cloned());
    Ok(LaunchSpec {
        run_args,
        command,
        env,
    })
}

/// `path`, which must exist inside the server's tree (symlinks resolved).
fn inside(server: &McpServer, path: &Path) -> Result<PathBuf, LaunchRefused> {
    let missing = |e: std::io::Error| {
        refused(
            "mcp.entry_missing",
            format!(
                "server `{}`: entry {} cannot be found ({e})",
                server.name,
                path.display()
            ),
        )
    };
    let real = std::fs::canonicalize(path).map_err(missing)?;
    let root = std::fs::canonicalize(&server.dir).map_err(missing)?;
    if !real.starts_with(&root) || !real.is_file() {
        return Err(refused(
            "mcp.entry_missing",
            format!(
                "server `{}`: entry {} is not a file inside {}",
                server.name,
                path.display(),
                server.dir.display()
            ),
        ));
    }
    Ok(path.to_path_buf())
}

fn sandbox_path(server: &McpServer, p: &Path) -> Result<SandboxPath, LaunchRefused> {
    p.to_str()
        .and_then(|s| SandboxPath::new(s).ok())
        .ok_or_else(|| {
            refused(
                "mcp.dir_missing",
                format!(
                    "server `{}`: {} is not a usable path",
                    server.name,
                    p.display()
                ),
            )
        })
}

/// What a deployed tree's manifest says.
struct Deployed {
    program: &'static str,
    script: PathBuf,
    venv: Option<PathBuf>,
    profile: &'static str,
}

fn deployed(server: &McpServer) -> Result<Deployed, LaunchRefused> {
    let m = corral_deploy::Manifest::read(&server.dir).ok_or_else(|| {
        let how = if server.source.is_some() || server.package.is_some() {
            format!(
                "corral deploy --config FILE --server {}",
                corral_policy::shell::word(&server.name)
            )
        } else {
            format!(
                "corral deploy SOURCE --out {}",
                corral_policy::shell::word(&server.dir.display().to_string())
            )
        };
        refused(
            "mcp.not_deployed",
            format!(
                "server `{}`: {} has no valid {} (runtime \"deployed\" runs what corral deploy made): run `{how}`",
                server.name,
                server.dir.display(),
                corral_deploy::MANIFEST_FILE
            ),
        )
    })?;
    let argv = m.argv(&server.dir);
    let node = m.runtime == "node";
    Ok(Deployed {
        program: if node { "node" } else { "python3" },
        script: PathBuf::from(argv.get(1).cloned().unwrap_or_default()),
        venv: m.runtime_dir(&server.dir),
        profile: if node { "mcp-node" } else { "mcp-python" },
    })
}

/// The file an npm package in `DIR/node_modules` runs: its `bin` (the one
/// named like the package, or the only one), else `main`, else `index.js`.
fn npm_bin(server: &McpServer) -> Result<PathBuf, LaunchRefused> {
    let pkg = server.dir.join("node_modules").join(&server.entry);
    let manifest = pkg.join("package.json");
    let text = std::fs::read_to_string(&manifest).map_err(|e| {
        refused(
            "mcp.entry_missing",
            format!(
                "server `{}`: package `{}` is not installed in {}/node_modules ({e}): install it into the tree first (never at serve time)",
                server.name,
                server.entry,
                server.dir.display()
            ),
        )
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        refused(
            "mcp.entry_missing",
            format!("server `{}`: {}: {e}", server.name, manifest.display()),
        )
    })?;
    let base = server.entry.rsplit('/').next().unwrap_or(&server.entry);
    let rel = match &json["bin"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(m) => m
            .get(base)
            .or_else(|| (m.len() == 1).then(|| m.values().next()).flatten())
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        _ => None,
    }
    .or_else(|| json["main"].as_str().map(str::to_owned))
    .unwrap_or_else(|| "index.js".into());
    Ok(pkg.join(rel))
}
