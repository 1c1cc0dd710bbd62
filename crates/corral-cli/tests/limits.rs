//! Limits, proven with hostile programs that run only inside a sandbox
//! already enforcing the limit, with an outer timeout and a payload that
//! stops by itself.

mod common;
use common::*;

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Python that forks up to `max` children, each sleeping `sleep` seconds,
/// and on the first refusal prints `stopped N ERRNO`: a self-limiting
/// fork bomb for runs under a pids limit.
fn fork_loop(max: u32, sleep: u32) -> String {
    format!(
        "import os, time\nn = 0\ntry:\n    for _ in range({max}):\n        if os.fork() == 0:\n            \
         time.sleep({sleep})\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n"
    )
}

#[test]
fn fork_bomb_is_contained() {
    // Bounded: at most 10000 forks; children sleep and die with the program.
    let bomb = fork_loop(10000, 30);
    let (_d, cfg) = config(
        "[profile.bomb]\nextends = \"code\"\n[profile.bomb.limits]\npids = 64\nprocesses = 64\n",
    );
    let start = Instant::now();
    let (v, _) = run_json(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "bomb",
            "--timeout",
            "30",
        ],
        &["python3", "-c", &bomb],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("stopped "), "{v}");
    let forks: u32 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(forks < 64, "{forks} forks got through a limit of 64");
    assert_eq!(
        out.split_whitespace().nth(2),
        Some("11"),
        "EAGAIN expected: {out}"
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    if is_root() {
        assert_eq!(v["enforced"]["cgroup"]["pids"], 64, "{}", v["enforced"]);
    } else {
        assert_eq!(v["enforced"]["rlimits"]["processes"], 64);
        assert!(v["enforced"]["not_enforced"]
            .as_array()
            .unwrap()
            .contains(&"pids".into()));
    }
}

#[test]
fn memory_bomb_is_reported_as_oom_killed() {
    // Bounded at 2 GiB; the limit is 64 MiB.
    let bomb = "chunks = []\nfor _ in range(256):\n    chunks.append(bytearray(8 << 20))\nprint('survived')\n";
    if !is_root() {
        // No cgroup delegation here for ordinary users: corral refuses
        // rather than run with a memory limit it cannot enforce.
        let out = corral()
            .args([
                "run", "--json", "--memory", "64MiB", "--", "python3", "-c", bomb,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error"]["code"], "limits.unenforceable");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("memory"),
            "{v}"
        );
        return;
    }
    let (v, out) = run_json(
        &["--memory", "64MiB", "--timeout", "30"],
        &["python3", "-c", bomb],
    );
    assert_eq!(v["oom_killed"], true, "{v}");
    assert_eq!(out.status.code(), Some(137));
    assert!(!v["stdout"].as_str().unwrap().contains("survived"));
    let peak = v["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak <= 64 << 20 && peak > 32 << 20, "peak {peak}");
    assert!(text(&out.stderr).contains("out of memory"));
}

#[test]
fn unenforceable_limits_fail_closed_unless_accepted() {
    if is_root() {
        // Root can always create its groups here; the refusal path is
        // exercised by the unprivileged pass of this same test.
        let (v, _) = run_json(
            &["--memory", "128MiB", "--pids", "32"],
            &["sh", "-c", "true"],
        );
        let cg = &v["enforced"]["cgroup"];
        assert_eq!(cg["memory_bytes"], 128 << 20, "{v}");
        assert!(v["enforced"]["not_enforced"].as_array().unwrap().is_empty());
        return;
    }
    let out = corral()
        .args(["run", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty(), "nothing may run");
    let err = text(&out.stderr);
    assert!(
        err.contains("memory") && err.contains("--allow-unenforced-limits"),
        "{err}"
    );
    let (v, _) = run_json(&[], &["sh", "-c", "echo ran"]);
    assert_eq!(v["stdout"], "ran\n");
    let not: Vec<&str> = v["enforced"]["not_enforced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(not, ["memory", "pids"]);
}

#[test]
fn pids_minimum_runs_and_one_below_is_refused_naming_it() {
    // 3: corral's helper, the sandbox's init and the program. Unprivileged,
    // `run` adds --allow-unenforced-limits (no cgroup here), so the run
    // goes on with pids listed as not enforced.
    let (v, _) = run_json(&["--pids", "3"], &["sh", "-c", "echo ran"]);
    assert_eq!(
        (v["exit_code"].as_i64(), v["stdout"].as_str()),
        (Some(0), Some("ran\n")),
        "{v}"
    );
    let (_d, cfg) = config("[profile.p]\nextends = \"code\"\n[profile.p.limits]\npids = 3\n");
    let (v, _) = run_json(
        &["--config", cfg.to_str().unwrap(), "--profile", "p"],
        &["sh", "-c", "echo ran"],
    );
    assert_eq!(v["stdout"], "ran\n", "{v}");
    if is_root() {
        assert_eq!(v["enforced"]["cgroup"]["pids"], 3, "{}", v["enforced"]);
    }
    // One below, from the flag and from a config file: refused before
    // anything starts, naming the flag or key and the range.
    let out = corral()
        .args(["run", "--json", "--pids", "2", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "", "nothing may run");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("--pids 2 is too small: use 3 to "),
        "{v}"
    );
    let (_d, cfg) = config("[profile.p]\nextends = \"code\"\n[profile.p.limits]\npids = 2\n");
    let out = corral()
        .args([
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "p",
            "--",
            "sh",
            "-c",
            "echo ran",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty(), "nothing may run");
    let err = text(&out.stderr);
    assert!(
        err.contains("line 4: profile.p.limits.pids: 2 is too small: use 3 to "),
        "{err}"
    );
}

#[test]
fn limits_past_their_maximum_are_refused_not_overflowed() {
    // u64::MAX seconds overflowed the deadline (a panic) before the
    // timeout had a maximum.
    for (flag, value, expected) in [
        ("--timeout", "18446744073709551615", "--timeout 18446744073709551615 seconds is too large: use 1 to 2073600 seconds (24 days)"),
        ("--cpu-time", "18446744073709551615", "--cpu-time 18446744073709551615 seconds is too large"),
        ("--pids", "4194305", "--pids 4194305 is too large: use 3 to 4194304"),
    ] {
        let out = corral()
            .args(["run", flag, value, "--", "sh", "-c", "echo ran"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{flag} {value}");
        assert!(out.stdout.is_empty(), "nothing may run");
        let err = text(&out.stderr);
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn tmp_fill_stops_at_its_size() {
    let (_d, cfg) = config(
        "[profile.small]\nextends = \"code\"\n[profile.small.filesystem]\ntmp_size = \"8MiB\"\n",
    );
    let out = run(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "small",
            "--timeout",
            "30",
        ],
        &[
            "sh",
            "-c",
            "head -c 67108864 /dev/zero > /tmp/fill; echo rc=$?; wc -c < /tmp/fill",
        ],
    );
    let s = text(&out.stdout);
    let mut lines = s.lines();
    assert_ne!(lines.next(), Some("rc=0"), "{s}");
    let size: u64 = lines.next().unwrap().trim().parse().unwrap();
    assert!(size <= 8 << 20, "{size}");
    assert!(
        text(&out.stderr).contains("No space left"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn file_size_limit_stops_large_files() {
    let (_d, cfg) =
        config("[profile.fs]\nextends = \"code\"\n[profile.fs.limits]\nfile_size = \"1MiB\"\n");
    let (v, _) = run_json(
        &["--config", cfg.to_str().unwrap(), "--profile", "fs"],
        &["python3", "-c", "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\ntry:\n    open('/tmp/big', 'wb').write(b'x' * (2 << 20))\nexcept OSError as e:\n    print('refused', e.errno)\nimport os\nprint(os.path.getsize('/tmp/big'))\n"],
    );
    assert_eq!(
        v["stdout"], "refused 27\n1048576\n",
        "EFBIG at exactly 1 MiB: {v}"
    );
    let (v, _) = run_json(
        &["--config", cfg.to_str().unwrap(), "--profile", "fs"],
        &["sh", "-c", "head -c 2000000 /dev/zero > /tmp/f"],
    );
    assert_eq!(v["exit_code"], 128 + 25, "SIGXFSZ by default: {v}");
}

#[test]
fn open_files_are_capped_at_1024() {
    let s = py("import errno\nfs = []\ntry:\n    while len(fs) < 100000:\n        fs.append(open('/dev/null'))\nexcept OSError as e:\n    print(len(fs), e.errno == errno.EMFILE)\n");
    let mut words = s.split_whitespace();
    let n: u32 = words.next().unwrap().parse().unwrap();
    assert!((1000..1024).contains(&n), "{n}");
    assert_eq!(words.next(), Some("True"));
}

/// Queued signals count against one budget per host user, shared by every
/// sandbox root starts (and, for an ordinary user, by the user's own
/// processes): each sandbox's `sigqueue` gets 1024 of them, so one cannot
/// take that budget with real-time signals (standard ones sent by `kill`
/// are always queued, at most one per signal and process; see SECURITY.md).
/// The loop stops at 5000 so that, without the limit, the test takes only
/// a small part of that shared budget.
#[test]
fn queued_signals_are_capped_at_1024_per_sandbox() {
    let (v, _) = run_json(
        &[],
        &[
            "python3",
            "-c",
            "import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n = 0
while n < 5000 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0:
    n += 1
print(n, ctypes.get_errno() == errno.EAGAIN)
",
        ],
    );
    assert_eq!(v["stdout"], "1024 True\n", "{v}");
    assert_eq!(v["enforced"]["rlimits"]["pending_signals"], 1024, "{v}");
}

/// inotify instances count against one budget per host user too (128 by
/// default), shared by every sandbox root starts: each sandbox's user
/// namespace caps its share at 16 instances and 16384 watches. The loop
/// stops at 40, well inside the shared budget, should the cap be missing.
#[test]
fn inotify_instances_are_capped_at_16_per_sandbox() {
    let (v, _) = run_json(
        &[],
        &[
            "python3",
            "-c",
            "import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 40:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno() == errno.EMFILE)
for name in ('max_inotify_instances', 'max_inotify_watches'):
    print(name, open('/proc/sys/user/' + name).read().strip())
",
        ],
    );
    assert_eq!(
        v["stdout"], "16 True\nmax_inotify_instances 16\nmax_inotify_watches 16384\n",
        "{v}"
    );
}

/// Without a cgroup (a profile with no cgroup limit), the CPU time and
/// peak memory of a run are what init reaped: the program and every
/// process it left to init, here an orphan that burns CPU and touches
/// 96 MiB after its parent has gone.
#[test]
fn a_run_without_a_cgroup_reports_what_every_process_used() {
    let (_d, cfg) = config("[profile.nocg]\n[profile.nocg.commands]\nallow = [\"python3\"]\n");
    let orphan = r#"
import os, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.close(r)
        b = bytearray(96 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        while time.process_time() < 0.3:
            pass
        os._exit(0)
    os._exit(0)
os.wait()
os.close(w)
os.read(r, 1)  # end of file: the orphan has exited
print("orphan done")
"#;
    let (v, _) = run_json(
        &["--config", cfg.to_str().unwrap(), "--profile", "nocg"],
        &["python3", "-c", orphan],
    );
    assert_eq!(v["stdout"], "orphan done\n", "{v}");
    assert_eq!(v["enforced"]["cgroup"], serde_json::Value::Null, "{v}");
    let cpu = v["cpu_ms"].as_u64().unwrap();
    assert!(cpu >= 250, "the orphan's CPU time is missing: {v}");
    let peak = v["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak >= 96 << 20, "the orphan's memory is missing: {peak}");
}

#[test]
fn cpu_time_limit_kills_a_busy_loop() {
    let start = Instant::now();
    let (v, _) = run_json(
        &["--cpu-time", "1", "--timeout", "30"],
        &["python3", "-c", "while True: pass"],
    );
    let code = v["exit_code"].as_i64().unwrap();
    assert!(code == 128 + 24 || code == 137, "SIGXCPU or SIGKILL: {v}");
    assert_eq!(v["timed_out"], false);
    // About a second of CPU; the rusage sum lags the limit's own tick
    // accounting by up to a few ticks on a loaded machine (seen: 857).
    assert!(v["cpu_ms"].as_u64().unwrap() >= 700, "{v}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn output_keeps_head_and_tail_with_a_marker() {
    let (v, _) = run_json(
        &["--output-limit", "1KiB"],
        &["python3", "-c", "for i in range(10000): print('line', i)"],
    );
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("line 0\nline 1\n"), "{out}");
    assert!(out.ends_with("line 9998\nline 9999\n"), "{out}");
    assert!(out.contains(" bytes elided]"), "{out}");
    assert!(out.len() < 1200);
    assert_eq!(v["stdout_truncated"], true);
    let total: u64 = (0..10000)
        .map(|i: u32| format!("line {i}\n").len() as u64)
        .sum();
    assert_eq!(v["stdout_bytes"], total);
    assert_eq!(
        v["exit_code"], 0,
        "below the kill ceiling the program runs to the end"
    );
}

/// Starts `argv` from a fresh, small process and reports its peak RSS.
/// Measured from the test binary itself, a spawned child's `ru_maxrss`
/// includes the test process's own RSS from before the `execve` (Linux
/// keeps the old high-water mark across it), which parallel tests inflate.
const MEASURE: &str = r#"
import os, sys
pid = os.fork()
if pid == 0:
    null = os.open("/dev/null", os.O_WRONLY)
    os.dup2(null, 2)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
os.write(2, b"maxrss %d\n" % (usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status) % 256 if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"#;

/// Runs corral with `args` under [`MEASURE`]; returns (output (its first
/// 16 MiB), bytes of output in all, exit code, peak RSS of corral and its
/// tree in bytes).
fn run_measured(args: &[&str]) -> (Vec<u8>, u64, i32, u64) {
    let run = corral_run();
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", MEASURE])
        .arg(run.get_program())
        .args(run.get_args())
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run_measured");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    let mut pipe = child.stdout.take().expect("run_measured");
    let mut total = 0u64;
    loop {
        let n = pipe.read(&mut buf).expect("run_measured");
        if n == 0 {
            break;
        }
        total += n as u64;
        // Keep what a reader would see, bounded.
        if out.len() < 16 << 20 {
            out.extend_from_slice(&buf[..n]);
        }
    }
    let done = child.wait_with_output().expect("run_measured");
    let report = text(&done.stderr);
    let rss = report
        .lines()
        .find_map(|l| l.strip_prefix("maxrss "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no measurement: {report}"));
    (out, total, done.status.code().unwrap_or(-1), rss)
}

/// Writes up to 50 GB of `x` without a newline; the kill ceiling stops it.
const FLOOD: &str = "import sys\nb = b'x' * 65536\nw = sys.stdout.buffer.write\nfor _ in range((50 << 30) // 65536):\n    w(b)\n";

#[test]
fn output_flood_is_cut_and_corral_memory_stays_flat() {
    let (out, _, code, rss) =
        run_measured(&["--json", "--timeout", "60", "--", "python3", "-c", FLOOD]);
    assert_eq!(code, 137);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["output_limit_exceeded"], true);
    assert_eq!(v["stdout_truncated"], true);
    assert!(
        v["stdout_bytes"].as_u64().unwrap() > 64 << 20,
        "{}",
        v["stdout_bytes"]
    );
    assert!(v["stdout"].as_str().unwrap().len() <= (1 << 20) + 100);
    assert!(rss < 32 << 20, "peak RSS of corral's tree {rss} bytes");
}

#[test]
fn streaming_mode_applies_the_same_ceiling_as_a_total_and_adds_nothing() {
    // `--output-limit` sizes what --json keeps; the kill ceiling (64 MiB
    // in `code`) counts every byte of a stream over the run.
    let (out, total, code, rss) = run_measured(&[
        "--timeout",
        "60",
        "--output-limit",
        "64KiB",
        "--",
        "python3",
        "-c",
        FLOOD,
    ]);
    assert_eq!(code, 137);
    // Everything up to the ceiling went to the reader, live, and not one
    // byte more; no elision line or any other corral text on stdout.
    assert_eq!(total, 64 << 20, "{total} bytes reached the reader");
    assert!(out.iter().all(|&b| b == b'x'), "only the program's bytes");
    assert!(rss < 32 << 20, "peak RSS {rss}");
}

#[test]
fn daemons_die_at_the_timeout() {
    let token = format!("corral-daemon-{}", std::process::id());
    let script = format!("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(60)', '{token}'])\n    os._exit(0)\ntime.sleep(60)\n");
    let (v, _) = run_json(&["--timeout", "1"], &["python3", "-c", &script]);
    assert_eq!(v["timed_out"], true);
    std::thread::sleep(Duration::from_millis(300));
    let alive = process_running("python3", &token);
    assert!(!alive, "a double-forked daemon survived the timeout");
}

#[test]
fn no_cgroups_are_left_behind() {
    if !is_root() {
        eprintln!("unprivileged pass: no cgroups are created (see unenforceable_limits_fail_closed_unless_accepted)");
        return;
    }
    let child = corral_run()
        .args(["--", "sh", "-c", "true"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    for hierarchy in ["memory", "pids", "cpu", "unified", ""] {
        let dir = std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("corral");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                assert!(
                    !name.starts_with(&format!("{pid}-")),
                    "left behind: {}",
                    e.path().display()
                );
            }
        }
    }
}

/// What the run's cgroup needs only after the sandbox started (opening the
/// statistics files read at the end) is done after corral cloned init
/// (or forked its helper), while init builds the root on the other CPU,
/// not before: strace shows the parent's `clone` ahead of it. The group
/// itself, its limits and, on cgroup v1, the `tasks` files init joins
/// through come before it.
#[test]
fn cgroup_work_that_can_wait_comes_after_the_sandbox_started() {
    if !is_root() {
        eprintln!("unprivileged pass: no cgroups are created (see unenforceable_limits_fail_closed_unless_accepted)");
        return;
    }
    let (out, calls) = corral_run_under_strace(
        &[
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=clone,clone3,mkdir,openat,write,execve",
        ],
        &["sh", "-c", "true"],
    );
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = calls.lines().collect();
    let pid = |l: &str| l.split_whitespace().next().unwrap_or_default().to_string();
    let corral = pid(lines[0]);
    let at = |what: &dyn Fn(&str) -> bool, name: &str| {
        lines
            .iter()
            .position(|l| what(l))
            .unwrap_or_else(|| panic!("no {name} in:\n{calls}"))
    };
    let clone = at(
        &|l| pid(l) == corral && l.contains(" clone("),
        "clone of init",
    );
    let made = at(
        &|l| l.contains("mkdir(\"/sys/fs/cgroup/") && l.contains("corral/"),
        "group mkdir",
    );
    let stats = at(
        &|l| l.contains("pids.events\"") || l.contains("memory.oom_control\""),
        "statistics open",
    );
    // The program: the first execve of another process than corral.
    let program = at(
        &|l| pid(l) != corral && l.contains("execve("),
        "the program's execve",
    );
    assert!(clone < stats, "waited for by the sandbox:\n{calls}");
    // cgroup v1 (init joins itself): the group is made while init builds
    // the root, and init writes `0` to each `tasks` file, which corral
    // opened, before the program exists. On v2 the group comes first.
    if std::path::Path::new("/sys/fs/cgroup/memory/tasks").exists() {
        assert!(
            clone < made,
            "the group is made after init exists:\n{calls}"
        );
        let tasks = at(&|l| l.contains("/tasks\""), "tasks open");
        assert!(made < tasks && pid(lines[tasks]) == corral, "{calls}");
        // init's write of "0" to a `tasks` file (strace -y names the
        // descriptor's file).
        let joined = at(
            &|l| pid(l) != corral && l.contains("write(") && l.contains("/tasks>, \"0\""),
            "init's join",
        );
        assert!(
            tasks < joined && joined < program,
            "init joins before the program starts:\n{calls}"
        );
    } else {
        assert!(made < clone, "the group comes first:\n{calls}");
    }
}

/// On cgroup v1 `corral run` makes the run's group while init builds the
/// root. A group that cannot be made then (here: its name taken) stops
/// the run before its program exists, whatever the profile accepts: the
/// sandbox has started, so there is no running on without the limits.
#[test]
fn a_group_that_cannot_be_made_after_the_start_stops_the_run_before_its_program() {
    if !is_root() {
        eprintln!("unprivileged pass: no cgroups are created (see unenforceable_limits_fail_closed_unless_accepted)");
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/pids/tasks").exists() {
        eprintln!("SKIP: cgroup v1 only (on v2 the group is made before the start)");
        return;
    }
    // The run's group is named after corral's pid and a counter: bash takes
    // the name in the pids hierarchy, then becomes corral (same pid).
    let child = corral_run_via_bash(
        "mkdir -p /sys/fs/cgroup/pids/corral/$$-0 && exec \"$@\"",
        &[],
    )
    .args(["--allow-unenforced-limits", "--", "sh", "-c", "echo RAN"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let taken = std::path::PathBuf::from(format!("/sys/fs/cgroup/pids/corral/{pid}-0"));
    let _ = std::fs::remove_dir(&taken);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        !text(&out.stdout).contains("RAN"),
        "the program ran: {out:?}"
    );
    assert!(stderr.contains("making the run's cgroup"), "{stderr}");
    assert!(
        !std::path::Path::new(&format!("/sys/fs/cgroup/memory/corral/{pid}-0")).exists(),
        "the half-made group is removed"
    );
}

#[test]
fn cgroups_of_a_killed_corral_are_swept_by_the_next_run() {
    if !is_root() {
        eprintln!("unprivileged pass: no cgroups are created (see unenforceable_limits_fail_closed_unless_accepted)");
        return;
    }
    let token = format!("corral-sweep-{}", std::process::id());
    let mut child = corral_run()
        .args(["--", "sh", "-c", "sleep 60", &token])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let group = std::path::Path::new("/sys/fs/cgroup/pids/corral").join(format!("{pid}-0"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !group.exists() {
        assert!(
            Instant::now() < deadline,
            "no group appeared at {}",
            group.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SIGKILL: corral gets no chance to clean up.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        group.exists(),
        "the group should outlive a SIGKILLed corral"
    );
    // Nothing of that run may linger, whenever the kill came (even before
    // init joined its group, or the forked helper got its go-ahead).
    let lingering = || process_running("", &token);
    wait_until(5, "a process of the killed corral lingers", || !lingering());
    let out = run(&[], &["sh", "-c", "true"]);
    assert!(out.status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while group.exists() {
        assert!(
            Instant::now() < deadline,
            "stale group {} was not swept",
            group.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_wall_timeout_can_be_switched_off_by_flag_and_by_an_extending_profile() {
    // `short` times out after 1 s; `open` extends it and removes that.
    let (_d, cfg) = config(
        "[profile.short]\nextends = \"code\"\n[profile.short.limits]\ntimeout_secs = 1\n\
         [profile.open]\nextends = \"short\"\n[profile.open.limits]\ntimeout_secs = \"none\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    let sleep = ["sh", "-c", "sleep 2; echo done"];
    let (v, _) = run_json(&["--config", cfg, "--profile", "short"], &sleep);
    assert_eq!(v["timed_out"], true, "the profile's timeout holds: {v}");
    for flags in [
        &["--config", cfg, "--profile", "short", "--timeout", "none"][..],
        &["--config", cfg, "--profile", "open"][..],
    ] {
        let (v, _) = run_json(flags, &sleep);
        assert_eq!(v["timed_out"], false, "{flags:?}: {v}");
        assert_eq!(v["exit_code"], 0, "{flags:?}: {v}");
        assert_eq!(v["stdout"], "done\n", "{flags:?}: {v}");
    }
    // explain shows it.
    let out = corral()
        .args(["explain", "--config", cfg, "open"])
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(shown.contains("wall timeout:      none"), "{shown}");
    let out = corral()
        .args(["explain", "--config", cfg, "short"])
        .output()
        .unwrap();
    assert!(text(&out.stdout).contains("wall timeout:      1s"));
    // A word other than `none` is refused before anything runs.
    let out = corral()
        .args(["run", "--timeout", "off", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("--timeout off: not a number of seconds; use 1 to 2073600 seconds (24 days), or `none` for no limit"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_output_kill_ceiling_can_be_switched_off() {
    // 3 MiB on stdout: past a 2 MiB ceiling, under none.
    let (_d, cfg) = config(
        "[profile.low]\nextends = \"code\"\n[profile.low.limits]\noutput_kill = \"2MiB\"\n\
         [profile.none]\nextends = \"low\"\n[profile.none.limits]\noutput_kill = \"none\"\n",
    );
    let cfg = cfg.to_str().unwrap();
    let script = [
        "python3",
        "-c",
        "import sys\nsys.stdout.write('x' * (3 << 20))\n",
    ];
    let (v, _) = run_json(
        &["--config", cfg, "--profile", "low", "--timeout", "30"],
        &script,
    );
    assert_eq!(v["output_limit_exceeded"], true, "{v}");
    assert_eq!(v["exit_code"], 137, "{v}");
    let (v, _) = run_json(
        &["--config", cfg, "--profile", "none", "--timeout", "30"],
        &script,
    );
    assert_eq!(v["output_limit_exceeded"], false, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout_bytes"], 3 << 20);
    let out = corral()
        .args(["explain", "--config", cfg, "none"])
        .output()
        .unwrap();
    assert!(text(&out.stdout).contains("output kill:       none"));
}

#[test]
fn the_result_names_the_pids_limit_a_fork_loop_ran_into() {
    if !is_root() {
        eprintln!("SKIP: the pids limit needs a cgroup (root on this host)");
        return;
    }
    // Bounded: at most 200 forks, children sleep 5 s; a limit of 32 holds
    // it, and the outer timeout is 30 s.
    let forks = fork_loop(200, 5);
    let (v, _) = run_json(
        &["--pids", "32", "--timeout", "30"],
        &["python3", "-c", &forks],
    );
    assert!(v["stdout"].as_str().unwrap().starts_with("stopped "), "{v}");
    assert_eq!(v["limits_hit"], serde_json::json!(["pids"]), "{v}");
    // The same program under a limit it stays inside hits nothing.
    let few = fork_loop(3, 5);
    let (v, _) = run_json(
        &["--pids", "32", "--timeout", "30"],
        &["python3", "-c", &few],
    );
    assert_eq!(v["limits_hit"], serde_json::json!([]), "{v}");
}

#[test]
fn the_result_names_the_file_size_limit() {
    let (v, _) = run_json(
        &["--file-size", "1MiB"],
        &["sh", "-c", "exec head -c 2000000 /dev/zero > /tmp/f"],
    );
    assert_eq!(v["signal"], 25, "SIGXFSZ: {v}");
    assert_eq!(v["limits_hit"], serde_json::json!(["file_size"]), "{v}");
    let (v, _) = run_json(
        &["--file-size", "4MiB"],
        &["sh", "-c", "head -c 2000000 /dev/zero > /tmp/f"],
    );
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["limits_hit"], serde_json::json!([]), "{v}");
}
