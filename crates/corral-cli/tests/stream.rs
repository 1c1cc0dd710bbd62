//! Live output (`corral run` without `--json`) is a pipe: the program's
//! bytes reach the reader as fast as it takes them and no faster, corral's
//! memory stays flat whatever is written, and nothing corral says enters
//! the program's stdout.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Writes 50 MB of `x` in 64 KiB writes, then `END <seconds the writes
/// took>`, and exits.
const WRITER: &str = "import sys, time\nw = sys.stdout.buffer\nb = b'x' * 65536\nt = time.monotonic()\n\
for _ in range(763):\n    w.write(b)\nw.flush()\nw.write(b'END %.1f\\n' % (time.monotonic() - t))\nw.flush()\n";

const WRITTEN: usize = 763 * 65536;

/// corral's own peak RSS (not its children's), from /proc.
fn vm_hwm_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// Starts the writer with `stdout` as corral's stdout, stalls `stall`
/// without reading, then reads everything through `read`. Returns what the
/// reader got and corral's VmHWM sampled just before its end.
fn stalled_reader(stdout: Stdio, stall: Duration, mut read: impl Read) -> (Vec<u8>, u64) {
    let mut child = corral_run()
        // A kill ceiling out of the way, and a kept-output budget that
        // used to be buffered for a stalled reader.
        .args(["--timeout", "120", "--output-limit", "1TiB"])
        .args(["--", "python3", "-c", WRITER])
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    std::thread::sleep(stall);
    let mut out = Vec::with_capacity(WRITTEN + 64);
    let mut buf = vec![0u8; 1 << 16];
    let mut hwm = 0;
    loop {
        let n = read.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if hwm == 0 && out.len() >= WRITTEN {
            // corral lives until the program's last line has gone out.
            hwm = vm_hwm_bytes(pid);
        }
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    (out, hwm)
}

fn check(out: &[u8], hwm: u64, stall: Duration) {
    assert!(out.len() > WRITTEN, "{} bytes arrived", out.len());
    let (body, end) = out.split_at(WRITTEN);
    assert!(body.iter().all(|&b| b == b'x'), "only the program's bytes");
    let end = std::str::from_utf8(end).unwrap();
    let took: f64 = end
        .strip_prefix("END ")
        .and_then(|s| s.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("stdout ends with exactly the program's last line: {end:?}"))
        .parse()
        .unwrap();
    // The stalled reader held the program's writes back: corral did not
    // take the 50 MB into memory for it.
    assert!(
        took >= stall.as_secs_f64() - 1.0,
        "the writes took {took} s while the reader stalled {stall:?}"
    );
    assert!(hwm > 0 && hwm < 32 << 20, "corral's VmHWM {hwm} bytes");
}

#[test]
fn a_stalled_pipe_reader_blocks_the_writer_and_corral_stays_small() {
    let (r, w) = std::io::pipe().unwrap();
    let stall = Duration::from_secs(10);
    let (out, hwm) = stalled_reader(Stdio::from(OwnedFd::from(w)), stall, r);
    check(&out, hwm, stall);
}

#[test]
fn a_stalled_socket_reader_blocks_the_writer_and_corral_stays_small() {
    // Not a pipe: corral copies through a bounded buffer instead of
    // splicing, with the same backpressure.
    let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
    let stall = Duration::from_secs(3);
    let (out, hwm) = stalled_reader(Stdio::from(OwnedFd::from(w)), stall, r);
    check(&out, hwm, stall);
}

#[test]
fn output_goes_out_live_and_a_closed_reader_ends_the_writer_with_epipe() {
    // Live: the first line arrives while the program still runs.
    let mut child = corral_run()
        .args([
            "--",
            "python3",
            "-c",
            "import time\nprint('first', flush=True)\ntime.sleep(30)\n",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first\n");
    assert!(start.elapsed() < Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    // A reader that goes away: the program's next write fails as on a
    // pipe (SIGPIPE), instead of corral draining it forever.
    let start = Instant::now();
    let mut child = corral_run()
        .args([
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            "while :; do echo y; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 4];
    out.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"y\ny\n");
    drop(out);
    let status = child.wait().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "ended by the closed pipe, not the timeout"
    );
    assert_eq!(
        status.code(),
        Some(128 + 13),
        "SIGPIPE, as `yes | head` gives"
    );
}
