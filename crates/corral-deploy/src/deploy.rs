//! One deployment from source to pinned tree: check everything that can be
//! checked first, then stage, run the phases, pin, and rename into place;
//! or leave nothing behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use corral_launcher::{sandbox_identity, EventSink, HelperStart};
use corral_policy::{
    AuditEvent, Cidr, DomainRule, NetworkMode, PackageKind, PackageSpec, Profile, ReasonCode,
    SandboxPath,
};
use serde::Serialize;

use crate::detect::{detect, Detection, Runtime};
use crate::entry::resolve_entry;
use crate::error::DeployError;
use crate::manifest::{Manifest, PhaseRecord, MANIFEST_FILE, MANIFEST_FORMAT};
use crate::phases::{plan_phases, run_phase, PhaseInputs, PhaseKind, PhaseSetup, VENV};
use crate::python::{discover_interpreters, select_python, RequiresPython};
use crate::secrets::{install_files, read_ca_bundle, scan_tree, RegistryToken};
use crate::tree::{
    disk_usage, file_sha256, hash_and_copy, make_read_only, remove_tree, sha256, write_new, Owner,
};

/// A package registry the install phase may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Registry {
    /// The URL as given.
    pub url: String,
    /// Its host name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// Whether it is plain HTTP (pip then needs it as a trusted host).
    pub plain_http: bool,
}

impl Registry {
    /// Parses `http(s)://NAME[:PORT][/PATH]`. Credentials in the URL and IP
    /// addresses are refused: a registry is reached by name through
    /// corral's proxy (`--add-host NAME=IP` names a local one).
    pub fn parse(flag: &str, url: &str) -> Result<Registry, DeployError> {
        let bad = |why: &str| DeployError::Config(format!("{flag} {url}: {why}"));
        let (plain_http, rest) = if let Some(r) = url.strip_prefix("http://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (false, r)
        } else {
            return Err(bad("write an http:// or https:// URL"));
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.contains('@') {
            return Err(bad(
                "credentials do not go in the URL (they would reach every phase's environment and its logs): name the variable holding the token in [[deploy.registry_auth]]",
            ));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(']') || h.ends_with(']') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| bad(&format!("`{p}` is not a port")))?,
            ),
            _ => (authority, if plain_http { 80 } else { 443 }),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<std::net::IpAddr>().is_ok() {
            return Err(bad(
                "give the registry a name, e.g. --add-host registry.internal=IP with --allow-cidr IP/32:PORT: clients skip the proxy for loopback addresses, and the proxy allows names",
            ));
        }
        let host = corral_policy::network::normalize_host(host)
            .ok_or_else(|| bad(&format!("`{host}` is not a host name")))?;
        Ok(Registry {
            url: url.to_string(),
            host,
            port,
            plain_http,
        })
    }

    fn rule(&self) -> Result<DomainRule, DeployError> {
        DomainRule::parse(&format!("{}:{}", self.host, self.port))
            .map_err(|e| DeployError::Config(format!("{}: {e}", self.url)))
    }
}

/// What is deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeploySource {
    /// A source directory (read, never written).
    Dir(PathBuf),
    /// A package pinned to one version, fetched and installed in the
    /// install phase from the configured registry.
    Package(PackageSpec),
}

/// What to deploy and how.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    /// The source directory or package.
    pub source: DeploySource,
    /// The tree to create or replace.
    pub out: PathBuf,
    /// `--runtime`: only this runtime's patterns.
    pub runtime: Option<Runtime>,
    /// The install phase's base profile (`install` of the config).
    pub install_profile: Profile,
    /// The build phase's base profile (`build` of the config).
    pub build_profile: Profile,
    /// The Python index (`--index-url`): pip's and uv's.
    pub index_url: Option<Registry>,
    /// The npm registry (`--npm-registry`).
    pub npm_registry: Option<Registry>,
    /// More domains the install phase may reach.
    pub allow_domains: Vec<DomainRule>,
    /// Networks the proxy may dial although refused by default (a local
    /// registry on loopback).
    pub allow_cidrs: Vec<Cidr>,
    /// Static host entries for the proxy.
    pub hosts: BTreeMap<String, std::net::IpAddr>,
    /// Let npm run lifecycle scripts in the install phase.
    pub lifecycle_scripts: bool,
    /// uv for Python installs (`--uv PATH`); `None`: `uv` in
    /// /usr/local/bin, /usr/bin or /bin if there is one, else pip.
    pub uv: Option<PathBuf>,
    /// Directories searched for Python interpreters.
    pub python_search: Vec<PathBuf>,
    /// The newest Python series treated as stable.
    pub newest_stable: (u32, u32),
    /// A HOME for the install phase kept across deployments (warm
    /// caches); `None`: a fresh one each time.
    pub cache: Option<PathBuf>,
    /// The most disk space the tree may take (`[deploy] max_tree_bytes`):
    /// enforced during each phase (no larger file, and a watcher stops the
    /// phase once the tree passes it) and measured once more at the end.
    pub max_tree_bytes: u64,
    /// A PEM bundle of CA certificates the install phase trusts
    /// (`[deploy] ca_bundle`, `--ca-bundle`).
    pub ca_bundle: Option<PathBuf>,
    /// Tokens of the registries in use (`[[deploy.registry_auth]]`): in
    /// the install phase's HOME only, redacted from every log and event,
    /// and a tree holding one is refused.
    pub registry_tokens: Vec<RegistryToken>,
    /// Each phase's wall-clock limit, overriding the profiles'.
    pub timeout_secs: Option<u64>,
    /// Run where cgroup limits cannot be enforced.
    pub allow_unenforced_limits: bool,
    /// How sandboxes start (the CLI forks).
    pub helper: HelperStart,
}

/// One phase's audit record: what ran and every decision of its sandbox,
/// network decisions included.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseAudit {
    /// `install` or `build`.
    pub phase: String,
    /// The command.
    pub argv: Vec<String>,
    /// `allow` or `none`.
    pub network: String,
    /// The phase's HOME on the host (removed afterwards unless it is the
    /// `--cache` directory).
    pub home: PathBuf,
    /// Exit status (125 when the sandbox did not run the phase).
    pub exit_code: i32,
    /// Whether the timeout ended it.
    pub timed_out: bool,
    /// Wall-clock milliseconds.
    pub wall_ms: u64,
    /// Every event of the phase (security, network, lifecycle).
    pub events: Vec<AuditEvent>,
}

/// A finished deployment.
#[derive(Debug, Clone, Serialize)]
pub struct DeployReport {
    /// The tree.
    pub out: PathBuf,
    /// The tree was already up to date: nothing ran.
    pub noop: bool,
    /// Why this project pattern.
    pub detection: String,
    /// Its manifest.
    pub manifest: Manifest,
}

/// What [`deploy`] hands back: the phases' audit records whatever the
/// outcome, and the outcome.
#[derive(Debug)]
pub struct Deployment {
    /// One record per phase that ran (or was refused).
    pub phases: Vec<PhaseAudit>,
    /// The tree, or why there is none.
    pub result: Result<DeployReport, DeployError>,
}

/// Deploys `opts.source` to `opts.out`. `progress` gets one line per step
/// (the interpreter choice and why, each phase, a no-op); `sink` every
/// event of every phase as it happens.
pub fn deploy(
    opts: &DeployOptions,
    progress: &dyn Fn(&str),
    sink: &Arc<dyn EventSink>,
) -> Deployment {
    let mut phases = Vec::new();
    let result = deploy_inner(opts, progress, sink, &mut phases);
    Deployment { phases, result }
}

fn out_err(out: &Path, reason: impl Into<String>) -> DeployError {
    DeployError::Out {
        path: out.to_path_buf(),
        reason: reason.into(),
    }
}

/// The output path: absolute, no symlink on the way, not where a sandbox
/// cannot bind it, not inside the source; an existing one must be a
/// corral tree.
fn check_out(out: &Path, source: &Path) -> Result<(PathBuf, Option<Manifest>), DeployError> {
    let abs = std::path::absolute(out).map_err(|e| out_err(out, e.to_string()))?;
    let name = abs
        .file_name()
        .ok_or_else(|| out_err(out, "name a directory to create"))?;
    let parent = abs
        .parent()
        .ok_or_else(|| out_err(out, "name a directory to create"))?;
    let real_parent = std::fs::canonicalize(parent).map_err(|e| {
        out_err(
            out,
            format!(
                "its parent {} is not usable ({e}); create it first",
                parent.display()
            ),
        )
    })?;
    if real_parent != parent {
        return Err(out_err(
            out,
            format!(
                "its parent passes through a symlink or `..` (it is {}); give that path instead",
                real_parent.display()
            ),
        ));
    }
    let abs = real_parent.join(name);
    let text = abs
        .to_str()
        .ok_or_else(|| out_err(out, "the path is not UTF-8"))?;
    let sp = SandboxPath::new(text).map_err(|e| out_err(out, e.to_string()))?;
    if let Some(why) = corral_policy::config::reserved_destination(&sp) {
        return Err(out_err(
            out,
            format!("a tree is bound into sandboxes at its own path and this one cannot be ({why}); choose a directory such as /srv/corral/NAME or /var/tmp/NAME"),
        ));
    }
    if abs.starts_with(source) || source.starts_with(&abs) {
        return Err(out_err(
            out,
            "the tree and the source may not contain each other",
        ));
    }
    match std::fs::symlink_metadata(&abs) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((abs, None)),
        Err(e) => Err(out_err(out, e.to_string())),
        Ok(m) if m.is_dir() => match Manifest::read(&abs) {
            Some(manifest) => Ok((abs, Some(manifest))),
            None => Err(out_err(
                out,
                format!("exists and is not a corral tree (no valid {MANIFEST_FILE}); remove it or choose another path"),
            )),
        },
        Ok(_) => Err(out_err(out, "exists and is not a directory")),
    }
}

/// A directory corral made, removed on drop unless kept.
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = remove_tree(&self.path);
        }
    }
}

fn random_suffix() -> String {
    corral_launcher::new_run_id()
        .map(|id| id[..12].to_string())
        .unwrap_or_else(|_| format!("{}", std::process::id()))
}

/// Creates a fresh directory owned by `owner` (mode 0755), removed on drop.
fn scratch_dir(path: PathBuf, owner: Owner) -> Result<Scratch, DeployError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&path)
        .map_err(|e| DeployError::io(format!("creating {}", path.display()), e))?;
    let s = Scratch { path, keep: false };
    if let Some((uid, gid)) = owner.0 {
        std::os::unix::fs::chown(&s.path, Some(uid), Some(gid))
            .map_err(|e| DeployError::io(format!("chown {}", s.path.display()), e))?;
    }
    Ok(s)
}

fn find_in(dirs: &[&str], name: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
}

fn node_version(node: &Path) -> Result<String, DeployError> {
    let out = std::process::Command::new(node)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| DeployError::Config(format!("{} --version: {e}", node.display())))?;
    let v = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches('v')
        .to_string();
    if !out.status.success() || v.is_empty() {
        return Err(DeployError::Config(format!(
            "{} --version gave no version",
            node.display()
        )));
    }
    Ok(v)
}

/// The interpreter: (path, version, reason).
fn interpreter(
    opts: &DeployOptions,
    d: &Detection,
) -> Result<(PathBuf, String, String), DeployError> {
    match d.runtime() {
        Runtime::Python3 => {
            let requires = d
                .requires_python
                .as_deref()
                .map(RequiresPython::parse)
                .transpose()?;
            let found = discover_interpreters(&opts.python_search);
            let choice = select_python(&found, requires.as_ref(), opts.newest_stable)?;
            Ok((
                choice.interpreter.path.clone(),
                choice.interpreter.version.to_string(),
                choice.reason,
            ))
        }
        Runtime::Node => {
            let node = find_in(crate::python::PYTHON_SEARCH, "node").ok_or_else(|| {
                DeployError::Config(
                    "no `node` in /usr/local/bin, /usr/bin or /bin; install Node.js".into(),
                )
            })?;
            let v = node_version(&node)?;
            let reason = format!("{} (Node.js {v})", node.display());
            Ok((node, v, reason))
        }
    }
}

/// As root, the phases run as the sandbox identity, which must be able to
/// reach the staging directory next to the tree: every directory from `/`
/// to `dir` searchable by it.
fn reachable_by(dir: &Path, uid: u32, gid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    for d in dir.ancestors() {
        let Ok(m) = std::fs::metadata(d) else {
            continue;
        };
        let mode = m.mode();
        let ok = if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            // Never a suggestion to open a system or a home directory to
            // every user.
            let home = d.parent() == Some(std::path::Path::new("/home"));
            let fix = if corral_policy::shell::is_system_path(d) || home {
                "choose a tree elsewhere (under /srv or /var/tmp, say)".to_string()
            } else {
                format!(
                    "`chmod o+x {}` or choose a tree elsewhere",
                    corral_policy::shell::word(&d.display().to_string())
                )
            };
            return Err(format!(
                "the phases run as uid {uid}, which cannot reach {} (mode {:o}, owner {}); {fix}",
                d.display(),
                mode & 0o7777,
                m.uid(),
            ));
        }
    }
    Ok(())
}

/// What of an interpreter outside the system paths the sandbox must see:
/// its installation prefix (the parent of its `bin`, which holds its
/// standard library), for the path as found and as resolved.
fn interpreter_binds(path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let real = std::fs::canonicalize(path).ok();
    for p in std::iter::once(path.to_path_buf()).chain(real) {
        let Some(dir) = p.parent() else { continue };
        let prefix = if dir.file_name().is_some_and(|n| n == "bin") {
            dir.parent().unwrap_or(dir)
        } else {
            dir
        };
        let system = corral_policy::builtin::SYSTEM_PATHS
            .iter()
            .any(|s| prefix.starts_with(s));
        if !system && prefix != Path::new("/") && !out.iter().any(|o| prefix.starts_with(o)) {
            out.retain(|o| !o.starts_with(prefix));
            out.push(prefix.to_path_buf());
        }
    }
    out
}

/// uv for a Python install: `--uv PATH` (which the install profile must
/// allow: its `commands.allow` names `uv`), else a `uv` in the system
/// paths when the profile allows it, else none (pip).
fn uv_program(opts: &DeployOptions, runtime: Runtime) -> Result<Option<PathBuf>, DeployError> {
    let allowed = opts
        .install_profile
        .commands
        .allow
        .iter()
        .any(|c| c == "uv");
    if runtime != Runtime::Python3 {
        return Ok(None);
    }
    let Some(given) = &opts.uv else {
        return Ok(allowed
            .then(|| find_in(crate::python::PYTHON_SEARCH, "uv"))
            .flatten());
    };
    if !allowed {
        return Err(DeployError::Config(format!(
            "--uv {}: the install profile `{}` does not allow `uv` (commands.allow); add it, or leave --uv out to use pip",
            given.display(),
            opts.install_profile.name
        )));
    }
    let abs = std::fs::canonicalize(given).map_err(|e| {
        DeployError::Config(format!("--uv {}: {e}; give uv's path", given.display()))
    })?;
    let ok = std::fs::metadata(&abs).is_ok_and(|m| {
        m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
    });
    if !ok || abs.to_str().is_none() {
        return Err(DeployError::Config(format!(
            "--uv {}: not an executable file",
            given.display()
        )));
    }
    Ok(Some(abs))
}

fn lockfiles(tree: &Path) -> BTreeMap<String, String> {
    [
        "pyproject.toml",
        "requirements.txt",
        "uv.lock",
        "poetry.lock",
        "Pipfile.lock",
        "package.json",
        "package-lock.json",
        "npm-shrinkwrap.json",
        "yarn.lock",
        "pnpm-lock.yaml",
    ]
    .iter()
    .filter_map(|n| file_sha256(&tree.join(n)).map(|h| (n.to_string(), h)))
    .collect()
}

/// `name==version` of each distribution in the venv (from the names of
/// its `.dist-info` directories).
fn python_packages(tree: &Path) -> Vec<String> {
    crate::package::dist_infos(tree, VENV)
        .into_iter()
        .map(|(name, version, _)| format!("{name}=={version}"))
        .collect()
}

/// The phase's profile: the base, with the registries, CIDRs, hosts, the
/// timeout and the operator's acceptance of unenforced limits.
fn phase_profile(
    base: &Profile,
    kind: PhaseKind,
    opts: &DeployOptions,
) -> Result<Profile, DeployError> {
    let mut p = base.clone();
    p.filesystem.protect.clear();
    if let Some(t) = opts.timeout_secs {
        p.limits.timeout_secs = Some(t);
    }
    if opts.allow_unenforced_limits {
        p.limits.allow_unenforced = true;
    }
    match kind {
        PhaseKind::Build => {
            p.network = corral_policy::NetworkPolicy {
                mode: NetworkMode::None,
                ..Default::default()
            };
        }
        PhaseKind::Install => {
            let n = &mut p.network;
            n.mode = NetworkMode::Allow;
            let registries: Vec<&Registry> = opts
                .index_url
                .iter()
                .chain(opts.npm_registry.iter())
                .collect();
            if !registries.is_empty() {
                // Named registries replace the public ones: only them.
                n.allow_domains.clear();
                for r in &registries {
                    let rule = r.rule()?;
                    if !n.allow_domains.contains(&rule) {
                        n.allow_domains.push(rule);
                    }
                }
            }
            n.allow_domains.extend(opts.allow_domains.iter().cloned());
            n.allow_cidrs.extend(opts.allow_cidrs.iter().cloned());
            n.hosts.extend(opts.hosts.clone());
            let env = &mut p.env.set;
            if let Some(r) = &opts.index_url {
                env.insert("PIP_INDEX_URL".into(), r.url.clone());
                env.insert("UV_INDEX_URL".into(), r.url.clone());
                if r.plain_http {
                    env.insert("PIP_TRUSTED_HOST".into(), format!("{}:{}", r.host, r.port));
                    env.insert("UV_INSECURE_HOST".into(), format!("{}:{}", r.host, r.port));
                }
            }
            if let Some(r) = &opts.npm_registry {
                env.insert("NPM_CONFIG_REGISTRY".into(), r.url.clone());
            }
            // uv: never download an interpreter, read no uv.toml or
            // [tool.uv] settings of the source (where packages come from
            // is corral's configuration), copy rather than link from its
            // cache (another filesystem).
            env.insert("UV_PYTHON_DOWNLOADS".into(), "never".into());
            env.insert("UV_NO_CONFIG".into(), "1".into());
            env.insert("UV_LINK_MODE".into(), "copy".into());
            if opts.cache.is_some() {
                // The operator's cache directory is meant to stay warm.
                env.remove("PIP_NO_CACHE_DIR");
            }
        }
    }
    Ok(p)
}

fn options_sha256(
    d: &Detection,
    interp: &(PathBuf, String, String),
    uv: Option<&Path>,
    opts: &DeployOptions,
    package: Option<&PackageSpec>,
) -> String {
    let v = serde_json::json!({
        "format": MANIFEST_FORMAT,
        "corral": env!("CARGO_PKG_VERSION"),
        "pattern": d.pattern,
        "interpreter": interp.0,
        "interpreter_version": interp.1,
        "uv": uv,
        "index_url": opts.index_url.as_ref().map(|r| &r.url),
        "npm_registry": opts.npm_registry.as_ref().map(|r| &r.url),
        "lifecycle_scripts": opts.lifecycle_scripts,
        "package": package.map(|p| p.to_string()),
    });
    sha256(v.to_string().as_bytes())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn deploy_inner(
    opts: &DeployOptions,
    progress: &dyn Fn(&str),
    sink: &Arc<dyn EventSink>,
    audits: &mut Vec<PhaseAudit>,
) -> Result<DeployReport, DeployError> {
    // 1. Everything that can be checked before anything is created. A
    // package's source is a directory corral writes: a package.json or
    // requirements.txt pinning it, installed by the ordinary phases.
    let suffix = random_suffix();
    let _generated;
    let (source, package, runtime) = match &opts.source {
        DeploySource::Dir(dir) => {
            let source = std::fs::canonicalize(dir).map_err(|e| DeployError::Source {
                path: dir.clone(),
                reason: format!("cannot open it: {e}"),
            })?;
            (source, None, opts.runtime)
        }
        DeploySource::Package(spec) => {
            let runtime = match spec.kind {
                PackageKind::Npm => Runtime::Node,
                PackageKind::Pypi => Runtime::Python3,
            };
            if opts.runtime.is_some_and(|r| r != runtime) {
                return Err(DeployError::Config(format!(
                    "{spec} is a {} package: leave --runtime out",
                    runtime.as_str()
                )));
            }
            let dir = scratch_dir(
                std::env::temp_dir().join(format!("corral-deploy-{suffix}-package")),
                Owner(None),
            )?;
            crate::package::write_source(spec, &dir.path)?;
            let path = dir.path.clone();
            _generated = dir;
            (path, Some(spec), Some(runtime))
        }
    };
    if !source.is_dir() {
        return Err(DeployError::Source {
            path: source,
            reason: "not a directory".into(),
        });
    }
    let (out, existing) = check_out(&opts.out, &source)?;
    // Hashing walks the whole source first: a link leaving it, or anything
    // but files, directories and links, is refused before any file of it
    // is parsed.
    let source_hash = hash_and_copy(&source, None, Owner(None))?;
    let d = detect(&source, runtime)?;
    progress(&format!(
        "{}: {} ({})",
        source.display(),
        d.runtime().as_str(),
        d.reason
    ));
    if d.runtime() == Runtime::Node {
        let mut rules = opts.install_profile.commands.deny_args.clone();
        rules.extend(opts.build_profile.commands.deny_args.iter().cloned());
        let set = corral_policy::commands::compile_deny_args(&rules)
            .map_err(|e| DeployError::Config(format!("deny_args: {e}")))?;
        crate::scripts::check_scripts(&d.scripts, &set, &rules)?;
    }
    if d.requirements_txt {
        let path = source.join("requirements.txt");
        let text = crate::detect::read_text(&path)?.unwrap_or_default();
        crate::scripts::check_requirements(&text)?;
    }
    let interp = interpreter(opts, &d)?;
    progress(&interp.2);
    let uv = uv_program(opts, d.runtime())?;
    if let Some(uv) = &uv {
        progress(&format!("installing with {}", uv.display()));
    }
    let options_hash = options_sha256(&d, &interp, uv.as_deref(), opts, package);
    let ca = opts.ca_bundle.as_deref().map(read_ca_bundle).transpose()?;
    let secrets: Vec<String> = opts
        .registry_tokens
        .iter()
        .map(|t| t.token.clone())
        .collect();
    // 2. The same source with the same options over a sound tree: no-op.
    if let Some(m) = &existing {
        if m.source_sha256 == source_hash
            && m.options_sha256 == options_hash
            && out.join(m.entry.path()).exists()
        {
            progress(&format!(
                "{} is up to date (source {}, deployed {}); nothing to do",
                out.display(),
                &source_hash[..12],
                m.created
            ));
            return Ok(DeployReport {
                out,
                noop: true,
                detection: d.reason.clone(),
                manifest: m.clone(),
            });
        }
    }
    // 3. Stage: a fresh directory next to the tree, owned by the sandbox's
    // identity when corral is root.
    let identity = sandbox_identity(&opts.install_profile);
    let owner = Owner(
        identity
            .drop_from_root
            .then_some((identity.uid, identity.gid)),
    );
    if identity.drop_from_root {
        if let Some(parent) = out.parent() {
            reachable_by(parent, identity.uid, identity.gid).map_err(|why| out_err(&out, why))?;
        }
    }
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut staging = scratch_dir(out.with_file_name(format!("{name}.tmp-{suffix}")), owner)?;
    if hash_and_copy(&source, Some(&staging.path), owner)? != source_hash {
        return Err(DeployError::SourceChanged(source));
    }
    let used = disk_usage(&staging.path, u64::MAX, None);
    if used > opts.max_tree_bytes {
        return Err(DeployError::Quota {
            what: format!("the source {} takes", source.display()),
            limit: opts.max_tree_bytes,
            seen: format!(" ({used} bytes)"),
        });
    }
    let tree = out
        .to_str()
        .ok_or_else(|| out_err(&out, "the path is not UTF-8"))?
        .to_string();
    let mut extra_ro = if d.runtime() == Runtime::Python3 {
        interpreter_binds(&interp.0)
    } else {
        vec![]
    };
    if let Some(uv) = &uv {
        // A uv outside the system paths is bound alone, read-only.
        if !corral_policy::builtin::SYSTEM_PATHS
            .iter()
            .any(|s| uv.starts_with(s))
        {
            extra_ro.push(uv.clone());
        }
    }
    let inputs = PhaseInputs {
        tree: tree.clone(),
        python: (d.runtime() == Runtime::Python3).then(|| interp.0.to_string_lossy().to_string()),
        uv: uv.as_ref().map(|p| p.to_string_lossy().to_string()),
        interpreter_pip: d.runtime() == Runtime::Python3
            && uv.is_none()
            && crate::python::has_pip(&interp.0),
        lifecycle_scripts: opts.lifecycle_scripts,
    };
    let specs = plan_phases(&d, &inputs)?;
    // 4. The phases.
    let mut records = Vec::new();
    let mut logs: Vec<(String, String)> = Vec::new();
    for spec in &specs {
        let kind = spec.kind;
        let base = match kind {
            PhaseKind::Install => &opts.install_profile,
            PhaseKind::Build => &opts.build_profile,
        };
        let profile = phase_profile(base, kind, opts)?;
        let tmp = std::env::temp_dir();
        let _home_guard;
        let home = match (&opts.cache, kind) {
            (Some(c), PhaseKind::Install) => {
                if !c.exists() {
                    // Made here, so owned by the sandbox's identity; kept.
                    scratch_dir(c.clone(), owner)?.keep = true;
                }
                c.clone()
            }
            _ => {
                let s = scratch_dir(
                    tmp.join(format!("corral-deploy-{suffix}-{}", kind.as_str())),
                    owner,
                )?;
                let p = s.path.clone();
                _home_guard = s;
                p
            }
        };
        // Temporary files (pip's downloads and builds) go under HOME, on
        // disk, rather than into the sandbox's small /tmp tmpfs; a fresh
        // directory each phase, removed with a fresh HOME.
        let phase_tmp = home.join(format!(".tmp-{suffix}"));
        let _tmp_guard = scratch_dir(phase_tmp.clone(), owner)?;
        let mut profile = profile;
        // The CA bundle and the tokens: the install phase's only, as files
        // in its HOME removed when it ends.
        let _phase_files = if kind == PhaseKind::Install {
            let (files, env) = install_files(&home, ca.as_deref(), &opts.registry_tokens, owner)?;
            profile.env.set.extend(env);
            Some(files)
        } else {
            None
        };
        profile.env.set.insert(
            "TMPDIR".into(),
            format!(
                "/workspace/{}",
                phase_tmp
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default()
            ),
        );
        let network = match profile.network.mode {
            NetworkMode::None => "none",
            NetworkMode::Allow => "allow",
            NetworkMode::Host => "host",
        }
        .to_string();
        let allowed: Vec<String> = if profile.network.mode == NetworkMode::Allow {
            profile
                .network
                .allow_domains
                .iter()
                .map(|r| r.to_string())
                .collect()
        } else {
            vec![]
        };
        progress(&format!(
            "{} phase (network {network}{}): {}",
            kind.as_str(),
            if allowed.is_empty() {
                String::new()
            } else {
                format!(" to {}", allowed.join(", "))
            },
            spec.steps
                .iter()
                .map(|s| s.join(" "))
                .collect::<Vec<_>>()
                .join("; ")
        ));
        let setup = PhaseSetup {
            profile: profile.clone(),
            staging: &staging.path,
            tree: &tree,
            home: &home,
            extra_ro: &extra_ro,
            helper: opts.helper,
            max_tree_bytes: opts.max_tree_bytes,
            secrets: &secrets,
        };
        let run = match run_phase(spec, setup, sink) {
            Ok(r) => r,
            Err(e) => {
                audits.push(PhaseAudit {
                    phase: kind.as_str().into(),
                    argv: spec.argv(&tree),
                    network,
                    home: home.clone(),
                    exit_code: corral_launcher::EXIT_CORRAL_ERROR,
                    timed_out: false,
                    wall_ms: 0,
                    events: vec![],
                });
                return Err(e);
            }
        };
        let count = |code: ReasonCode| run.events.iter().filter(|e| e.code == code).count() as u64;
        audits.push(PhaseAudit {
            phase: kind.as_str().into(),
            argv: run.argv.clone(),
            network: network.clone(),
            home: home.clone(),
            exit_code: run.exit_code,
            timed_out: run.timed_out,
            wall_ms: run.wall_ms,
            events: run.events.clone(),
        });
        let quota = |seen: String| DeployError::Quota {
            what: format!("the {} phase wrote", kind.as_str()),
            limit: opts.max_tree_bytes,
            seen,
        };
        if let Some(used) = run.quota_stop {
            return Err(quota(format!(
                " (the tree and what the phase added to its HOME took {used} bytes when corral stopped the phase)"
            )));
        }
        if run.exit_code != 0 && run.log.contains("File too large") {
            return Err(quota(
                " (a single file reached the quota: `File too large`)".to_string(),
            ));
        }
        if run.exit_code != 0 {
            let how = if run.timed_out {
                format!(
                    "timed out after {} s",
                    profile.limits.timeout_secs.unwrap_or_default()
                )
            } else {
                format!("exit status {}", run.exit_code)
            };
            let denied: Vec<String> = run
                .events
                .iter()
                .filter(|e| e.code == ReasonCode::NetDenied)
                .map(|e| e.message.clone())
                .collect();
            let mut t = tail(&run.log, 25);
            if let (Some(spec), PhaseKind::Install) = (package, kind) {
                let registry = match spec.kind {
                    PackageKind::Npm => opts.npm_registry.as_ref(),
                    PackageKind::Pypi => opts.index_url.as_ref(),
                }
                .map(|r| r.url.clone())
                .unwrap_or_else(|| "the public registry".into());
                t = format!("{t}\n{spec} could not be installed from {registry}: check that the registry has this package at exactly this version");
            }
            if !denied.is_empty() {
                t = format!("{t}\nthe proxy refused: {}", denied.join("; "));
            }
            return Err(DeployError::Phase {
                phase: kind.as_str().into(),
                how,
                tail: t,
            });
        }
        let log_rel = format!(".corral/logs/{}.log", kind.as_str());
        records.push(PhaseRecord {
            name: kind.as_str().into(),
            argv: run.argv.clone(),
            profile: base.name.clone(),
            network,
            allowed_domains: allowed,
            exit_code: run.exit_code,
            wall_ms: run.wall_ms,
            connections_allowed: count(ReasonCode::NetAllowed),
            connections_denied: count(ReasonCode::NetDenied),
            log: log_rel.clone(),
            log_sha256: sha256(run.log.as_bytes()),
        });
        logs.push((log_rel, run.log));
    }
    // 5. corral's own files, written only now that no sandbox runs, and
    // never through anything a phase left at those names.
    let st = staging.path.clone();
    scan_tree(&st, &secrets)?;
    let used = disk_usage(&st, u64::MAX, None);
    if used > opts.max_tree_bytes {
        return Err(DeployError::Quota {
            what: "the phases wrote".into(),
            limit: opts.max_tree_bytes,
            seen: format!(" ({used} bytes at the end)"),
        });
    }
    for name in [".corral", MANIFEST_FILE] {
        remove_tree(&st.join(name))
            .map_err(|e| DeployError::io(format!("clearing {name} in the staged tree"), e))?;
    }
    for name in ["pyproject.toml", "package.json"] {
        if std::fs::symlink_metadata(st.join(name)).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(DeployError::Entry(format!(
                "a phase replaced {name} with a symlink; refusing the tree"
            )));
        }
    }
    let entry = match package {
        Some(spec) => crate::package::resolve_entry(spec, &st, VENV)?,
        None => resolve_entry(&st, d.runtime(), VENV)?,
    };
    let package_record = package
        .map(|spec| crate::package::record(spec, &st, VENV))
        .transpose()?;
    progress(&format!(
        "entry: {}",
        serde_json::to_string(&entry).unwrap_or_default()
    ));
    std::fs::create_dir_all(st.join(".corral/logs"))
        .map_err(|e| DeployError::io("creating .corral/logs", e))?;
    for (rel, text) in &logs {
        write_new(&st.join(rel), text.as_bytes())?;
    }
    let audit_lines: String = audits
        .iter()
        .map(|a| serde_json::to_string(a).unwrap_or_default() + "\n")
        .collect();
    write_new(&st.join(".corral/audit.jsonl"), audit_lines.as_bytes())?;
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        runtime: d.runtime().as_str().into(),
        pattern: serde_json::to_value(d.pattern)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        interpreter: interp.0.to_string_lossy().to_string(),
        interpreter_version: interp.1.clone(),
        interpreter_reason: interp.2.clone(),
        entry,
        venv: (d.runtime() == Runtime::Python3).then(|| VENV.to_string()),
        node_modules: (d.runtime() == Runtime::Node && st.join("node_modules").is_dir())
            .then(|| "node_modules".to_string()),
        source: match package {
            Some(spec) => spec.to_string(),
            None => source.to_string_lossy().to_string(),
        },
        package: package_record,
        source_sha256: source_hash,
        options_sha256: options_hash,
        lockfiles: lockfiles(&st),
        packages: if d.runtime() == Runtime::Python3 {
            python_packages(&st)
        } else {
            vec![]
        },
        phases: records,
        created: corral_launcher::rfc3339(std::time::SystemTime::now()),
        corral_version: env!("CARGO_PKG_VERSION").into(),
    };
    manifest.write_new(&st)?;
    // 6. Pin, then rename into place (the old tree aside first).
    make_read_only(&st, identity.drop_from_root)?;
    let old = existing
        .as_ref()
        .map(|_| out.with_file_name(format!("{name}.old-{suffix}")));
    if let Some(old) = &old {
        std::fs::rename(&out, old).map_err(|e| {
            DeployError::io(format!("moving the old tree {} aside", out.display()), e)
        })?;
    }
    if let Err(e) = std::fs::rename(&st, &out) {
        if let Some(old) = &old {
            let _ = std::fs::rename(old, &out);
        }
        return Err(DeployError::io(
            format!("renaming the tree into {}", out.display()),
            e,
        ));
    }
    staging.keep = true;
    if let Some(old) = &old {
        if let Err(e) = remove_tree(old) {
            progress(&format!(
                "could not remove the replaced tree {}: {e}",
                old.display()
            ));
        }
    }
    Ok(DeployReport {
        out,
        noop: false,
        detection: d.reason.clone(),
        manifest,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn registries() {
        let r = Registry::parse("--index-url", "http://pypi.test:8080/simple").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.plain_http),
            ("pypi.test", 8080, true)
        );
        let r = Registry::parse("--npm-registry", "https://npm.example").unwrap();
        assert_eq!((r.port, r.plain_http), (443, false));
        for bad in [
            "ftp://x",
            "http://u:p@x/",
            "http://127.0.0.1:8080/",
            "http://x:99999/",
            "http://[::1]:80/",
        ] {
            assert_eq!(
                Registry::parse("--index-url", bad).unwrap_err().code(),
                "deploy.config",
                "{bad}"
            );
        }
    }

    #[test]
    fn interpreter_prefixes_are_bound() {
        assert!(interpreter_binds(Path::new("/usr/bin/python3.11")).is_empty());
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("py/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("python3.12"), "").unwrap();
        assert_eq!(
            interpreter_binds(&bin.join("python3.12")),
            vec![d.path().join("py")]
        );
    }

    #[test]
    fn searchable_parents() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let inner = d.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let e = reachable_by(&inner, 4_000_000, 4_000_000).unwrap_err();
        assert!(e.contains("chmod o+x") && e.contains("/a "), "{e}");
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o711))
            .unwrap();
        reachable_by(&inner, 4_000_000, 4_000_000).unwrap();
    }

    #[test]
    fn out_paths() {
        let src = tempfile::tempdir().unwrap();
        for bad in ["/tmp/x", "/proc/x", "/"] {
            let e = check_out(Path::new(bad), src.path()).unwrap_err();
            assert_eq!(e.code(), "deploy.out", "{bad}");
        }
        let inside = src.path().join("out");
        assert!(check_out(&inside, src.path()).is_err());
        let e = check_out(Path::new("/nonexistent-dir/x"), src.path()).unwrap_err();
        assert!(e.to_string().contains("create it first"), "{e}");
    }
}
