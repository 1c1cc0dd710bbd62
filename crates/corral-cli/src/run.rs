//! `corral run`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use corral_launcher::{execute, new_run_id, EventSink, EventWriter, ExecuteOptions, RunStamp};
use corral_launcher::{
    sandbox_identity, CommandTable, ErrorInfo, HelperStart, Outcome, OutputMode, RunRequest,
    RunResult, SandboxIdentity, EXIT_CORRAL_ERROR,
};
use corral_policy::env::{parse_assignment, EnvRequest};
use corral_policy::{AuditEvent, ByteSize, Config, MountSpec, Profile, SandboxPath};

/// Arguments of `corral run`.
#[derive(Args)]
#[cfg_attr(test, derive(Debug))]
pub struct RunArgs {
    /// Profile to apply (built-in or from --config).
    #[arg(long, default_value = corral_policy::builtin::DEFAULT_PROFILE)]
    profile: String,
    /// Config file with extra or overriding profiles.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Host directory bound read-write at /workspace (default: a fresh
    /// tmpfs removed afterwards).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Extra read-only bind, PATH or PATH:DEST.
    #[arg(long = "ro", value_name = "PATH[:DEST]")]
    read_only: Vec<String>,
    /// Extra read-write bind, PATH or PATH:DEST.
    #[arg(long = "rw", value_name = "PATH[:DEST]")]
    read_write: Vec<String>,
    /// Pass this variable from corral's environment.
    #[arg(long = "env", value_name = "NAME")]
    pass_env: Vec<String>,
    /// Set a variable.
    #[arg(long = "set-env", value_name = "NAME=VALUE")]
    set_env: Vec<String>,
    /// Wall-clock limit in seconds, or `none` for no limit (also when the
    /// profile sets one).
    #[arg(long, value_name = "SECS|none")]
    timeout: Option<String>,
    /// Memory limit, swap included (e.g. 512MiB).
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Most processes and threads at once.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU time limit in seconds.
    #[arg(long = "cpu-time", value_name = "SECS")]
    cpu_time: Option<u64>,
    /// Largest file a process may write (e.g. 10MiB); past it the program
    /// gets SIGXFSZ (or EFBIG).
    #[arg(long = "file-size", value_name = "SIZE")]
    file_size: Option<String>,
    /// Bytes of each output stream kept (head and tail) with --json; the
    /// sandbox is killed once a stream passes the profile's kill ceiling,
    /// which is raised to at least this. Streaming output keeps nothing:
    /// it is a pipe to the reader.
    #[arg(long = "output-limit", value_name = "SIZE")]
    output_limit: Option<String>,
    /// Run even if this host cannot enforce some limit (no cgroup
    /// delegation); the result lists what was not enforced.
    #[arg(long = "allow-unenforced-limits")]
    allow_unenforced_limits: bool,
    /// Network mode: none (loopback only, the default), allow (only through
    /// corral's proxy, to allowed domains), host (the host's network,
    /// unfiltered).
    #[arg(long = "net", value_name = "MODE")]
    net: Option<String>,
    /// Allow a domain through the proxy: `example.com` or `*.example.com`,
    /// optionally with `:PORT,...` (default 80,443). Implies --net allow.
    #[arg(long = "allow-domain", value_name = "PATTERN[:PORT,...]")]
    allow_domain: Vec<String>,
    /// Allow a network (needed for private, loopback or link-local
    /// addresses and for IP literals), on every port or only on the listed
    /// ones (`127.0.0.1/32:8765,8766`). Implies --net allow.
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORT,...]")]
    allow_cidr: Vec<String>,
    /// A static host entry for the proxy, NAME=IP.
    #[arg(long = "add-host", value_name = "NAME=IP")]
    add_host: Vec<String>,
    /// Run WITHOUT namespaces (for hosts where user namespaces are
    /// blocked): Landlock (ABI 6+, required), seccomp without network
    /// sockets or SysV IPC, rlimits, the environment scrub and output
    /// bounds only. Weaker: the program sees the host's paths (as Landlock
    /// allows) and shares its pid, network and IPC namespaces.
    #[arg(long = "without-namespaces")]
    without_namespaces: bool,
    /// Let the sandbox change the profile's protected entries of the
    /// workdir and `--rw` binds (`.git/hooks`, `.git/config`, shell rc
    /// files, `.vscode`, `.mcp.json`, ...; see `corral explain`), which
    /// are otherwise read-only and, while missing, cannot be created.
    #[arg(long = "no-protect")]
    no_protect: bool,
    /// A runtime tree: a Python venv or a `node_modules` directory, bound
    /// read-only at its own path with its `bin` (`.bin`) first on the
    /// search path and on PATH, so `python3` is the venv's interpreter.
    #[arg(long = "runtime", value_name = "DIR")]
    runtime: Option<PathBuf>,
    /// The sandbox's host name (default: the profile's).
    #[arg(long, value_name = "NAME")]
    hostname: Option<String>,
    /// Die with the process that started corral (PR_SET_PDEATHSIG, like
    /// bwrap's option of the same name): a supervisor killed with SIGKILL
    /// takes its sandboxes along.
    #[arg(long = "die-with-parent")]
    die_with_parent: bool,
    /// Print one JSON result object instead of streaming output.
    #[arg(long)]
    json: bool,
    /// Append events (JSON lines: run start and exit, timeouts, OOM kills,
    /// security and network decisions as they happen) to this file instead
    /// of writing the security events to stderr.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// A temporary workspace for reduced mode, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create(identity: SandboxIdentity) -> Result<ScratchDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        for attempt in 0..16u32 {
            let path = base.join(format!(
                "corral-ws-{}-{stamp:x}-{attempt}",
                std::process::id()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    if identity.drop_from_root {
                        // Our own fresh directory, handed to the sandbox uid.
                        std::os::unix::fs::chown(&path, Some(identity.uid), Some(identity.gid))
                            .map_err(|e| format!("chown {}: {e}", path.display()))?;
                    }
                    return Ok(ScratchDir(path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("creating a workspace in {}: {e}", base.display())),
            }
        }
        Err(format!(
            "could not create a unique workspace in {}",
            base.display()
        ))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // remove_dir_all does not follow symlinks the program planted.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where events go: the `--events` file (every kind, one stamped line each,
/// written as it happens), else stderr (security events only).
fn event_writer(args: &RunArgs) -> Arc<dyn EventSink> {
    // Without a random source the run still gets an id, marked as such.
    let run_id = new_run_id().unwrap_or_else(|e| {
        eprintln!("corral: no random run id ({e}); using the process id");
        format!("pid-{}", std::process::id())
    });
    let stamp = RunStamp::new(run_id, &args.profile, &args.command);
    match &args.events {
        Some(path) => match EventWriter::append_to(path, stamp.clone()) {
            Ok(w) => w.shared(),
            Err(e) => {
                eprintln!(
                    "corral: cannot open the events file {}: {e}; writing security events to stderr",
                    path.display()
                );
                EventWriter::stderr(stamp).shared()
            }
        },
        None => EventWriter::stderr(stamp).shared(),
    }
}

/// Prints the result object; a closed stdout is not an error worth a panic.
fn print_json(result: &RunResult) {
    match serde_json::to_string(result) {
        Ok(s) => {
            let _ = writeln!(std::io::stdout(), "{s}");
        }
        Err(e) => eprintln!("corral: cannot encode the result: {e}"),
    }
}

/// A refusal before the sandbox started: message on stderr, and in `--json`
/// mode a result object with `error` set. Returns the exit status.
pub fn refuse(
    json: bool,
    exit_code: i32,
    code: &str,
    message: String,
    events: Vec<AuditEvent>,
) -> i32 {
    crate::say(&message);
    if json {
        print_json(&RunResult {
            exit_code,
            signal: None,
            timed_out: false,
            oom_killed: false,
            output_limit_exceeded: false,
            limits_hit: Vec::new(),
            stdout: String::new(),
            stderr: String::new(),
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            wall_ms: 0,
            cpu_ms: 0,
            peak_memory_bytes: 0,
            error: Some(ErrorInfo {
                code: code.into(),
                message,
            }),
            events,
            enforced: None,
        });
    }
    exit_code
}

fn size_flag(flag: &str, text: &str) -> Result<ByteSize, String> {
    ByteSize::parse(text).map_err(|e| format!("{flag}: {e}"))
}

/// Applies the limit flags on top of the profile.
fn apply_limit_flags(args: &RunArgs, profile: &mut Profile) -> Result<(), String> {
    use corral_policy::RunLimit;
    let l = &mut profile.limits;
    // The ranges are the config file's and the service's too
    // (`RunLimit::check`).
    let count = |flag: &str, limit: RunLimit, v: Option<u64>| {
        v.map(|v| limit.check(v).map_err(|e| format!("{flag} {e}")))
            .transpose()
    };
    if let Some(t) = &args.timeout {
        l.timeout_secs = if t == corral_policy::NO_LIMIT {
            None
        } else {
            let secs = t.parse::<u64>().map_err(|_| {
                format!(
                    "--timeout {t}: not a number of seconds; use {}, or `{}` for no limit",
                    RunLimit::Timeout.range_hint(),
                    corral_policy::NO_LIMIT
                )
            })?;
            Some(
                RunLimit::Timeout
                    .check(secs)
                    .map_err(|e| format!("--timeout {e}"))?,
            )
        };
    }
    if let Some(p) = count("--pids", RunLimit::Pids, args.pids)? {
        l.pids = Some(p);
    }
    if let Some(c) = count("--cpu-time", RunLimit::CpuTime, args.cpu_time)? {
        l.cpu_time_secs = Some(c);
    }
    let size = |flag: &str, limit: RunLimit, text: &str| {
        let v = size_flag(flag, text)?;
        limit
            .check(v.bytes())
            .map(ByteSize)
            .map_err(|e| format!("{flag} {e}"))
    };
    if let Some(m) = &args.memory {
        l.memory_bytes = Some(size("--memory", RunLimit::Memory, m)?);
    }
    if let Some(f) = &args.file_size {
        l.file_size_bytes = Some(size("--file-size", RunLimit::FileSize, f)?);
    }
    if let Some(o) = &args.output_limit {
        let o = size("--output-limit", RunLimit::Output, o)?;
        l.output_bytes = o;
        // A ceiling below what is kept is raised; no ceiling stays none.
        l.output_kill_bytes = l.output_kill_bytes.map(|k| k.max(o));
    }
    if args.allow_unenforced_limits {
        l.allow_unenforced = true;
    }
    apply_network_flags(args, &mut profile.network)
}

/// Applies --net, --allow-domain, --allow-cidr and --add-host.
fn apply_network_flags(args: &RunArgs, n: &mut corral_policy::NetworkPolicy) -> Result<(), String> {
    use corral_policy::network::{normalize_host, Cidr, DomainRule, NetworkMode};
    for d in &args.allow_domain {
        n.allow_domains
            .push(DomainRule::parse(d).map_err(|e| format!("--allow-domain: {e}"))?);
    }
    for c in &args.allow_cidr {
        n.allow_cidrs
            .push(Cidr::parse(c).map_err(|e| format!("--allow-cidr: {e}"))?);
    }
    for h in &args.add_host {
        let (name, ip) = h
            .split_once('=')
            .ok_or_else(|| format!("--add-host {h}: write NAME=IP"))?;
        let name = normalize_host(name)
            .ok_or_else(|| format!("--add-host {h}: `{name}` is not a host name"))?;
        let ip = ip
            .parse()
            .map_err(|_| format!("--add-host {h}: `{ip}` is not an IP address"))?;
        n.hosts.insert(name, ip);
    }
    if !args.allow_domain.is_empty() || !args.allow_cidr.is_empty() {
        n.mode = NetworkMode::Allow;
    }
    if let Some(mode) = &args.net {
        let mode: NetworkMode = mode
            .parse()
            .map_err(|e: corral_policy::NetworkError| format!("--net: {e}"))?;
        if mode != NetworkMode::Allow
            && (!args.allow_domain.is_empty() || !args.allow_cidr.is_empty())
        {
            return Err("--allow-domain and --allow-cidr only make sense with --net allow".into());
        }
        n.mode = mode;
    }
    Ok(())
}

/// Builds the request from the flags.
fn request(args: &RunArgs) -> Result<RunRequest, (String, String)> {
    let cwd = std::env::current_dir().ok();
    let mut request = RunRequest {
        argv: args.command.clone(),
        workdir: args.workdir.clone(),
        ..Default::default()
    };
    for (list, out) in [
        (&args.read_only, &mut request.read_only),
        (&args.read_write, &mut request.read_write),
    ] {
        for spec in list {
            let m = MountSpec::parse(spec, cwd.as_deref()).map_err(|e| {
                (
                    "mount.invalid".to_string(),
                    format!("--ro/--rw {spec}: {e}"),
                )
            })?;
            out.push(m);
        }
    }
    let mut env = EnvRequest {
        pass: args.pass_env.clone(),
        set: Vec::new(),
    };
    for assignment in &args.set_env {
        let kv = parse_assignment(assignment)
            .map_err(|e| ("env.invalid".to_string(), format!("--set-env: {e}")))?;
        env.set.push(kv);
    }
    request.env = env;
    Ok(request)
}

/// `--die-with-parent`: SIGKILL when the parent goes. The parent may have
/// died before the request took effect (we were then re-parented): the
/// parent's pid, passed by the supervisor in `CORRAL_PARENT_PID`, tells.
fn die_with_parent() -> Result<(), String> {
    corral_sys::process::kill_with_parent()
        .map_err(|e| format!("--die-with-parent: PR_SET_PDEATHSIG failed: {e}"))?;
    let expected = std::env::var("CORRAL_PARENT_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok());
    if expected.is_some_and(|pid| pid != std::os::unix::process::parent_id()) {
        return Err("--die-with-parent: the parent is already gone".into());
    }
    Ok(())
}

/// Runs `corral run`; returns the exit status.
pub fn run(args: RunArgs) -> i32 {
    let json = args.json;
    if args.die_with_parent {
        if let Err(message) = die_with_parent() {
            return refuse(json, EXIT_CORRAL_ERROR, "sandbox.launch", message, vec![]);
        }
    }
    let sink = event_writer(&args);
    // Only the named profile (and what the file's profiles extend) is
    // built: the other built-in profiles are work a run never uses.
    let config = match Config::load_wanted(args.config.as_deref(), &[args.profile.as_str()]) {
        Ok(c) => c,
        Err(e) => {
            return refuse(
                json,
                EXIT_CORRAL_ERROR,
                "config.invalid",
                e.to_string(),
                vec![],
            )
        }
    };
    let mut profile = match config.profile(&args.profile) {
        Ok(p) => p.clone(),
        Err(e) => {
            return refuse(
                json,
                EXIT_CORRAL_ERROR,
                "config.unknown_profile",
                e.to_string(),
                vec![],
            )
        }
    };
    if let Err(message) = apply_limit_flags(&args, &mut profile) {
        return refuse(json, EXIT_CORRAL_ERROR, "request.invalid", message, vec![]);
    }
    if args.no_protect {
        profile.filesystem.protect.clear();
    }
    if let Some(name) = &args.hostname {
        if let Err(e) = corral_policy::config::validate_hostname(name) {
            let message = format!("--hostname: {e}");
            return refuse(json, EXIT_CORRAL_ERROR, "request.invalid", message, vec![]);
        }
        profile.hostname = name.clone();
    }
    if let Some(tree) = &args.runtime {
        let set = std::path::absolute(tree)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                let t = t
                    .to_str()
                    .ok_or("not UTF-8")?
                    .trim_end_matches('/')
                    .to_string();
                SandboxPath::new(&t).map_err(|e| e.to_string())
            })
            .and_then(|t| profile.set_runtime(t).map_err(|e| e.to_string()));
        if let Err(e) = set {
            let message = format!("--runtime {}: {e}", tree.display());
            return refuse(json, EXIT_CORRAL_ERROR, "request.invalid", message, vec![]);
        }
    }
    let mut request = match request(&args) {
        Ok(r) => r,
        Err((code, message)) => return refuse(json, EXIT_CORRAL_ERROR, &code, message, vec![]),
    };
    let identity = sandbox_identity(&profile);
    // Reduced mode has no tmpfs workspace: a fresh host directory instead,
    // removed afterwards (the guard).
    let _scratch = if args.without_namespaces {
        request.without_namespaces = true;
        match request.workdir {
            Some(_) => None,
            None => match ScratchDir::create(identity) {
                Ok(dir) => {
                    request.workdir = Some(dir.0.clone());
                    request.scratch_workdir = true;
                    Some(dir)
                }
                Err(e) => return refuse(json, EXIT_CORRAL_ERROR, "sandbox.launch", e, vec![]),
            },
        }
    } else {
        None
    };
    // Resolved once, here, before anything of the request is looked at;
    // only the command this run asks for (see `resolve_for_run`).
    let commands = CommandTable::resolve_for_run(
        &profile,
        std::env::var("PATH").ok().as_deref(),
        args.command.first().map(String::as_str),
    );
    let lookup = |name: &str| std::env::var(name).ok();
    let opts = ExecuteOptions {
        output: if json {
            OutputMode::Capture
        } else {
            OutputMode::Stream
        },
        // The CLI is single-threaded: skip a whole program start.
        helper: HelperStart::Fork,
        forward_signals: true,
        cancel: None,
        stdin: None,
        tap: None,
        prestarted: None,
        prepared: None,
        gate: None,
    };
    let run = execute(&profile, &commands, &request, &lookup, opts, &sink);
    match run {
        Err(r) => refuse(json, r.exit_code, &r.code, r.message, r.events),
        Ok(done) => {
            report(&done.outcome, &profile, done.stats.oom_killed);
            if json {
                print_json(&done.result);
            }
            done.result.exit_code
        }
    }
}

/// One line on stderr for each way the run ended abnormally.
fn report(outcome: &Outcome, profile: &Profile, oom_killed: bool) {
    if let Some((_, message)) = &outcome.failure {
        crate::say(message);
    }
    if let Some(message) = outcome.interrupted_message() {
        crate::say(&message);
    }
    if outcome.timed_out {
        let secs = profile.limits.timeout_secs.unwrap_or_default();
        eprintln!("corral: {}", outcome.timeout_message(secs));
    }
    if let Some(kill) = profile
        .limits
        .output_kill_bytes
        .filter(|_| outcome.output_killed)
    {
        eprintln!(
            "corral: output passed {kill} in total on one stream (limits.output_kill); the whole sandbox was killed"
        );
    }
    if oom_killed {
        eprintln!(
            "corral: out of memory: the kernel killed a process at the {} limit",
            profile
                .limits
                .memory_bytes
                .map(|m| m.to_string())
                .unwrap_or_else(|| "memory".into())
        );
    }
}
