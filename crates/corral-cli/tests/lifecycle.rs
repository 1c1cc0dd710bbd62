//! Lifetime: timeouts kill the whole tree, leftovers die with the program,
//! and the sandbox dies with corral.

mod common;
use common::*;

use std::time::{Duration, Instant};

#[test]
fn timeout_kills_the_tree_promptly() {
    let start = Instant::now();
    let (v, out) = run_json(
        &["--timeout", "1"],
        &["sh", "-c", "trap '' TERM; sleep 30 & sleep 30"],
    );
    let took = start.elapsed();
    assert_eq!(v["timed_out"], true);
    assert_eq!(out.status.code(), Some(137));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn leftovers_die_when_the_program_exits() {
    // A double-forked daemon holding stdout would keep corral waiting for
    // EOF if it survived the program.
    let start = Instant::now();
    let (v, _) = run_json(&[], &["sh", "-c", "(setsid sleep 30 &) ; echo started"]);
    assert_eq!(v["stdout"], "started\n");
    assert_eq!(v["exit_code"], 0);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the daemon outlived the program"
    );
}

#[test]
fn sandbox_dies_with_corral() {
    let token = format!("corral-orphan-{}", std::process::id());
    let mut child = corral_run()
        .args(["--", "python3", "-c", "import time; time.sleep(60)", &token])
        .spawn()
        .unwrap();
    let present = || process_running("python3", &token);
    wait_until(10, "sandboxed sleep never started", &present);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until(5, "the sandbox outlived corral", || !present());
}

#[test]
fn signals_to_corral_reach_the_program() {
    use std::io::{BufRead, BufReader};
    let script = "import signal, sys, time\n\
        def bye(*_):\n    print('got TERM', flush=True)\n    sys.exit(7)\n\
        signal.signal(signal.SIGTERM, bye)\n\
        print('ready', flush=True)\n\
        time.sleep(30)\n";
    let mut child = corral_run()
        .args(["--", "python3", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(lines.next().unwrap().unwrap(), "got TERM");
    assert_eq!(
        child.wait().unwrap().code(),
        Some(7),
        "corral exits with the program's status"
    );
}

#[test]
fn a_stalled_reader_does_not_defeat_the_timeout() {
    use std::io::Read;
    let token = format!("corral-stalled-{}", std::process::id());
    // 200 KB is more than the pipes between the program and the reader
    // (who is not reading) hold: the program's write blocks, then the
    // timeout kills it.
    let script =
        "import sys, time\nsys.stdout.write('x' * 200000)\nsys.stdout.flush()\ntime.sleep(60)\n";
    let start = std::time::Instant::now();
    let mut child = corral_run()
        .args(["--timeout", "1", "--", "python3", "-c", script, &token])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sandboxed = || process_running("python3", &token);
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        !sandboxed(),
        "the sandbox outlived its timeout while the reader stalled"
    );
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(137));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "corral ended soon after the kill"
    );
    // Streaming is a pipe: the program could not write more than the
    // reader took (corral buffers nothing for it), and corral added
    // nothing to stdout.
    assert!(
        !out.is_empty() && out.len() < 200000,
        "{} bytes reached the reader",
        out.len()
    );
    assert!(out.iter().all(|&b| b == b'x'), "only the program's bytes");
}

/// corral started with stdin, stdout and stderr closed opens each on
/// `/dev/null` first thing, so that no file, pipe or socket it opens later
/// takes one of their numbers (and the program's output, say, is not
/// written into its control socket). corral's entry does this itself since
/// it skips the Rust runtime's start (`corral_sys::entry`); this fails if
/// it does not.
#[test]
fn closed_standard_streams_are_opened_on_dev_null() {
    let mut child = corral_run_via_bash("exec <&- >&- 2>&- \"$@\"", &[])
        .args(["--", "sh", "-c", "sleep 30 # corral-closed-stdio"])
        .spawn()
        .expect("corral run");
    let pid = child.id();
    wait_until(10, "the sandboxed sleep never started", || {
        process_running("sh", "corral-closed-stdio")
    });
    let links: Vec<String> = (0..3)
        .map(|fd| {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .map(|p| p.display().to_string())
                .unwrap_or_else(|e| format!("unreadable: {e}"))
        })
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(links, ["/dev/null"; 3], "corral's fds 0-2");
}

/// `corral run` with a read-only bind of a directory on a filesystem that
/// stopped answering, started with `--json` and `--timeout SECS`; returns
/// once the sandbox's set-up waits on it.
fn run_hung_on(fs: &HungFs, timeout: &str) -> std::process::Child {
    let bind = format!("{}:/data", fs.sub().display());
    let child = corral_run()
        .args(["--json", "--timeout", timeout, "--ro", &bind])
        .args(["--", "sh", "-c", "echo the program ran"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("corral run");
    fs.expect_line("held", "the sandbox's set-up never reached the filesystem");
    child
}

/// SIGTERM (or Ctrl-C's SIGINT) while the sandbox is still being set up
/// has no program to go to: init holds every signal blocked until it
/// starts one. corral kills the sandbox at once and exits with 128 + the
/// signal, saying so, rather than wait for a set-up that may never end
/// (here a bind on a filesystem that does not answer) until its timeout.
#[test]
fn a_signal_while_the_set_up_hangs_ends_the_run_at_once() {
    let Some(fs) = HungFs::mount() else {
        return;
    };
    let child = run_hung_on(&fs, "30");
    let sent = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let stderr = text(&out.stderr);
    assert!(
        took < Duration::from_secs(10),
        "corral ended {took:?} after SIGTERM (its timeout is 30 s): {stderr}"
    );
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains(
            "interrupted by SIGTERM while the sandbox was being set up (the program never started)"
        ),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)));
    assert_eq!(v["error"]["code"], "run.interrupted", "{v}");
    assert_eq!(v["exit_code"], 143, "{v}");
    assert_eq!(
        v["signal"],
        serde_json::Value::Null,
        "not the program's: {v}"
    );
    assert_eq!(v["timed_out"], false, "{v}");
    assert_eq!(v["stdout"], "", "{v}");
}

/// A timeout that fires while the sandbox is still being set up says the
/// program never started, which points at the set-up rather than at the
/// program.
#[test]
fn a_timeout_while_the_set_up_hangs_says_the_program_never_started() {
    let Some(fs) = HungFs::mount() else {
        return;
    };
    let out = run_hung_on(&fs, "1").wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains(
            "timed out after 1s while the sandbox was being set up (the program never started)"
        ),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(v["signal"], serde_json::Value::Null, "no program: {v}");
}

/// `corral check` looks at the bind sources on the host to warn of missing
/// ones; a filesystem that answers nothing (a hung NFS mount) must not
/// hold the check: after a bounded wait it says so and ends normally.
#[test]
fn check_and_explain_do_not_wait_for_a_filesystem_that_does_not_answer() {
    let Some(fs) = HungFs::mount_answering(false) else {
        return;
    };
    let cfg = fs.dir.path().join("corral.toml");
    std::fs::write(
        &cfg,
        format!(
            "[profile.hung]\nextends = \"code\"\n[profile.hung.filesystem]\nread_only = [\"{}:/data\"]\n",
            fs.sub().display()
        ),
    )
    .expect("write the config");
    let started = Instant::now();
    let out = corral()
        .args(["check", "--json"])
        .arg(&cfg)
        .output()
        .expect("corral check");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "the check took {took:?}");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["warnings"][0]["code"], "host.unanswered", "{v}");

    // `explain` resolves the profile's commands through its binds too.
    let started = Instant::now();
    let out = corral()
        .args(["explain", "hung", "--json", "--config"])
        .arg(&cfg)
        .output()
        .expect("corral explain");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the explanation took {took:?}"
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["warnings"][0]["code"], "host.unanswered", "{v}");
    assert_eq!(
        v["commands"][0]["path"], "NOT RESOLVED (the host did not answer)",
        "{v}"
    );
    assert!(
        text(&out.stderr)
            .contains("warning: the commands and the bind sources were not all looked at"),
        "{}",
        text(&out.stderr)
    );
}

/// One request of profile `hung` (a bind of the FUSE filesystem's `sub`)
/// running `sh -c SCRIPT`, with a 2 s timeout: (status, body, how long it
/// took).
fn post_hung(addr: &str, script: &str) -> (u16, serde_json::Value, Duration) {
    let started = Instant::now();
    let body = serde_json::json!({
        "profile": "hung",
        "command": ["sh", "-c", script],
        "limits": {"timeout_ms": 2000},
    })
    .to_string();
    let (status, _, body) = http(addr, "POST", "/v1/executions", None, Some(&body));
    let v = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{status}: {body}"));
    (status, v, started.elapsed())
}

/// Sends SIGTERM to `server` and waits (at most `within`) for its exit 0.
fn stop_server(server: &mut Server, within: Duration) {
    let pid = server.child.id().to_string();
    let stopping = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM")
        .success());
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait for the server") {
            break status;
        }
        assert!(
            stopping.elapsed() < within,
            "the server did not stop within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// A profile whose bind sits on a filesystem that stops answering (a hung
/// NFS mount) must not take the service down with it: the server starts
/// (that profile is refused until its command table arrives), a run whose
/// plan waits on the filesystem is given up after its bound and recorded
/// as refused, later runs of that profile are refused at once while the
/// lookup still waits, other profiles run all along, the server stops
/// when told, and once the filesystem answers again the profile runs,
/// while the run given up never does.
#[test]
fn serve_outlasts_a_profiles_filesystem_that_stops_answering() {
    let Some(fs) = HungFs::mount_answering(false) else {
        return;
    };
    // A writable bind that answers: where a run given up would leave a
    // trace, were it ever to run.
    let out = fs.dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir out");
    let uid = sandbox_uid();
    std::os::unix::fs::chown(&out, Some(uid), Some(uid)).expect("chown out");
    let extra = format!(
        "[profile.hung]\nextends = \"code\"\n[profile.hung.filesystem]\nread_only = [\"{}:/data\"]\nread_write = [\"{}:/out\"]\n",
        fs.sub().display(),
        out.display()
    );
    // A `python3` outside the system trees first on PATH (as pyenv's shim
    // is): resolving it looks at each bind source, the hung one too.
    let shims = fs.dir.path().join("shims");
    std::fs::create_dir(&shims).expect("mkdir shims");
    let shim = shims.join("python3");
    std::fs::write(&shim, "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n").expect("write the shim");
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod the shim");
    let start = |path: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = serve_config(dir.path(), &extra);
        let started = Instant::now();
        let server = start_server_with_env(dir, &cfg, &[], &[("PATH", path)]);
        (server, started.elapsed())
    };
    let ran_code = |addr: &str| {
        let (status, _, body) = http(
            addr,
            "POST",
            "/v1/executions",
            None,
            Some(r#"{"command": ["sh", "-c", "echo hi"]}"#),
        );
        assert_eq!(status, 200, "{body}");
        assert!(body.contains(r#""stdout":"hi\n""#), "{body}");
    };
    let unanswered = |(status, v, _): &(u16, serde_json::Value, Duration)| {
        assert_eq!(
            (*status, &v["error"]["code"]),
            (422, &"host.unanswered".into()),
            "{v}"
        );
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };

    // Its command table cannot be resolved: the start waits a bounded time.
    let (mut unresolved, took) = start(&format!("{}:/usr/bin:/bin", shims.display()));
    assert!(took < Duration::from_secs(15), "the start took {took:?}");
    let refused = post_hung(&unresolved.addr, "echo hi");
    let message = unanswered(&refused);
    assert!(
        refused.2 < Duration::from_secs(2),
        "refused in {:?}",
        refused.2
    );
    assert!(
        message.contains("not resolved yet") && message.contains(&fs.sub().display().to_string()),
        "{message}"
    );
    ran_code(&unresolved.addr);

    // Tables that resolve (no shim): the runs' plans are what wait. Two
    // servers: one to stop with a plan stuck, one to see the recovery.
    let (planning, _) = start("/usr/bin:/bin");
    let (mut stopped, _) = start("/usr/bin:/bin");
    let stopped_addr = stopped.addr.clone();
    let other = std::thread::spawn(move || post_hung(&stopped_addr, "echo hi"));
    let given_up = post_hung(&planning.addr, "touch /out/given-up; echo hi");
    unanswered(&given_up);
    assert!(
        given_up.2 >= Duration::from_secs(5) && given_up.2 < Duration::from_secs(10),
        "given up after {:?} (the plan's bound is 5 s for a 2 s timeout)",
        given_up.2
    );
    assert!(
        given_up.1["id"].is_string(),
        "recorded like any refusal: {}",
        given_up.1
    );
    unanswered(&other.join().expect("the other server's request"));
    let again = post_hung(&planning.addr, "echo hi");
    assert!(unanswered(&again).contains("still waiting"), "{}", again.1);
    assert!(
        again.2 < Duration::from_secs(1),
        "refused in {:?} while the first waits",
        again.2
    );
    ran_code(&planning.addr);

    // Threads stuck in the filesystem do not hold the servers' stop: the
    // table's threads, and a plan on the runtime's blocking pool.
    stop_server(&mut unresolved, Duration::from_secs(10));
    stop_server(&mut stopped, Duration::from_secs(20));

    // The filesystem's server is back: the lookups return, the profile
    // runs, and the run given up does not (its gate refuses it, and its
    // workspace went with its answer; the unit tests of `execute` and
    // `crate::host` hold the gate to it).
    let daemon = fs.daemon.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-USR1", &daemon])
        .status()
        .expect("kill -USR1")
        .success());
    fs.expect_line("answering", "the FUSE filesystem answering again");
    wait_until(20, "profile `hung` to run again", || {
        let (status, v, _) = post_hung(&planning.addr, "echo hi");
        status == 200 && v["stdout"] == "hi\n"
    });
    assert!(
        !out.join("given-up").exists(),
        "the run given up ran once the filesystem answered"
    );
}
