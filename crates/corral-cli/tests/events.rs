//! The event stream (`--events FILE`): one stamped JSON object per line,
//! every kind with its fields, written as it happens. Network traffic goes
//! to loopback only.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every line of the events file, parsed (a line that is not JSON fails).
fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn of_kind<'a>(events: &'a [serde_json::Value], code: &str) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|e| e["code"] == code).collect()
}

/// sha256sum of `data`, computed by coreutils (independent of corral).
fn sha256sum(data: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(data.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` within a minute of now.
fn assert_recent_rfc3339(ts: &str) {
    let b = ts.as_bytes();
    assert_eq!(b.len(), 24, "{ts}");
    for (i, c) in b.iter().enumerate() {
        let want_digit = !matches!(i, 4 | 7 | 10 | 13 | 16 | 19 | 23);
        assert_eq!(c.is_ascii_digit(), want_digit, "{ts}");
    }
    assert!(ts.ends_with('Z') && &ts[10..11] == "T", "{ts}");
    let out = Command::new("date")
        .args(["-u", "-d", ts, "+%s"])
        .output()
        .unwrap();
    let then: i64 = text(&out.stdout).trim().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!((i64::try_from(now).unwrap() - then).abs() < 60, "{ts}");
}

#[test]
fn a_normal_run_writes_stamped_start_and_exit_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let out = run(
        &["--events", file.to_str().unwrap()],
        &["sh", "-c", "exit 3"],
    );
    assert_eq!(out.status.code(), Some(3));
    let events = lines(&file);
    let hash = sha256sum(r#"["sh","-c","exit 3"]"#);
    let run_id = events[0]["run_id"].as_str().unwrap().to_string();
    assert!(
        run_id.len() == 24 && run_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{run_id}"
    );
    for e in &events {
        assert_recent_rfc3339(e["ts"].as_str().unwrap());
        assert_eq!(e["run_id"], run_id.as_str(), "{e}");
        assert_eq!(e["profile"], "code", "{e}");
        assert_eq!(e["command_sha256"], hash.as_str(), "{e}");
    }
    let start = of_kind(&events, "run.start");
    assert_eq!(start.len(), 1, "{events:?}");
    assert_eq!(start[0]["event"], "run");
    assert_eq!(start[0]["fields"]["command"], "sh");
    assert_eq!(start[0]["fields"]["network"], "none");
    let exit = of_kind(&events, "run.exit");
    assert_eq!(exit.len(), 1, "{events:?}");
    assert_eq!(events.last().unwrap()["code"], "run.exit", "last line");
    let f = &exit[0]["fields"];
    assert_eq!(f["outcome"], "exit", "{f}");
    assert_eq!(f["exit_code"], 3);
    assert_eq!(f["signal"], serde_json::Value::Null);
    assert_eq!(f["limits_hit"], serde_json::json!([]));
    if is_root() {
        assert!(
            of_kind(&events, "limits.unenforced").is_empty(),
            "{events:?}"
        );
    } else {
        // The unprivileged pass runs with --allow-unenforced-limits.
        let u = of_kind(&events, "limits.unenforced");
        assert_eq!(u.len(), 1, "{events:?}");
        assert_eq!(u[0]["event"], "security");
        assert_eq!(
            u[0]["fields"]["limits"],
            serde_json::json!(["memory", "pids"])
        );
    }
    // A second run appends, with an id of its own.
    run(&["--events", file.to_str().unwrap()], &["true"]);
    let again = lines(&file);
    assert!(again.len() > events.len());
    assert_ne!(again.last().unwrap()["run_id"], run_id.as_str());

    // Without --events, stderr carries security events only.
    let out = run(&["--env", "LD_PRELOAD"], &["true"]);
    let err = text(&out.stderr);
    assert!(
        !err.contains("run.start") && !err.contains("run.exit"),
        "{err}"
    );
}

#[test]
fn a_signal_and_a_timeout_are_events() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    run(
        &["--events", file.to_str().unwrap()],
        &["sh", "-c", "kill -TERM $$"],
    );
    let events = lines(&file);
    let exit = of_kind(&events, "run.exit");
    assert_eq!(exit[0]["fields"]["outcome"], "signal", "{events:?}");
    assert_eq!(exit[0]["fields"]["signal"], 15);

    let file = dir.path().join("timeout.jsonl");
    let out = run(
        &["--events", file.to_str().unwrap(), "--timeout", "1"],
        &["sh", "-c", "sleep 30"],
    );
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    let events = lines(&file);
    let timeout = of_kind(&events, "run.timeout");
    assert_eq!(timeout.len(), 1, "{events:?}");
    assert_eq!(timeout[0]["fields"]["timeout_secs"], 1);
    assert_eq!(timeout[0]["level"], "warn");
    let exit = of_kind(&events, "run.exit");
    assert_eq!(exit[0]["fields"]["outcome"], "timeout", "{events:?}");
    assert_eq!(
        exit[0]["fields"]["limits_hit"],
        serde_json::json!(["timeout"])
    );
}

#[test]
fn a_refused_run_ends_with_run_exit() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let out = run(&["--events", file.to_str().unwrap()], &["perl", "-e", "1"]);
    assert_eq!(out.status.code(), Some(125));
    let events = lines(&file);
    let codes: Vec<&str> = events.iter().map(|e| e["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["command.not_allowed", "run.exit"], "{events:?}");
    let f = &events[1]["fields"];
    assert_eq!(f["outcome"], "refused", "{f}");
    assert_eq!(f["error"], "command.not_allowed");
    assert_eq!(f["exit_code"], 125);
    assert_eq!(events[0]["run_id"], events[1]["run_id"]);
}

#[test]
fn an_oom_kill_is_an_event() {
    if !is_root() {
        eprintln!("SKIP: the memory limit needs a cgroup (root on this host)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    // Bounded at 2 GiB; the limit is 64 MiB.
    let bomb = "chunks = []\nfor _ in range(256):\n    chunks.append(bytearray(8 << 20))\n";
    run(
        &[
            "--events",
            file.to_str().unwrap(),
            "--memory",
            "64MiB",
            "--timeout",
            "30",
        ],
        &["python3", "-c", bomb],
    );
    let events = lines(&file);
    let oom = of_kind(&events, "run.oom");
    assert_eq!(oom.len(), 1, "{events:?}");
    assert_eq!(oom[0]["fields"]["memory_bytes"], 64 << 20);
    let exit = of_kind(&events, "run.exit");
    assert_eq!(exit[0]["fields"]["outcome"], "oom", "{events:?}");
    assert_eq!(
        exit[0]["fields"]["limits_hit"],
        serde_json::json!(["memory"])
    );
}

/// A loopback HTTP server (python's http.server) on a free port, killed on
/// drop.
struct Upstream(
    std::process::Child,
    u16,
    #[allow(dead_code)] tempfile::TempDir,
);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn upstream() -> Upstream {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello\n").unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("/usr/bin/python3")
        .args(["-u", "-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("Serving HTTP"), "{line}");
    Upstream(child, port, dir)
}

#[test]
fn a_network_decision_is_on_disk_while_the_run_goes_on() {
    let up = upstream();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let url = format!("http://allowed.test:{}/hello.txt", up.1);
    let mut corral = corral_run()
        .args(["--events", file.to_str().unwrap(), "--timeout", "60"])
        .args(["--allow-domain", &format!("allowed.test:{}", up.1)])
        .args(["--add-host", "allowed.test=127.0.0.1"])
        .args(["--allow-cidr", "127.0.0.1/32"])
        .args(["--", "sh", "-c"])
        .arg(format!(
            "curl -sS {url} && curl -sS http://refused.test/ ; sleep 50"
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let events = lines(&file);
        if !of_kind(&events, "net.denied").is_empty() || Instant::now() > deadline {
            break events;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The run is still going: the lines came as the decisions were taken.
    let still_running = corral.try_wait().unwrap().is_none();
    let _ = corral.kill();
    let _ = corral.wait();
    assert!(still_running, "corral ended early: {seen:?}");
    let allowed = of_kind(&seen, "net.allowed");
    assert_eq!(allowed.len(), 1, "{seen:?}");
    assert_eq!(allowed[0]["fields"]["domain"], "allowed.test");
    assert_eq!(allowed[0]["fields"]["port"], up.1);
    assert!(allowed[0]["fields"]["bytes_down"].as_u64().unwrap() > 0);
    let denied = of_kind(&seen, "net.denied");
    assert_eq!(denied[0]["fields"]["reason"], "net.denied.not_allowed");
    assert_eq!(denied[0]["fields"]["domain"], "refused.test");
    assert!(of_kind(&seen, "run.exit").is_empty(), "{seen:?}");
    // Killed with SIGKILL: what was written stays, and nothing else came.
    assert_eq!(lines(&file).len(), seen.len());
}
