//! Reduced mode (`--without-namespaces`), for hosts that block user
//! namespaces: what still holds, and that nothing falls back silently.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::process::Command;
use std::time::Duration;

fn reduced(flags: &[&str], argv: &[&str]) -> (serde_json::Value, std::process::Output) {
    let mut all = vec!["--without-namespaces"];
    all.extend_from_slice(flags);
    run_json(&all, argv)
}

#[test]
fn runs_and_says_it_is_reduced() {
    let (v, out) = reduced(&[], &["python3", "-c", "print(6 * 7)"]);
    assert_eq!(v["stdout"], "42\n", "{v}");
    assert_eq!(v["enforced"]["namespaces"], serde_json::json!([]));
    assert_eq!(v["enforced"]["landlock"]["status"], "fully_enforced");
    assert_eq!(v["enforced"]["seccomp"], "default");
    assert!(v["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["code"] == "sandbox.reduced"));
    assert!(text(&out.stderr).contains("sandbox.reduced"));
}

#[test]
fn landlock_confines_the_filesystem() {
    let dir = tempfile::Builder::new()
        .prefix("corral-reduced-")
        .tempdir()
        .unwrap();
    if is_root() {
        // The program runs as uid 65534: give it its own workdir.
        Command::new("chown")
            .arg("65534:65534")
            .arg(dir.path())
            .status()
            .unwrap();
    }
    let script = "import os\n\
        for p in ['/etc/hostname', '/root', '/home', '/proc/1/environ']:\n\
        \x20   try:\n\
        \x20       open(p).read() if not os.path.isdir(p) else os.listdir(p)\n\
        \x20       print('READ', p)\n\
        \x20   except OSError as e:\n\
        \x20       print('denied', p, e.errno)\n\
        for p in ['/tmp/corral-reduced-evil', '/var/tmp/corral-reduced-evil']:\n\
        \x20   try:\n\
        \x20       open(p, 'w').write('x')\n\
        \x20       print('WROTE', p)\n\
        \x20   except OSError as e:\n\
        \x20       print('denied', p, e.errno)\n\
        open('out.txt', 'w').write('ok')\n\
        print('cwd', os.getcwd())\n";
    // Reduced mode cannot keep the workdir's protected entries read-only
    // (tests/attacks/protect.rs proves it refuses to run without this).
    let (v, _) = reduced(
        &["--workdir", dir.path().to_str().unwrap(), "--no-protect"],
        &["python3", "-c", script],
    );
    let s = v["stdout"].as_str().unwrap();
    assert!(!s.contains("READ") && !s.contains("WROTE"), "{s}");
    assert_eq!(s.matches("denied").count(), 6, "{s}");
    assert!(
        s.contains(&format!(
            "cwd {}",
            std::fs::canonicalize(dir.path()).unwrap().display()
        )),
        "{s}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "ok"
    );
    assert!(!std::path::Path::new("/tmp/corral-reduced-evil").exists());
}

#[test]
fn network_sockets_and_sysv_ipc_are_refused() {
    let script = "import socket, ctypes, errno\n\
        for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):\n\
        \x20   try:\n\
        \x20       socket.socket(fam, socket.SOCK_DGRAM if fam == socket.AF_NETLINK else socket.SOCK_STREAM)\n\
        \x20       print('OPENED', fam)\n\
        \x20   except OSError as e:\n\
        \x20       print('denied', e.errno)\n\
        try:\n\
        \x20   socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
        \x20   print('UNIX OPENED')\n\
        except OSError as e:\n\
        \x20   print('unix denied', e.errno)\n\
        a, b = socket.socketpair()\n\
        print('socketpair ok')\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        r = libc.shmget(0, 4096, 0o1000 | 0o600)\n\
        print('shmget', r, ctypes.get_errno())\n";
    let (v, _) = reduced(&[], &["python3", "-c", script]);
    let s = v["stdout"].as_str().unwrap();
    assert_eq!(s.lines().filter(|l| *l == "denied 1").count(), 3, "{s}");
    // Named host sockets (D-Bus, ssh-agent) are out of reach: no socket(2)
    // at all; socketpair(2) still works for local IPC.
    assert!(
        s.contains("unix denied 1") && s.contains("socketpair ok") && s.contains("shmget -1 1"),
        "{s}"
    );
}

#[test]
fn signals_cannot_reach_host_processes() {
    let mut victim = victim(&[]);
    let pid = victim.id().to_string();
    let (v, _) = reduced(&[], &["sh", "-c", &format!("kill -KILL {pid}; echo rc=$?")]);
    std::thread::sleep(Duration::from_millis(100));
    let alive = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(alive, "the sandbox killed a host process: {v}");
    assert!(v["stdout"].as_str().unwrap().contains("rc=1"), "{v}");
}

/// Without a pid namespace, another process of the same uid (another
/// sandbox started by root, or the user's own) is within reach of the
/// scheduling calls, which need no capability then: none of them may be
/// aimed at it, while the program still changes its own.
#[test]
fn another_process_cannot_be_reniced_pinned_or_idled() {
    let mut victim = victim(&[]);
    let pid = victim.id();
    // `who` 0 with PRIO_USER / IOPRIO_WHO_USER is every process of the
    // uid; the values asked for are the defaults (nice 0, no I/O class),
    // so if the call went through it would change nothing that matters.
    let script = format!(
        "import os, ctypes\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        def t(name, f):\n\
        \x20   try:\n\
        \x20       f(); print(name, 'ok')\n\
        \x20   except OSError as e:\n\
        \x20       print(name, e.errno)\n\
        def ioprio(which, who, value):\n\
        \x20   if libc.syscall(251, which, who, value) != 0:\n\
        \x20       raise OSError(ctypes.get_errno(), 'ioprio_set')\n\
        t('nice other', lambda: os.setpriority(os.PRIO_PROCESS, {pid}, 19))\n\
        t('nice uid', lambda: os.setpriority(os.PRIO_USER, 0, 0))\n\
        t('affinity other', lambda: os.sched_setaffinity({pid}, {{0}}))\n\
        t('idle other', lambda: os.sched_setscheduler({pid}, os.SCHED_IDLE, os.sched_param(0)))\n\
        t('param other', lambda: os.sched_setparam({pid}, os.sched_param(0)))\n\
        t('ioprio other', lambda: ioprio(1, {pid}, 3 << 13))\n\
        t('ioprio uid', lambda: ioprio(3, 0, 0))\n\
        t('nice self', lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))\n\
        t('affinity self', lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))\n\
        t('ioprio self', lambda: ioprio(1, 0, 3 << 13))\n"
    );
    let (v, _) = reduced(&[], &["python3", "-c", &script]);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(
        v["stdout"],
        "nice other 1\nnice uid 1\naffinity other 1\nidle other 1\nparam other 1\n\
         ioprio other 1\nioprio uid 1\nnice self ok\naffinity self ok\nioprio self ok\n",
        "{v}"
    );
    // Fields after the command: state is 3rd, nice the 19th, policy the 41st.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    assert_eq!(
        (fields[16], fields[38]),
        ("0", "0"),
        "the victim changed: {stat}"
    );
}

#[test]
fn ptrace_and_namespaces_stay_denied() {
    let script = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
        print('ptrace', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n\
        print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n";
    let (v, _) = reduced(&[], &["python3", "-c", script]);
    assert_eq!(v["stdout"], "ptrace -1 1\nunshare -1 1\n", "{v}");
}

#[test]
fn daemons_die_with_the_timeout_without_a_pid_namespace() {
    let token = format!("corral-reduced-daemon-{}", std::process::id());
    let script = format!("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(60)', '{token}'])\n    os._exit(0)\ntime.sleep(60)\n");
    let (v, _) = reduced(&["--timeout", "1"], &["python3", "-c", &script]);
    assert_eq!(v["timed_out"], true, "{v}");
    std::thread::sleep(Duration::from_millis(300));
    let alive = process_running("python3", &token);
    assert!(
        !alive,
        "a setsid'd double-forked daemon outlived the timeout"
    );
}

/// A daemon left behind when the program exits (no timeout) dies with it
/// too: re-parented to the helper (its subreaper), it is found and killed
/// before the result, and the run does not wait for it.
#[test]
fn daemons_die_with_the_program_without_a_pid_namespace() {
    let token = format!("corral-reduced-leftover-{}", std::process::id());
    let script = format!("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('python3', ['python3', '-c', 'import time; time.sleep(60)', '{token}'])\n    os._exit(0)\nos.wait()\nprint('left one')\n");
    let start = std::time::Instant::now();
    let (v, _) = reduced(&["--timeout", "30"], &["python3", "-c", &script]);
    assert_eq!(v["stdout"], "left one\n", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert!(start.elapsed() < Duration::from_secs(10), "{v}");
    assert!(
        !process_running("python3", &token),
        "a setsid'd double-forked daemon outlived the program"
    );
}

/// corral inside corral: the outer sandbox's seccomp filter refuses new
/// user namespaces, as a locked-down container would.
fn nested(inner: &[&str]) -> std::process::Output {
    let bin = corral_bin();
    let dir = bin.parent().unwrap().to_str().unwrap().to_string();
    let name = bin.file_name().unwrap().to_str().unwrap().to_string();
    let (_d, cfg) = config(
        "[profile.outer]\nextends = \"code\"\n[profile.outer.commands]\nallow_paths = true\n",
    );
    let ro = format!("{dir}:/opt/corral");
    let inner_bin = format!("/opt/corral/{name}");
    let mut argv = vec![inner_bin.as_str(), "run", "--allow-unenforced-limits"];
    argv.extend_from_slice(inner);
    run(
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--profile",
            "outer",
            "--ro",
            &ro,
        ],
        &argv,
    )
}

#[test]
fn without_user_namespaces_corral_fails_closed_and_names_the_flag() {
    let out = nested(&["--", "sh", "-c", "echo ran"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("user namespaces are unavailable") && err.contains("--without-namespaces"),
        "{err}"
    );
    let out = nested(&["--without-namespaces", "--", "python3", "-c", "print(42)"]);
    assert_eq!(text(&out.stdout), "42\n", "{}", text(&out.stderr));
}
