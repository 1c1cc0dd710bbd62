//! `corral`: the command-line front end. Thin by design: argument parsing,
//! printing and exit codes live here; decisions live in `corral-policy` and
//! `corral-launcher`.
#![forbid(unsafe_code)]
// The C `main` comes from `corral_sys::entry!`, which skips the Rust
// runtime's start (a `/proc/self/maps` read and an alternate signal stack
// at every start; see `corral_sys::entry`).
#![cfg_attr(not(test), no_main)]

mod deploy;
mod doctor;
mod explain;
mod run;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use corral_policy::Config;

/// A Linux sandbox for code nobody should trust.
#[derive(Parser)]
#[command(name = "corral", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// `corral run`'s arguments parsed on their own: the same arguments, help
/// and errors as `Cli`'s `run` (a test compares them), without building
/// every other subcommand's arguments first, which `Cli` does whatever
/// the subcommand (~14 heap pages and their clap work at each `corral
/// run`, issue 17).
#[derive(Parser)]
#[command(name = "corral", about = "Run a command in a sandbox", long_about = None)]
struct RunOnly {
    #[command(flatten)]
    args: run::RunArgs,
}

/// The command line: `corral run ...` through [`RunOnly`], anything else
/// through [`Cli`].
fn parse_command_line() -> Result<Cli, clap::Error> {
    if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
        return parse_run(std::env::args_os()).map(|args| Cli {
            command: Cmd::Run(Box::new(args)),
        });
    }
    Cli::try_parse()
}

/// `argv` (the program's name, `run`, its arguments) through [`RunOnly`],
/// named as `Cli` names its subcommand: the program's file name and `run`.
fn parse_run(
    argv: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<run::RunArgs, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let mut argv = argv.into_iter();
    let program = argv
        .next()
        .as_deref()
        .and_then(|p| std::path::Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "corral".into());
    // The next item, `run`, stands for the program's name.
    let matches = RunOnly::command()
        .bin_name(format!("{program} run"))
        .try_get_matches_from(argv)?;
    RunOnly::from_arg_matches(&matches).map(|r| r.args)
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command in a sandbox.
    Run(Box<run::RunArgs>),
    /// Install a Python or Node source into a pinned, read-only tree
    /// (sandboxed install and build phases) with a manifest.
    Deploy(Box<deploy::DeployArgs>),
    /// Validate a config file; errors name the key and the line.
    Check {
        /// The config file.
        #[arg(required_unless_present = "config")]
        file: Option<PathBuf>,
        /// The config file, as the other commands take it (`--config FILE`
        /// is the same as `FILE`).
        #[arg(long, conflicts_with = "file")]
        config: Option<PathBuf>,
        /// Print one JSON object (`ok`; `profiles`, `mcp_servers` and
        /// `warnings`, or `error`).
        #[arg(long)]
        json: bool,
    },
    /// Print the effective sandbox of a profile: mounts, env, commands,
    /// limits, layers.
    Explain {
        /// Profile name (default: code).
        profile: Option<String>,
        /// Config file with extra profiles.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Report what this host supports, and what each missing piece means.
    Doctor {
        /// Print one JSON object (`kernel`, `uid`, `ok`, `findings`).
        #[arg(long)]
        json: bool,
    },
    /// Run the HTTP execution service (with MCP at /mcp).
    Serve {
        /// Config file with profiles and a [server] section.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listening address, e.g. 127.0.0.1:8080 (overrides the config).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
        /// Executions running at once (overrides the config).
        #[arg(long, value_name = "N")]
        max_concurrent: Option<u32>,
        /// Enable code mode: `{"language", "code"}` requests and the MCP
        /// `run_code` tool.
        #[arg(long)]
        code_mode: bool,
        /// Log filter for the JSON logs on stderr: a level (error, warn,
        /// info, debug, trace, off) or directives such as
        /// `info,corral_server=debug`. Default: $CORRAL_LOG, else info.
        #[arg(long, value_name = "FILTER")]
        log_level: Option<String>,
    },
    /// Serve MCP over stdin/stdout (one session; for MCP clients that
    /// start corral themselves).
    Mcp {
        /// Config file with profiles and a [server] section.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Enable code mode: the `run_code` tool.
        #[arg(long)]
        code_mode: bool,
        /// Log filter for the JSON logs on stderr (never stdout): a level
        /// or directives. Default: $CORRAL_LOG, else info.
        #[arg(long, value_name = "FILTER")]
        log_level: Option<String>,
    },
}

#[cfg(not(test))]
corral_sys::entry!(corral_main);

// Unit tests have the test harness's `main`; this keeps the program's
// code checked as reachable there.
#[cfg(test)]
fn main() {
    corral_main()
}

/// The program: what `main` would be (see `corral_sys::entry`).
fn corral_main() -> ! {
    // Re-entered as the sandbox helper: go there before anything else runs
    // (no argument parsing, no threads, no async runtime).
    if corral_launcher::is_helper_invocation(std::env::args_os().nth(1).as_deref()) {
        corral_launcher::helper_main();
    }
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(e) => std::process::exit(usage_error(e)),
    };
    if !matches!(
        cli.command,
        Cmd::Run(_) | Cmd::Mcp { .. } | Cmd::Serve { .. } | Cmd::Deploy(_)
    ) {
        // Reports piped into `head` end quietly; `run` handles EPIPE itself
        // so the sandbox's output drain never stops; `mcp` sees EPIPE when
        // its client goes away and cleans up; `serve` must outlive a closed
        // stderr (its logs are then dropped); `deploy` must finish or clean
        // up its staging directory whatever happens to its reader.
        corral_sys::signal::default_sigpipe();
    }
    let code = match cli.command {
        Cmd::Run(args) => run::run(*args),
        Cmd::Deploy(args) => deploy::deploy(*args),
        Cmd::Check { file, config, json } => match file.or(config) {
            Some(file) => check(&file, json),
            // clap requires one of the two.
            None => {
                say("corral check: name the config file: `corral check FILE`");
                corral_launcher::EXIT_CORRAL_ERROR
            }
        },
        Cmd::Explain {
            profile,
            config,
            json,
        } => explain::explain(profile.as_deref(), config.as_deref(), json),
        Cmd::Doctor { json } => doctor::doctor(json),
        Cmd::Serve {
            config,
            listen,
            max_concurrent,
            code_mode,
            log_level,
        } => serve(
            config.as_deref(),
            listen,
            max_concurrent,
            code_mode,
            log_level.as_deref(),
        ),
        Cmd::Mcp {
            config,
            code_mode,
            log_level,
        } => mcp(config.as_deref(), code_mode, log_level.as_deref()),
    };
    std::process::exit(code);
}

/// Help and version go to stdout with status 0; a usage error is one of
/// corral's own errors (125), with a JSON result when `--json` was asked.
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return 0;
    }
    let json = std::env::args_os()
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    let message = e.render().to_string();
    // The first paragraph: the complaint and, for missing arguments, which.
    let first = message
        .split("\n\n")
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // Only `run` answers with a run result; the other commands have
    // objects of their own, so a usage error there is a bare error object.
    let is_run = std::env::args_os().nth(1).is_some_and(|a| a == "run");
    if json && !is_run {
        say(&first);
        println!(
            "{}",
            serde_json::json!({
                "ok": false,
                "error": {"code": "request.invalid", "message": first},
            })
        );
        return corral_launcher::EXIT_CORRAL_ERROR;
    }
    if json {
        return run::refuse(
            true,
            corral_launcher::EXIT_CORRAL_ERROR,
            "request.invalid",
            first,
            vec![],
        );
    }
    let _ = e.print();
    corral_launcher::EXIT_CORRAL_ERROR
}

/// `corral serve`: the async runtime starts here, after the helper
/// dispatch, so the sandbox helper never runs in a threaded process.
fn serve(
    config: Option<&std::path::Path>,
    listen: Option<std::net::SocketAddr>,
    max_concurrent: Option<u32>,
    code_mode: bool,
    log_level: Option<&str>,
) -> i32 {
    if let Err(e) = corral_server::init_logging(log_level) {
        say(&e.to_string());
        return corral_launcher::EXIT_CORRAL_ERROR;
    }
    let file = config.map(std::path::Path::to_path_buf);
    let mut config = match load_config(config) {
        Ok(c) => c,
        Err(e) => {
            say(&e.to_string());
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
    };
    if let Some(l) = listen {
        config.server.listen = l;
    }
    if let Some(m) = max_concurrent {
        if m == 0 {
            say("--max-concurrent must be at least 1");
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
        config.server.max_concurrent = m;
        for t in &mut config.server.tenants {
            t.max_concurrent = t.max_concurrent.min(m);
        }
    }
    if code_mode {
        config.server.code_mode = true;
    }
    if let Err(code) = private_mounts(&config) {
        return code;
    }
    run_async(corral_server::serve(config, file), SERVE_STOP_WAIT)
}

/// Gives the server its own mount namespace, so workspaces can be tmpfs
/// mounts of `workspace_size` (while the process is still single-threaded:
/// before the async runtime). Fails closed unless the config accepts
/// unbounded workspaces; the error is the exit status.
fn private_mounts(config: &Config) -> Result<(), i32> {
    corral_server::enter_private_mounts(config.server.unbounded_workspaces).map_err(|e| {
        say(&e.to_string());
        corral_launcher::EXIT_CORRAL_ERROR
    })
}

/// Runs a server future on a multi-threaded runtime built here, after the
/// helper dispatch; maps its outcome to an exit status.
fn run_async(
    fut: impl std::future::Future<Output = Result<(), corral_server::ServerError>>,
    stop_wait: std::time::Duration,
) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say(&format!("cannot start the async runtime: {e}"));
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
    };
    let code = match runtime.block_on(fut) {
        Ok(()) => 0,
        Err(e) => {
            say(&e.to_string());
            corral_launcher::EXIT_CORRAL_ERROR
        }
    };
    // The server has waited for what it must (its executions and their
    // sandboxes). What the runtime still holds ends now: its tasks are
    // dropped (the server's state with them, which removes its directory),
    // and a blocking task still running (a session's workspace removal,
    // or a look at a filesystem that does not answer, which may never
    // end) gets a bounded wait; dropping the runtime would wait for ever.
    runtime.shutdown_timeout(stop_wait);
    code
}

/// How long a stopping `corral serve` waits for the runtime's tasks and
/// blocking tasks after it has finished its own work (its state's removal
/// of its directory among them).
const SERVE_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The same for `corral mcp`, shorter: a read of a standard input that is
/// not a pipe (a terminal, a socket) runs on the blocking pool and ends
/// only with input, so a stop by signal always waits this long then.
const MCP_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `corral mcp`: MCP over stdio. stdout carries the protocol and nothing
/// else; messages and logs go to stderr.
fn mcp(config: Option<&std::path::Path>, code_mode: bool, log_level: Option<&str>) -> i32 {
    if let Err(e) = corral_server::init_logging(log_level) {
        say(&e.to_string());
        return corral_launcher::EXIT_CORRAL_ERROR;
    }
    let mut config = match load_config(config) {
        Ok(c) => c,
        Err(e) => {
            say(&e.to_string());
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
    };
    if code_mode {
        config.server.code_mode = true;
    }
    if let Err(code) = private_mounts(&config) {
        return code;
    }
    run_async(corral_server::serve_stdio(config), MCP_STOP_WAIT)
}

/// How long `corral check` waits for the host's answers about the bind
/// sources it names: a bind on a filesystem that does not answer (a hung
/// NFS mount) must not hold a config check.
const HOST_CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `look` (a look at the host's filesystem) on a thread of its own
/// and waits at most [`HOST_CHECK_WAIT`] for it: `None` past that (the
/// thread is left to the process's exit).
pub(crate) fn within_host_wait<T: Send + 'static>(
    look: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    corral_launcher::all_within(HOST_CHECK_WAIT, "host-paths", vec![look])
        .pop()
        .flatten()
}

/// The warning that the host did not answer within [`HOST_CHECK_WAIT`]:
/// `what` was not all looked at.
pub(crate) fn host_unanswered(what: &str) -> corral_launcher::MissingHostPath {
    corral_launcher::MissingHostPath {
        profile: String::new(),
        key: "filesystem",
        path: String::new(),
        code: "host.unanswered",
        message: format!(
            "{what} not all looked at: the host did not answer within {}s (a filesystem that does not answer, such as a hung NFS mount?); runs of a profile that binds it would wait on it too",
            HOST_CHECK_WAIT.as_secs()
        ),
    }
}

/// [`corral_launcher::missing_host_paths`], bounded by
/// [`within_host_wait`]; past the wait, [`host_unanswered`].
fn host_warnings(config: &Config) -> Vec<corral_launcher::MissingHostPath> {
    let profiles = config.clone();
    within_host_wait(move || corral_launcher::missing_host_paths(&profiles))
        .unwrap_or_else(|| vec![host_unanswered("the bind sources were")])
}

/// `corral check FILE [--json]`. The JSON object is
/// `{"file", "ok": true, "profiles": [...], "mcp_servers": [...],
/// "warnings": [...]}` (see [`corral_launcher::missing_host_paths`]) or
/// `{"file", "ok": false, "error": {"code": "config.invalid", "message",
/// "line", "key"}}`, never a run result.
fn check(file: &std::path::Path, json: bool) -> i32 {
    match Config::load(file) {
        Ok(config) => {
            let warnings = host_warnings(&config);
            let names: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
            let servers: Vec<&str> = config
                .server
                .mcp_servers
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"file": file, "ok": true, "profiles": names, "mcp_servers": servers, "warnings": warnings})
                );
            } else {
                for w in &warnings {
                    say(&format!("warning: {}", w.message));
                }
                // Supervised MCP servers are named only when there are some.
                let servers = match servers.len() {
                    0 => String::new(),
                    1 => format!("; 1 MCP server: {}", servers[0]),
                    n => format!("; {n} MCP servers: {}", servers.join(", ")),
                };
                println!(
                    "{}: ok ({} profiles: {}{servers})",
                    file.display(),
                    names.len(),
                    names.join(", ")
                );
            }
            0
        }
        Err(e) => {
            crate::say(&e.to_string());
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "file": file,
                        "ok": false,
                        "error": {
                            "code": "config.invalid",
                            "message": e.to_string(),
                            "line": e.line,
                            "key": (!e.key.is_empty()).then_some(&e.key),
                        },
                    })
                );
            }
            corral_launcher::EXIT_CORRAL_ERROR
        }
    }
}

/// Prints one of corral's own messages on stderr. Messages quote
/// untrusted text (config values, command names, paths), so control
/// characters are shown escaped: a hostile string cannot drive the
/// operator's terminal.
pub(crate) fn say(message: &str) {
    let shown: String = message
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect();
    // A closed stderr is no reason to stop (or panic) half-way.
    let _ = writeln!(std::io::stderr(), "corral: {shown}");
}

/// Loads the config file if one is given, else the built-in profiles.
pub(crate) fn load_config(
    path: Option<&std::path::Path>,
) -> Result<Config, corral_policy::ConfigError> {
    Config::load_wanted(path, corral_policy::builtin::NAMES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `run` as `Cli` has it, built (usage and help need the whole tree).
    fn full_run() -> clap::Command {
        let mut cli = Cli::command();
        cli.build();
        cli.find_subcommand("run")
            .cloned()
            .expect("a run subcommand")
    }

    #[test]
    fn run_alone_has_the_same_help_usage_and_errors_as_run_in_the_whole_command() {
        let mut full = full_run();
        // As `parse_run` names it for a program called `corral`.
        let mut alone = RunOnly::command().bin_name("corral run");
        alone.build();
        assert_eq!(
            full.render_long_help().to_string(),
            alone.render_long_help().to_string()
        );
        assert_eq!(
            full.render_help().to_string(),
            alone.render_help().to_string()
        );
        assert_eq!(
            full.render_usage().to_string(),
            alone.render_usage().to_string()
        );
        assert!(alone
            .render_usage()
            .to_string()
            .contains("corral run [OPTIONS] -- <COMMAND>..."));
        // The same complaint, word for word, for each kind of mistake,
        // under the program's own name.
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        for program in ["corral", "/opt/corral-dev/bin/corral-dev"] {
            for bad in [
                &["--bogus", "--", "true"][..],
                &[][..],
                &["--memory"][..],
                &["-x", "--", "true"][..],
                &["--json", "--json", "--", "true"][..],
                &["--help"][..],
                &["--version"][..],
            ] {
                let argv = os(&[&[program, "run"], bad].concat());
                let via_cli = Cli::try_parse_from(argv.clone())
                    .err()
                    .map(|e| (e.kind(), e.render().to_string()));
                let alone = parse_run(argv)
                    .err()
                    .map(|e| (e.kind(), e.render().to_string()));
                assert!(via_cli.is_some(), "{bad:?} parsed");
                assert_eq!(via_cli, alone, "{program} {bad:?}");
            }
        }
        // And the same arguments when they are right.
        let argv = os(&[
            "corral", "run", "--memory", "64MiB", "--json", "--", "python3", "-c", "print(1)",
        ]);
        let Cmd::Run(via_cli) = Cli::try_parse_from(argv.clone()).unwrap().command else {
            panic!("not run");
        };
        let alone = parse_run(argv).unwrap();
        assert_eq!(format!("{via_cli:?}"), format!("{alone:?}"));
    }
}
