//! `corral run`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use corral_policy::env::{parse_assignment, EnvRequest};
use corral_policy::{AuditEvent, MountSpec};
use corral_runtime::launch::Outcome;
use corral_runtime::plan::SandboxIdentity;
use corral_runtime::result::ErrorInfo;
use corral_runtime::{
    build_plan, launch, CommandTable, Enforced, LaunchOptions, OutputMode, RunRequest, RunResult,
    EXIT_CORRAL_ERROR,
};

/// Bytes of each stream kept in `--json` mode.
const JSON_CAPTURE_LIMIT: usize = 16 << 20;

/// Arguments of `corral run`.
#[derive(Args)]
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
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// Print one JSON result object instead of streaming output.
    #[arg(long)]
    json: bool,
    /// Append security events (JSON lines) to this file instead of stderr.
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Where security events go.
struct EventSink(Option<PathBuf>);

impl EventSink {
    fn emit(&self, events: &[AuditEvent]) {
        if events.is_empty() {
            return;
        }
        let mut text = String::new();
        for e in events {
            text.push_str(&e.to_json_line());
            text.push('\n');
        }
        match &self.0 {
            Some(path) => {
                let written = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| f.write_all(text.as_bytes()));
                if let Err(e) = written {
                    eprintln!("corral: cannot write events to {}: {e}", path.display());
                    eprint!("{text}");
                }
            }
            None => eprint!("{text}"),
        }
    }
}

fn empty_result(exit_code: i32, error: ErrorInfo, events: Vec<AuditEvent>) -> RunResult {
    RunResult {
        exit_code,
        signal: None,
        timed_out: false,
        stdout: String::new(),
        stderr: String::new(),
        stdout_bytes: 0,
        stderr_bytes: 0,
        stdout_truncated: false,
        stderr_truncated: false,
        wall_ms: 0,
        error: Some(error),
        events,
        enforced: None,
    }
}

/// Prints a refusal the way the mode wants, returns the exit code.
fn refuse(json: bool, code: i32, error: ErrorInfo, events: Vec<AuditEvent>) -> i32 {
    eprintln!("corral: {}", error.message);
    if json {
        print_json(&empty_result(code, error, events));
    }
    code
}

fn print_json(result: &RunResult) {
    match serde_json::to_string(result) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("corral: cannot encode the result: {e}"),
    }
}

fn usage_error(json: bool, code: &str, message: String) -> i32 {
    refuse(
        json,
        EXIT_CORRAL_ERROR,
        ErrorInfo {
            code: code.into(),
            message,
        },
        vec![],
    )
}

/// Runs `corral run`; returns the exit status.
pub fn run(args: RunArgs) -> i32 {
    let sink = EventSink(args.events.clone());
    let config = match crate::load_config(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return usage_error(args.json, "config.invalid", e.to_string()),
    };
    let mut profile = match config.profile(&args.profile) {
        Ok(p) => p.clone(),
        Err(e) => return usage_error(args.json, "config.unknown_profile", e.to_string()),
    };
    if let Some(t) = args.timeout {
        if t == 0 {
            return usage_error(
                args.json,
                "request.invalid",
                "--timeout must be at least 1 second".into(),
            );
        }
        profile.limits.timeout_secs = Some(t);
    }
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
            match MountSpec::parse(spec, cwd.as_deref()) {
                Ok(m) => out.push(m),
                Err(e) => {
                    return usage_error(
                        args.json,
                        "mount.invalid",
                        format!("--ro/--rw {spec}: {e}"),
                    )
                }
            }
        }
    }
    let mut env = EnvRequest {
        pass: args.pass_env.clone(),
        set: Vec::new(),
    };
    for assignment in &args.set_env {
        match parse_assignment(assignment) {
            Ok(kv) => env.set.push(kv),
            Err(e) => return usage_error(args.json, "env.invalid", format!("--set-env: {e}")),
        }
    }
    request.env = env;
    // Resolved once, here, before anything of the request is looked at.
    let commands = CommandTable::resolve(&profile, std::env::var("PATH").ok().as_deref());
    let identity = SandboxIdentity::for_current_process(&profile);
    let lookup = |name: &str| std::env::var(name).ok();
    let (plan, mut events) = match build_plan(&profile, &commands, &request, identity, &lookup) {
        Ok(p) => p,
        Err(e) => {
            let events: Vec<AuditEvent> = e.event().cloned().into_iter().collect();
            sink.emit(&events);
            let info = ErrorInfo {
                code: e.code().into(),
                message: e.to_string(),
            };
            return refuse(args.json, e.exit_code(), info, events);
        }
    };
    sink.emit(&events);
    let opts = LaunchOptions {
        output: if args.json {
            OutputMode::Capture {
                limit: JSON_CAPTURE_LIMIT,
            }
        } else {
            OutputMode::Inherit
        },
        timeout: profile.limits.timeout_secs.map(Duration::from_secs),
        forward_signals: !args.json,
    };
    let outcome = match launch(&plan, &opts) {
        Ok(o) => o,
        Err(e) => return usage_error(args.json, "sandbox.launch", e.to_string()),
    };
    if let Some((_, message)) = &outcome.failure {
        eprintln!("corral: {message}");
    }
    if outcome.timed_out {
        eprintln!(
            "corral: timed out after {}s; the whole sandbox was killed",
            profile.limits.timeout_secs.unwrap_or_default()
        );
    }
    if args.json {
        let enforced = outcome
            .failure
            .as_ref()
            .is_none_or(|(k, _)| {
                matches!(
                    k,
                    corral_runtime::protocol::FailureKind::ExecNotFound
                        | corral_runtime::protocol::FailureKind::ExecFailed
                )
            })
            .then(|| Enforced::full_sandbox(identity.uid, identity.gid));
        let error = outcome.failure.as_ref().map(|(kind, message)| ErrorInfo {
            code: Outcome::failure_code(*kind).into(),
            message: message.clone(),
        });
        let result = RunResult {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            timed_out: outcome.timed_out,
            stdout: String::from_utf8_lossy(&outcome.stdout.data).into_owned(),
            stderr: String::from_utf8_lossy(&outcome.stderr.data).into_owned(),
            stdout_bytes: outcome.stdout.total,
            stderr_bytes: outcome.stderr.total,
            stdout_truncated: outcome.stdout.truncated(),
            stderr_truncated: outcome.stderr.truncated(),
            wall_ms: outcome.wall.as_millis() as u64,
            error,
            events: std::mem::take(&mut events),
            enforced,
        };
        print_json(&result);
    }
    outcome.exit_code
}
