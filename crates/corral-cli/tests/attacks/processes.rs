//! Processes: signals to the host and to init, ptrace, and reading or
//! writing another process's memory.

use crate::common::*;
use crate::support::*;

use std::time::Duration;

#[test]
fn attack_kill_of_a_host_process_by_pid_fails_with_esrch() {
    let mut host = victim(&[]);
    let pid = host.id();
    let body = format!(
        "for sig in (0, 15, 9):\n    say('kill', sig, try_(lambda: os.kill({pid}, sig)))\n"
    );
    let (code, out, err) = attack(&[], &body);
    std::thread::sleep(Duration::from_millis(100));
    let alive = host.try_wait().expect("try_wait").is_none();
    let _ = host.kill();
    let _ = host.wait();
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "kill 0 ESRCH\nkill 15 ESRCH\nkill 9 ESRCH\n");
    assert!(alive, "the host process died");
}

#[test]
fn attack_kill_of_init_is_refused() {
    // Init runs as the program's own uid: the refusal is Landlock's signal
    // scope (without it kill(1, ...) would return 0).
    expect(
        r#"for sig in (9, 15, 19, 0):
    say('kill 1', sig, try_(lambda: os.kill(1, sig)))
say('init state', open('/proc/1/status').read().split('State:')[1].split()[0])
say('parent is init', os.getppid())
"#,
        "kill 1 9 EPERM\nkill 1 15 EPERM\nkill 1 19 EPERM\nkill 1 0 EPERM\ninit state S\nparent is init 1\n",
    );
}

#[test]
fn init_holds_nothing_the_program_could_borrow() {
    // PID 1 runs as the program's uid: whatever it holds, a program that
    // reaches it could use. prlimit(2) on a same-uid process needs no
    // capability, so init's rlimits were the program's to change.
    expect(
        r#"import resource
st = dict(l.split(':\t', 1) for l in open('/proc/1/status').read().splitlines() if ':\t' in l)
for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp'):
    say(k, st[k].strip())
say('prlimit init', try_(lambda: resource.prlimit(1, resource.RLIMIT_CPU, (1, 1))))
say('prlimit init read', try_(lambda: resource.prlimit(1, resource.RLIMIT_NOFILE)))
say('init rlimit', open('/proc/1/limits').read().split('Max cpu time')[1].split()[0])
say('own setrlimit', try_(lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))))
say('prlimit self', try_(lambda: resource.prlimit(0, resource.RLIMIT_NOFILE)))
say('ptrace attach', sc(101, 16, 1, 0, 0))
say('read init memory', try_(lambda: open('/proc/1/mem', 'rb').read(1)))
say('init environ', try_(lambda: open('/proc/1/environ', 'rb').read()))
say('signal init', try_(lambda: os.kill(1, 15)))
"#,
        "CapInh 0000000000000000\nCapPrm 0000000000000000\nCapEff 0000000000000000\n\
CapBnd 0000000000000000\nCapAmb 0000000000000000\nNoNewPrivs 1\nSeccomp 2\n\
prlimit init EPERM\nprlimit init read EPERM\ninit rlimit unlimited\nown setrlimit ok\n\
prlimit self ok\nptrace attach EPERM\nread init memory EACCES\ninit environ EACCES\n\
signal init EPERM\n",
    );
}

/// Reads init's `CapEff` from /proc/1/status as fast as it can from its
/// first instruction on (a static program: no loader before `main`), and
/// prints whether it ever saw one.
const WATCH_INIT: &str = r#"#include <stdio.h>
#include <string.h>
int main(void) {
    char buf[4096];
    for (int i = 0; i < 2000; i++) {
        FILE *f = fopen("/proc/1/status", "r");
        if (!f) { puts("unreadable"); return 1; }
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *cap = strstr(buf, "CapEff:\t");
        if (!cap) { puts("no CapEff"); return 1; }
        if (strncmp(cap + 8, "0000000000000000", 16) != 0) {
            printf("init capable at read %d\n", i);
            return 0;
        }
    }
    puts("never capable");
    return 0;
}
"#;

#[test]
fn the_program_never_runs_next_to_a_capable_init() {
    // init gives up its capabilities before the program's process exists.
    // When it did so after the start, the program's execve woke init up
    // while the program was already running: a probe reading /proc/1/status
    // at once saw init's capabilities in some 4% of the runs.
    let prog = CProgram::compile_with("watch", WATCH_INIT, &["-static"]);
    for _ in 0..40 {
        let out = prog.run(&[], &["/opt/attack/watch"]);
        assert_eq!(
            text(&out.stdout),
            "never capable\n",
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn attack_ptrace_traceme_is_refused() {
    if !x86_64("attack_ptrace_traceme_is_refused") {
        return;
    }
    // Baseline: PTRACE_TRACEME returns 0.
    expect(
        "say('PTRACE_TRACEME', sc(101, 0, 0, 0, 0))\n",
        "PTRACE_TRACEME EPERM\n",
    );
}

#[test]
fn attack_ptrace_of_pid_1_is_refused() {
    if !x86_64("attack_ptrace_of_pid_1_is_refused") {
        return;
    }
    expect(
        r#"say('PTRACE_ATTACH 1', sc(101, 16, 1, 0, 0))
say('PTRACE_SEIZE 1', sc(101, 0x4206, 1, 0, 0))
say('PTRACE_PEEKDATA 1', sc(101, 2, 1, 0x400000, 0))
"#,
        "PTRACE_ATTACH 1 EPERM\nPTRACE_SEIZE 1 EPERM\nPTRACE_PEEKDATA 1 EPERM\n",
    );
}

#[test]
fn attack_ptrace_attach_to_own_child_is_refused() {
    if !x86_64("attack_ptrace_attach_to_own_child_is_refused") {
        return;
    }
    // Baseline: attaching to one's own child (same uid, dumpable) succeeds.
    expect(
        r#"pid = os.fork()
if pid == 0:
    time.sleep(10)
    os._exit(0)
say('PTRACE_ATTACH child', sc(101, 16, pid, 0, 0))
say('PTRACE_SEIZE child', sc(101, 0x4206, pid, 0, 0))
os.kill(pid, 9)
os.waitpid(pid, 0)
"#,
        "PTRACE_ATTACH child EPERM\nPTRACE_SEIZE child EPERM\n",
    );
}

#[test]
fn attack_process_vm_readv_and_writev_are_refused() {
    if !x86_64("attack_process_vm_readv_and_writev_are_refused") {
        return;
    }
    // Baseline: reading one's own memory this way returns 16.
    expect(
        r#"class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
src = ctypes.create_string_buffer(b'corral', 16)
dst = ctypes.create_string_buffer(16)
local = iovec(ctypes.addressof(dst), 16)
remote = iovec(ctypes.addressof(src), 16)
for pid in (os.getpid(), 1):
    say('process_vm_readv', pid == 1, sc(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
    say('process_vm_writev', pid == 1, sc(311, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
say('copied', dst.value)
"#,
        "process_vm_readv False EPERM\nprocess_vm_writev False EPERM\nprocess_vm_readv True EPERM\n\
         process_vm_writev True EPERM\ncopied b''\n",
    );
}

/// As root the helper runs as the sandbox's uid for the whole run, and it
/// holds the plan (the run's environment) in memory. That uid (65534) is
/// shared with host daemons: none of them may read the helper's memory
/// or its init's, or attach to them.
#[test]
fn host_processes_of_the_sandbox_uid_cannot_read_the_helper_or_init() {
    if !is_root() {
        eprintln!(
            "SKIP: root only (unprivileged, the helper runs as the caller's own uid, whose processes may trace each other anyway)"
        );
        return;
    }
    let mut run = corral_run()
        .args([
            "--",
            "sh",
            "-c",
            "sleep 3; true # corral-helper-memory-test",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("corral run");
    let corral = i32::try_from(run.id()).unwrap();
    let pids = sandbox_chain(corral, "corral-helper-memory-test");
    // A host process of uid 65534 (set up as root, then dropped): /proc's
    // mem and PTRACE_ATTACH, each refused.
    let probe = r#"
import ctypes, errno, os, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
libc = ctypes.CDLL(None, use_errno=True)
for pid in map(int, sys.argv[1:]):
    try:
        open(f"/proc/{pid}/mem", "rb").close()
        mem = "opened"
    except OSError as e:
        mem = errno.errorcode[e.errno]
    r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    attach = "attached" if r == 0 else errno.errorcode[ctypes.get_errno()]
    print(mem, attach)
"#;
    let out = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(probe)
        .args(pids.iter().map(ToString::to_string))
        .output()
        .expect("probe");
    let _ = run.kill();
    let _ = run.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        text,
        "EACCES EPERM\n".repeat(pids.len()),
        "helper and init ({pids:?}) as a host process of uid 65534 sees them; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// corral's own processes of the sandbox under `corral`, top down, once
/// its program, `sh` with `token` in its command line, runs: init (which
/// corral clones itself where it can) and, when there is one, the helper
/// above it. Both show the wiped argv `corral-sandbox`, as does the
/// program's process until its `execve`: the chain is read only once the
/// program runs, or it could end in the program's process.
fn sandbox_chain(corral: i32, token: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    wait_until(10, "init, and the helper if there is one", || {
        if !process_running("sh", token) {
            return false;
        }
        pids.clear();
        let mut next = children_of(corral);
        while let [pid] = next[..] {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !cmdline.starts_with(b"corral-sandbox\0") {
                break;
            }
            pids.push(pid);
            next = children_of(pid);
        }
        !pids.is_empty()
    });
    pids
}

/// The `Name:` line of `/proc/<pid>/status`, its value with tabs as spaces.
fn status_line(pid: i32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// As root, corral acts as the sandbox identity for the clone of init and
/// keeps only its saved uid 0 to take its own ids back. Afterwards corral
/// is itself again (ids and supplementary groups), and init has nothing of
/// host root: every uid and gid the sandbox's, no groups; and of what
/// corral had open (an inherited fd 9, its pipes and sockets,
/// the lifeline's write end, cgroup files) it holds only stdio and its
/// control socket.
#[test]
fn as_root_corral_takes_its_ids_back_and_init_keeps_none_of_them() {
    if !is_root() {
        eprintln!("SKIP: root only (unprivileged, corral changes no ids)");
        return;
    }
    let mut run = corral_run_via_bash(
        "exec 9</etc/hostname; exec setpriv --groups 4,27 -- \"$@\"",
        &[],
    )
    .args(["--", "sh", "-c", "sleep 3; true # corral-ids-test"])
    .stdout(std::process::Stdio::null())
    .spawn()
    .expect("corral run");
    // bash and setpriv exec: the pid is corral's.
    let corral = i32::try_from(run.id()).unwrap();
    let pids = sandbox_chain(corral, "corral-ids-test");
    // corral takes its ids back right after the clone, while init sets up
    // on the other CPU: poll rather than race it (a corral that never does
    // fails here).
    let mut corral_ids = Default::default();
    let expected = ["0 0 0 0", "0 0 0 0", "4 27"].map(String::from);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        corral_ids = ["Uid", "Gid", "Groups"].map(|n| status_line(corral, n));
        if corral_ids == expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let init = *pids.last().unwrap();
    let init_status = ["Uid", "Gid", "Groups"].map(|n| status_line(init, n));
    // Right after the program's start init still opens /dev/null for a
    // moment (its own stdio): poll until it holds only what it keeps (one
    // that keeps more fails here).
    let init_fds = || {
        let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{init}/fd"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        fds.sort_unstable();
        fds
    };
    let mut kept = init_fds();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while kept != [0, 1, 2, 3] && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        kept = init_fds();
    }
    let _ = run.kill();
    let _ = run.wait();
    assert_eq!(corral_ids, expected, "corral itself");
    assert_eq!(
        init_status,
        ["65534 65534 65534 65534", "65534 65534 65534 65534", ""],
        "init ({pids:?})"
    );
    assert_eq!(kept, [0, 1, 2, 3], "init's descriptors");
    // On cgroup v1 (the test machines') corral clones init itself: no
    // helper between them, or this test would be checking the helper's
    // layout instead.
    if std::path::Path::new("/sys/fs/cgroup/memory/tasks").exists() {
        assert_eq!(pids.len(), 1, "corral's processes of the sandbox: {pids:?}");
    }
}
