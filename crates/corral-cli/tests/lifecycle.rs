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
