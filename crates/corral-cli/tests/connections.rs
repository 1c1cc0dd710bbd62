//! The service under hostile connections: idle, half-sent, dripped and
//! unread requests are cut on time, a connection cap answers 503 instead
//! of running out of descriptors, and `/healthz` keeps answering for
//! everyone meanwhile. Everything on loopback, bounded in count and time.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Seconds until the server closes `s` (reads until EOF or a reset),
/// reading whatever it sent; at most `max`.
fn closed_after(s: &mut TcpStream, max: Duration) -> Option<f64> {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 65536];
    while start.elapsed() < max {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed().as_secs_f64()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed().as_secs_f64()),
        }
    }
    None
}

/// `/healthz` over a fresh connection: (status, seconds it took).
fn healthz(addr: &str) -> (u16, f64) {
    let t = Instant::now();
    let (status, _, _) = http(addr, "GET", "/healthz", None, None);
    (status, t.elapsed().as_secs_f64())
}

#[test]
fn two_thousand_idle_connections_without_a_token_neither_stop_healthz_nor_stay() {
    // The test's own side needs the descriptors too (unprivileged, the
    // soft limit is often 1024).
    let files = corral_sys::process::raise_open_files().unwrap();
    assert!(
        files >= 2200,
        "this test holds 2000 connections and needs an open-file limit of 2200, not {files} (ulimit -Hn)"
    );
    let server = start_server("header_timeout_secs = 3\n", &[]);
    // A thousand silent connections and a thousand that sent half a
    // request line and stopped.
    let mut held: Vec<TcpStream> = (0..2000)
        .map(|i| {
            let mut s = TcpStream::connect(&server.addr).unwrap();
            if i % 2 == 1 {
                s.write_all(b"POST /v1/executions HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            s
        })
        .collect();
    let (status, took) = healthz(&server.addr);
    assert_eq!(status, 200);
    assert!(
        took < 1.0,
        "/healthz took {took} s beside 2000 idle connections"
    );
    // Every one is cut once its headers are late, none much later.
    let start = Instant::now();
    for s in &mut held {
        let left = Duration::from_secs(10).saturating_sub(start.elapsed());
        assert!(
            closed_after(s, left.max(Duration::from_millis(1))).is_some(),
            "an idle connection was still open {:?} after the flood",
            start.elapsed()
        );
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    let (status, _) = healthz(&server.addr);
    assert_eq!(status, 200);
}

#[test]
fn a_dripped_body_is_cut_at_the_body_deadline() {
    let server = start_server("body_timeout_secs = 2\n", &[]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let body = r#"{"command":["true"]}"#;
    write!(
        s,
        "POST /v1/executions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.addr,
        body.len() + 100
    )
    .unwrap();
    // A byte a second: every single read is quick, the whole is not.
    let start = Instant::now();
    let mut answer = Vec::new();
    s.set_read_timeout(Some(Duration::from_millis(900)))
        .unwrap();
    for b in body.bytes().chain(std::iter::repeat(b' ')).take(40) {
        if s.write_all(&[b]).is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "the dripping body was read for {:?}",
        start.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 4"), "answer: {answer}");
    assert!(answer.contains("body_timeout_secs"), "answer: {answer}");
}

#[test]
fn past_the_connection_cap_a_connection_is_answered_503_and_the_cap_frees() {
    let server = start_server("max_connections = 16\nheader_timeout_secs = 2\n", &[]);
    let held: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    // Give the server time to take them all.
    std::thread::sleep(Duration::from_millis(300));
    let (status, head, body) = http(&server.addr, "GET", "/healthz", None, None);
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert!(body.contains("\"busy\""), "{body}");
    // The idle ones are cut after their header deadline: room again.
    wait_until(10, "the cap frees as idle connections are cut", || {
        healthz(&server.addr).0 == 200
    });
    drop(held);
}

#[test]
fn a_client_that_stops_reading_is_disconnected_and_its_execution_ends() {
    let server = start_server("write_stall_secs = 2\n", &[]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let body = serde_json::json!({
        "command": ["python3", "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"],
        "limits": {"timeout_ms": 25000},
    })
    .to_string();
    write!(
        s,
        "POST /v1/executions/stream HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    // The stream starts; then nothing more is read: the socket buffers
    // fill, the server's writes stall.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    let start = Instant::now();
    let closed = closed_after(&mut s, Duration::from_secs(20));
    assert!(
        closed.is_some(),
        "the server kept an unread stream open for {:?} more",
        start.elapsed()
    );
    // Cut by the stall deadline, well before the execution's own 25 s.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "closed only after {:?}",
        started.elapsed()
    );
    // The execution it fed ended with it (no sandbox left writing). Its
    // own program text, not a fragment another process's command line
    // may hold.
    wait_until(30, "the sandbox of the abandoned stream is gone", || {
        !process_running("python3", "sys.stdout.write('x' * 65536)")
    });
    let (status, _) = healthz(&server.addr);
    assert_eq!(status, 200);
}

#[test]
fn the_cap_must_fit_the_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(dir.path(), "max_connections = 4000000000\n");
    let out = corral()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("max_connections") && err.contains("RLIMIT_NOFILE"),
        "{err}"
    );
}

/// Sends `raw` on a fresh connection and reads the answer's status line
/// (0 when the server closed without one).
fn raw_status(addr: &str, raw: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = s.write_all(raw);
    let mut head = [0u8; 12];
    match s.read_exact(&mut head) {
        Ok(()) => std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        Err(_) => 0,
    }
}

#[test]
fn a_thousand_requests_at_four_times_the_cap_among_hostile_clients_are_all_answered_and_leak_nothing(
) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut server = start_server(
        "max_concurrent = 4\nheader_timeout_secs = 2\nbody_timeout_secs = 3\nwrite_stall_secs = 2\n",
        &[],
    );
    let addr = server.addr.clone();
    let token = format!("corral-load-{}", std::process::id());
    let done = Arc::new(AtomicBool::new(false));
    // Hostile clients, until the legitimate load is over: half-sent
    // headers, a body announced and never sent, malformed JSON, a
    // request for a long sleep whose client leaves at once, and a request
    // for a mebibyte of output that is never read.
    let hostile: Vec<_> = (0..4)
        .map(|kind| {
            let (addr, token, done) = (addr.clone(), token.clone(), done.clone());
            std::thread::spawn(move || {
                let mut sent = 0usize;
                while !done.load(Ordering::Relaxed) && sent < 400 {
                    sent += 1;
                    let post = |body: &str| {
                        format!(
                            "POST /v1/executions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    match kind {
                        0 => {
                            let mut s = TcpStream::connect(&addr).unwrap();
                            let _ = s.write_all(b"POST /v1/executions HTTP/1.1\r\nHost: x\r\n");
                            std::thread::sleep(Duration::from_millis(50));
                            let _ = s.write_all(
                                b"Content-Type: application/json\r\nContent-Length: 99999\r\n\r\n{",
                            );
                            // Held past the body deadline on the next turn.
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        1 => {
                            let status = raw_status(&addr, post("{\"command\": [").as_bytes());
                            assert!(matches!(status, 400 | 0), "malformed JSON got {status}");
                        }
                        2 => {
                            let body = format!(
                                r#"{{"command": ["sh", "-c", "sleep 30; echo {token}"]}}"#
                            );
                            let mut s = TcpStream::connect(&addr).unwrap();
                            let _ = s.write_all(post(&body).as_bytes());
                            std::thread::sleep(Duration::from_millis(100));
                            drop(s); // the client leaves: its sandbox must go
                        }
                        _ => {
                            let body = r#"{"command": ["python3", "-c", "import sys; sys.stdout.write('y' * (1 << 20))"]}"#;
                            let mut s = TcpStream::connect(&addr).unwrap();
                            let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
                            let _ = s.write_all(post(body).as_bytes());
                            let mut one = [0u8; 1];
                            let _ = s.read(&mut one); // then never reads again
                            std::thread::sleep(Duration::from_millis(300));
                        }
                    }
                }
                sent
            })
        })
        .collect();
    // The legitimate load: 1,000 requests from 16 clients at once, four
    // times the cap. Each gets its result or a 429.
    let ok = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let legit: Vec<_> = (0..16)
        .map(|c| {
            let (addr, token, ok, busy) = (addr.clone(), token.clone(), ok.clone(), busy.clone());
            std::thread::spawn(move || {
                for i in 0..(1000 / 16 + usize::from(c < 1000 % 16)) {
                    let body = format!(r#"{{"command": ["sh", "-c", "echo {token}-{c}-{i}"]}}"#);
                    let (status, _, answer) =
                        http(&addr, "POST", "/v1/executions", None, Some(&body));
                    match status {
                        200 => {
                            let v: serde_json::Value = serde_json::from_str(&answer)
                                .unwrap_or_else(|e| panic!("{e}: {answer}"));
                            assert_eq!(v["stdout"], format!("{token}-{c}-{i}\n"), "{v}");
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        429 => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        other => panic!("a legitimate request got {other}: {answer}"),
                    }
                }
            })
        })
        .collect();
    for t in legit {
        t.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let hostile_sent: usize = hostile.into_iter().map(|t| t.join().unwrap()).sum();
    let (ok, busy) = (ok.load(Ordering::Relaxed), busy.load(Ordering::Relaxed));
    assert_eq!(ok + busy, 1000);
    assert!(ok >= 100, "only {ok} of 1000 ran ({busy} busy)");
    eprintln!(
        "1000 requests in {:.1} s: {ok} ran, {busy} answered 429; {hostile_sent} hostile requests",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(healthz(&addr).0, 200);
    // Nothing left running once the abandoned executions are cancelled:
    // no sandbox, no workspace, no workspace mount; only the sandboxes
    // built ahead for coming requests, each with its workspace.
    wait_until(20, "a sandbox of an abandoned request outlived it", || {
        !process_running("sh", &token)
    });
    let work = server.work();
    let pid = server.child.id();
    let workspaces = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("corral-ws-"))
            .count()
    };
    let mounts = || {
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .unwrap()
            .matches("corral-workspace")
            .count()
    };
    wait_until(20, "workspaces left behind", || {
        let held = prepared_sandboxes(pid).len();
        // (Unprivileged, the server has no mount namespace of its own and
        // workspaces are plain directories.)
        held == 4
            && workspaces(&work) == 0
            && workspaces(&work.join("ahead")) == held
            && [0, held].contains(&mounts())
    });
    // A graceful stop leaves no cgroup either.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(cgroups_of(pid), Vec::<String>::new());
}

/// Resident set of process `pid`, bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

#[test]
fn unread_answers_are_held_within_the_tenants_answer_budget() {
    // Each answer carries a mebibyte of control bytes on stdout and on
    // stderr: about 12 MiB of escaped JSON. Twelve clients ask and never
    // read. Without a budget each answer past what the kernel's socket
    // buffers take stays in the server's memory until the write-stall
    // deadline; with a 4 MiB budget one is in flight at a time and the
    // others wait, holding their slots (so later ones get 429).
    let server = start_server(
        "max_concurrent = 4\nwrite_stall_secs = 6\ntenant_answer_bytes = \"4MiB\"\n",
        &[],
    );
    let pid = server.child.id();
    let body = r#"{"command": ["python3", "-c", "import sys; b = chr(1) * (1 << 20); sys.stdout.write(b); sys.stderr.write(b)"]}"#;
    let request = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    );
    // Warm up: one answer read in full.
    let (status, _, answer) = http(&server.addr, "POST", "/v1/executions", None, Some(body));
    assert_eq!(status, 200, "{}", &answer[..answer.len().min(300)]);
    assert!(answer.len() > 10 << 20, "{} bytes", answer.len());
    let base = rss(pid);
    let mut held = Vec::new();
    let mut peak = base;
    for _ in 0..12 {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        held.push(s); // never read
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(50));
            peak = peak.max(rss(pid));
        }
    }
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(rss(pid));
    }
    let growth = peak.saturating_sub(base);
    eprintln!("RSS {base} -> peak {peak}: +{} MiB", growth >> 20);
    assert!(
        growth < 48 << 20,
        "twelve unread answers grew the server by {} MiB",
        growth >> 20
    );
    // Another client is still served meanwhile (or told to retry).
    let (status, _) = healthz(&server.addr);
    assert_eq!(status, 200);
    drop(held);
}

#[test]
fn an_unread_stream_of_control_bytes_keeps_the_servers_memory_bounded() {
    // Control bytes grow sixfold when JSON-escaped; a queue counted in
    // events rather than bytes once pinned ~120 MiB per unread stream.
    let server = start_server("write_stall_secs = 20\n", &[]);
    let pid = server.child.id();
    let base = rss(pid);
    let body = serde_json::json!({
        "command": ["python3", "-c", "import sys\nwhile True: sys.stdout.write(chr(1) * 65536)"],
        "limits": {"timeout_ms": 15000},
    })
    .to_string();
    let mut s = TcpStream::connect(&server.addr).unwrap();
    write!(
        s,
        "POST /v1/executions/stream HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    )
    .unwrap();
    let mut peak = base;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        peak = peak.max(rss(pid));
    }
    let growth = peak.saturating_sub(base);
    assert!(
        growth < 64 << 20,
        "an unread stream grew the server by {} MiB",
        growth >> 20
    );
    assert!(
        process_running("", "chr(1) * 65536"),
        "the program was not still writing: nothing was measured"
    );
    drop(s);
    wait_until(30, "the sandbox of the abandoned stream is gone", || {
        !process_running("", "chr(1) * 65536")
    });
}
