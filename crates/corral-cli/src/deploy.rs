//! `corral deploy`: flags in, [`corral_deploy::deploy`], a report out.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use corral_deploy::{DeployOptions, DeploySource, Registry, RegistryToken, Runtime};
use corral_launcher::{EventSink, EventWriter, HelperStart, NoEvents, RunStamp, EXIT_CORRAL_ERROR};
use corral_policy::network::{normalize_host, Cidr, DomainRule};
use corral_policy::PackageSpec;

/// Arguments of `corral deploy`.
#[derive(Args)]
pub struct DeployArgs {
    /// The source directory (read, never written); with --server, the
    /// server's `source`.
    #[arg(required_unless_present_any = ["server", "package"], conflicts_with = "package")]
    source: Option<PathBuf>,
    /// Deploy a package pinned to one exact version instead of a
    /// directory: `npm:NAME@X.Y.Z` (`npm:@scope/name@X.Y.Z`) or
    /// `pypi:NAME==X.Y`, fetched from --npm-registry / --index-url in the
    /// install phase. Ranges, tags and `latest` are refused.
    #[arg(long, value_name = "SPEC")]
    package: Option<String>,
    /// The tree to create (or replace): absolute or relative, not under
    /// /tmp, /proc or /dev; its parent must exist. With --server, the
    /// server's `dir`.
    #[arg(long, value_name = "TREE", required_unless_present = "server")]
    out: Option<PathBuf>,
    /// Deploy the `[[server.mcp_server]]` entry NAME of --config (runtime
    /// "deployed"): its `source` into its `dir`, which `corral serve` then
    /// runs.
    #[arg(long, value_name = "NAME", requires = "config")]
    server: Option<String>,
    /// Deploy as this runtime only: python3 or node (needed when the
    /// source looks like both).
    #[arg(long, value_name = "python3|node")]
    runtime: Option<String>,
    /// Config file: its `install` and `build` profiles (or the ones named
    /// below) are the phases' base.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Profile of the install phase.
    #[arg(long, default_value = "install", value_name = "NAME")]
    install_profile: String,
    /// Profile of the build phase.
    #[arg(long, default_value = "build", value_name = "NAME")]
    build_profile: String,
    /// The Python package index (PEP 503 simple), for pip and uv. Naming a
    /// registry replaces the public ones: the install phase reaches only
    /// the registries named.
    #[arg(long, value_name = "URL")]
    index_url: Option<String>,
    /// The npm registry.
    #[arg(long, value_name = "URL")]
    npm_registry: Option<String>,
    /// One more domain the install phase may reach, `NAME[:PORT,...]`.
    #[arg(long = "allow-domain", value_name = "PATTERN[:PORT,...]")]
    allow_domain: Vec<String>,
    /// A network the proxy may dial although it is refused by default
    /// (loopback, private: a local registry), `CIDR[:PORT,...]`.
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORT,...]")]
    allow_cidr: Vec<String>,
    /// A static host entry for the proxy, NAME=IP.
    #[arg(long = "add-host", value_name = "NAME=IP")]
    add_host: Vec<String>,
    /// Let npm run lifecycle scripts (preinstall, install, postinstall,
    /// prepare) in the install phase; by default it runs with
    /// --ignore-scripts.
    #[arg(long)]
    allow_lifecycle_scripts: bool,
    /// uv's path, for Python installs (`uv sync --no-dev`, `uv pip
    /// install`) instead of pip; bound read-only into the install phase.
    /// Default: `uv` in /usr/local/bin, /usr/bin or /bin if present.
    #[arg(long, value_name = "PATH")]
    uv: Option<PathBuf>,
    /// Directories searched for python3 and python3.N (default:
    /// /usr/local/bin, /usr/bin, /bin).
    #[arg(long = "python-search", value_name = "DIR")]
    python_search: Vec<PathBuf>,
    /// The newest Python series treated as stable (default 3.14); newer
    /// ones and pre-releases are used only when nothing else fits.
    #[arg(long, value_name = "X.Y")]
    python_newest_stable: Option<String>,
    /// The install phase's HOME, kept across deployments (warm pip and
    /// npm caches). Share it only among sources you trust alike: a hostile
    /// install can leave things in it. Default: a fresh HOME every time.
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// A PEM bundle of CA certificates the install phase trusts (a
    /// TLS-intercepting network, a registry with a private CA); default:
    /// `[deploy] ca_bundle` of --config.
    #[arg(long, value_name = "FILE")]
    ca_bundle: Option<PathBuf>,
    /// The most disk space the tree may take, e.g. `500MiB` (default:
    /// `[deploy] max_tree_bytes` of --config, else 1GiB). A phase that
    /// writes more is stopped and nothing is deployed.
    #[arg(long, value_name = "SIZE")]
    max_tree_bytes: Option<String>,
    /// Each phase's wall-clock limit in seconds (default: the profile's).
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Run the phases even if this host cannot enforce the profiles'
    /// cgroup limits.
    #[arg(long = "allow-unenforced-limits")]
    allow_unenforced_limits: bool,
    /// Print one JSON object: `ok`, `noop`, `out`, `manifest`, `phases`
    /// (each phase's audit record) or `error`.
    #[arg(long)]
    json: bool,
    /// Append every event of every phase (JSON lines) to this file;
    /// without it security events go to stderr.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
}

fn options(args: &DeployArgs) -> Result<DeployOptions, (String, String)> {
    let cfg = |m: String| ("config.invalid".to_string(), m);
    let req = |m: String| ("request.invalid".to_string(), m);
    let config = crate::load_config(args.config.as_deref()).map_err(|e| cfg(e.to_string()))?;
    let profile = |name: &str| {
        config
            .profile(name)
            .cloned()
            .map_err(|e| ("config.unknown_profile".to_string(), e.to_string()))
    };
    let runtime = args
        .runtime
        .as_deref()
        .map(str::parse::<Runtime>)
        .transpose()
        .map_err(|e| req(e.to_string()))?;
    let registry = |flag: &str, url: &Option<String>| {
        url.as_deref()
            .map(|u| Registry::parse(flag, u))
            .transpose()
            .map_err(|e| req(e.to_string()))
    };
    let mut allow_domains = Vec::new();
    for d in &args.allow_domain {
        allow_domains.push(DomainRule::parse(d).map_err(|e| req(format!("--allow-domain: {e}")))?);
    }
    let mut allow_cidrs = Vec::new();
    for c in &args.allow_cidr {
        allow_cidrs.push(Cidr::parse(c).map_err(|e| req(format!("--allow-cidr: {e}")))?);
    }
    let mut hosts = std::collections::BTreeMap::new();
    for h in &args.add_host {
        let (name, ip) = h
            .split_once('=')
            .ok_or_else(|| req(format!("--add-host {h}: write NAME=IP")))?;
        let name = normalize_host(name)
            .ok_or_else(|| req(format!("--add-host {h}: `{name}` is not a host name")))?;
        let ip = ip
            .parse()
            .map_err(|_| req(format!("--add-host {h}: `{ip}` is not an IP address")))?;
        hosts.insert(name, ip);
    }
    let newest_stable = match &args.python_newest_stable {
        None => corral_deploy::NEWEST_STABLE,
        Some(v) => v
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| {
                req(format!(
                    "--python-newest-stable {v}: write MAJOR.MINOR, e.g. 3.13"
                ))
            })?,
    };
    if let Some(t) = args.timeout {
        corral_policy::RunLimit::Timeout
            .check(t)
            .map_err(|e| req(format!("--timeout {e}")))?;
    }
    let (source, out) = targets(args, &config).map_err(req)?;
    let index_url = registry("--index-url", &args.index_url)?;
    let npm_registry = registry("--npm-registry", &args.npm_registry)?;
    let registry_tokens =
        tokens(&config, [index_url.as_ref(), npm_registry.as_ref()]).map_err(cfg)?;
    Ok(DeployOptions {
        source,
        out,
        runtime,
        install_profile: profile(&args.install_profile)?,
        build_profile: profile(&args.build_profile)?,
        index_url,
        npm_registry,
        ca_bundle: match &args.ca_bundle {
            Some(p) => Some(std::path::absolute(p).map_err(|e| req(format!("--ca-bundle: {e}")))?),
            None => config.deploy.ca_bundle.clone(),
        },
        registry_tokens,
        allow_domains,
        allow_cidrs,
        hosts,
        lifecycle_scripts: args.allow_lifecycle_scripts,
        uv: args.uv.clone(),
        python_search: if args.python_search.is_empty() {
            corral_deploy::PYTHON_SEARCH
                .iter()
                .map(PathBuf::from)
                .collect()
        } else {
            args.python_search.clone()
        },
        newest_stable,
        cache: args
            .cache
            .as_ref()
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| req(format!("--cache: {e}")))?,
        max_tree_bytes: match &args.max_tree_bytes {
            None => config.deploy.max_tree_bytes.bytes(),
            Some(t) => corral_policy::ByteSize::parse(t)
                .map_err(|e| req(format!("--max-tree-bytes {t}: {e}")))?
                .bytes(),
        },
        timeout_secs: args.timeout,
        allow_unenforced_limits: args.allow_unenforced_limits,
        // Each phase runs next to a thread watching the tree's size, so the
        // helper is re-executed (forking is only for single-threaded
        // callers).
        helper: HelperStart::ReExec,
    })
}

/// The tokens of `[[deploy.registry_auth]]` entries for the registries in
/// use (same scheme, host and port), read from corral's environment by
/// the variable each names.
fn tokens(
    config: &corral_policy::Config,
    in_use: [Option<&Registry>; 2],
) -> Result<Vec<RegistryToken>, String> {
    let mut out = Vec::new();
    for auth in &config.deploy.registry_auth {
        let r = Registry::parse("deploy.registry_auth.registry", &auth.registry)
            .map_err(|e| e.to_string())?;
        let used = in_use
            .iter()
            .flatten()
            .any(|u| (u.plain_http, &u.host, u.port) == (r.plain_http, &r.host, r.port));
        if !used {
            continue;
        }
        let token = std::env::var(&auth.token_env).map_err(|_| {
            format!(
                "deploy.registry_auth for {} names {}, which is not set in corral's environment: set it (an EnvironmentFile of the service, say), or remove the entry",
                auth.registry, auth.token_env
            )
        })?;
        out.push(RegistryToken::new(r, &auth.username, &token).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// `--package SPEC`, parsed; a SOURCE that looks like a package spec
/// and is no directory says to use `--package`.
fn package_flag(args: &DeployArgs) -> Result<Option<DeploySource>, String> {
    if let Some(spec) = &args.package {
        return PackageSpec::parse(spec)
            .map(|p| Some(DeploySource::Package(p)))
            .map_err(|e| format!("--package: {e}"));
    }
    if let Some(s) = &args.source {
        let text = s.to_string_lossy();
        if (text.starts_with("npm:") || text.starts_with("pypi:")) && !s.exists() {
            return Err(format!(
                "{text} is not a directory; to deploy a package, write --package {text}"
            ));
        }
    }
    Ok(None)
}

/// The source and the tree: the flags', or a supervised server's.
fn targets(
    args: &DeployArgs,
    config: &corral_policy::Config,
) -> Result<(DeploySource, PathBuf), String> {
    let flag = package_flag(args)?;
    let Some(name) = &args.server else {
        return match (flag, &args.source, &args.out) {
            (Some(p), _, Some(o)) => Ok((p, o.clone())),
            (None, Some(s), Some(o)) => Ok((DeploySource::Dir(s.clone()), o.clone())),
            _ => Err(
                "give SOURCE (or --package SPEC) and --out TREE, or --server NAME with --config"
                    .into(),
            ),
        };
    };
    let server = config
        .server
        .mcp_servers
        .iter()
        .find(|s| &s.name == name)
        .ok_or_else(|| {
            format!("--server {name}: no [[server.mcp_server]] of that name in the config")
        })?;
    if server.runtime != corral_policy::McpRuntime::Deployed {
        return Err(format!(
            "--server {name}: its runtime is {}, not \"deployed\": only deployed servers run a tree corral deploy made",
            server.runtime.as_str()
        ));
    }
    let source = match (flag, &args.source, &server.source, &server.package) {
        (Some(p), _, _, _) => p,
        (None, Some(s), _, _) => DeploySource::Dir(s.clone()),
        (None, None, Some(s), _) => DeploySource::Dir(s.clone()),
        (None, None, None, Some(p)) => DeploySource::Package(p.clone()),
        (None, None, None, None) => {
            return Err(format!(
                "--server {name}: it has neither `source` nor `package`: add source = \"/path/of/the/source\" or package = \"npm:NAME@X.Y.Z\" to its entry, or give SOURCE"
            ))
        }
    };
    if let Some(o) = &args.out {
        if std::path::absolute(o).ok().as_deref() != Some(server.dir.as_path()) {
            return Err(format!(
                "--server {name}: --out {} is not its dir {}: leave --out out",
                o.display(),
                server.dir.display()
            ));
        }
    }
    Ok((source, server.dir.clone()))
}

fn sink(args: &DeployArgs) -> Arc<dyn EventSink> {
    let id =
        corral_launcher::new_run_id().unwrap_or_else(|_| format!("pid-{}", std::process::id()));
    let what = match (&args.source, &args.package, &args.server) {
        (Some(s), _, _) => s.display().to_string(),
        (None, Some(p), _) => format!("--package {p}"),
        (None, None, Some(n)) => format!("--server {n}"),
        (None, None, None) => String::new(),
    };
    let argv = vec!["deploy".to_string(), what];
    let stamp = RunStamp::new(id, &args.install_profile, &argv);
    match &args.events {
        Some(path) => match EventWriter::append_to(path, stamp.clone()) {
            Ok(w) => w.shared(),
            Err(e) => {
                crate::say(&format!(
                    "cannot open the events file {}: {e}; writing security events to stderr",
                    path.display()
                ));
                EventWriter::stderr(stamp).shared()
            }
        },
        // With --json the phases' records carry every event already.
        None if args.json => Arc::new(NoEvents),
        None => EventWriter::stderr(stamp).shared(),
    }
}

/// One line on stdout; a closed stdout is not worth a panic (the tree is
/// in place by then, or nothing is).
fn print_line(v: &serde_json::Value) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{v}");
}

/// Runs `corral deploy`; returns the exit status (0, or 125 with the
/// error's code and message).
pub fn deploy(args: DeployArgs) -> i32 {
    let json = args.json;
    let fail = |code: &str, message: String, phases: serde_json::Value| {
        crate::say(&message);
        if json {
            print_line(&serde_json::json!({
                "ok": false,
                "error": {"code": code, "message": message},
                "phases": phases,
            }));
        }
        EXIT_CORRAL_ERROR
    };
    let opts = match options(&args) {
        Ok(o) => o,
        Err((code, message)) => return fail(&code, message, serde_json::json!([])),
    };
    let sink = sink(&args);
    let progress = |line: &str| crate::say(line);
    let done = corral_deploy::deploy(&opts, &progress, &sink);
    let phases = serde_json::to_value(&done.phases).unwrap_or_default();
    match done.result {
        Err(e) => fail(e.code(), format!("deploy failed: {e}"), phases),
        Ok(report) => {
            if json {
                print_line(&serde_json::json!({
                    "ok": true,
                    "noop": report.noop,
                    "out": report.out,
                    "detection": report.detection,
                    "manifest": report.manifest,
                    "phases": phases,
                }));
            } else if !report.noop {
                crate::say(&format!(
                    "deployed {} ({} {}, entry {})",
                    report.out.display(),
                    report.manifest.runtime,
                    report.manifest.interpreter_version,
                    report.manifest.entry.path()
                ));
            }
            0
        }
    }
}
