//! Secrets: corral's environment, /proc of every visible pid, inherited
//! descriptors.

use crate::common::*;
use crate::support::*;

#[test]
fn attack_dumping_the_environment_finds_none_of_corrals_secrets() {
    let token = secret();
    let mut c = corral_run();
    for name in [
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "OPENAI_API_KEY",
        "DATABASE_URL",
        "SSH_AUTH_SOCK",
        "KUBECONFIG",
        "CORRAL_SECRET",
    ] {
        c.env(name, &token);
    }
    c.env("HOME", "/root")
        .env("USER", "root")
        .env("LD_PRELOAD", "/evil.so");
    let out = c
        .args([
            "--",
            "python3",
            "-c",
            "import os, json; print(json.dumps(dict(os.environ)))",
        ])
        .output()
        .expect("spawn corral");
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s} {}", text(&out.stderr));
    assert!(!s.contains(&token), "a secret leaked: {s}");
    let v: serde_json::Value = serde_json::from_str(&s).expect("json");
    let env = v.as_object().expect("object");
    let keys: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "HOME",
            "LANG",
            "PATH",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONUNBUFFERED",
            "TMPDIR"
        ],
        "only the profile's environment reaches the program"
    );
    assert_eq!(env["HOME"], "/workspace");
}

#[test]
fn attack_proc_1_environ_of_init_reveals_no_secret() {
    let token = secret();
    let body = format!(
        r#"TOKEN = bytes.fromhex('{}')
for f in ('/proc/1/environ', '/proc/1/task/1/environ', '/proc/1/cmdline', '/proc/1/task/1/cmdline'):
    try:
        data = open(f, 'rb').read()
        say(f, 'LEAK' if TOKEN in data else ('empty' if not data.strip(b'\0') else 'clean'))
    except OSError as e:
        say(f, _name(e.errno))
"#,
        hex(&token)
    );
    let out = corral_run()
        .env("CORRAL_SECRET", &token)
        .env("GITHUB_TOKEN", &token)
        .args(["--", "python3", "-c", &format!("{PRELUDE}{body}")])
        .output()
        .expect("spawn corral");
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s} {}", text(&out.stderr));
    assert!(!s.contains("LEAK"), "{s}");
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 4, "{s}");
    for l in &lines[..2] {
        assert!(
            l.ends_with(" EACCES") || l.ends_with(" empty"),
            "init's environment must be unreadable or wiped: {l}"
        );
    }
    for l in &lines[2..] {
        assert!(l.ends_with(" clean"), "{l}");
    }
}

#[test]
fn attack_proc_1_memory_maps_and_auxv_are_unreadable() {
    // PID 1 is non-dumpable: without that, the same uid could read them all.
    expect(
        r#"for f in ('mem', 'task/1/mem', 'maps', 'smaps', 'smaps_rollup', 'pagemap', 'auxv', 'stack', 'syscall', 'io', 'personality'):
    say(f, try_(lambda: open('/proc/1/' + f, 'rb').read(1)))
"#,
        "mem EACCES\ntask/1/mem EACCES\nmaps EACCES\nsmaps EACCES\nsmaps_rollup EACCES\n\
         pagemap EACCES\nauxv EACCES\nstack EACCES\nsyscall EACCES\nio EACCES\npersonality EACCES\n",
    );
}

#[test]
fn attack_proc_1_root_cwd_and_exe_cannot_be_followed() {
    // Init's exe is corral's binary on the host; its root and cwd are links a
    // same-uid process could follow without the non-dumpable flag.
    expect(
        r#"for l in ('root', 'cwd', 'exe'):
    say('readlink', l, try_(lambda: os.readlink('/proc/1/' + l)))
say('list root', try_(lambda: os.listdir('/proc/1/root/')))
say('read through root', try_(lambda: open('/proc/1/root/etc/hostname').read()))
say('chdir cwd', try_(lambda: os.chdir('/proc/1/cwd')))
say('read exe', try_(lambda: open('/proc/1/exe', 'rb').read(4)))
"#,
        "readlink root EACCES\nreadlink cwd EACCES\nreadlink exe EACCES\nlist root EACCES\n\
         read through root EACCES\nchdir cwd EACCES\nread exe EACCES\n",
    );
}

#[test]
fn attack_proc_1_fd_table_and_namespace_links_are_refused() {
    // Init holds the pipes to corral; its namespace links would let setns in.
    expect(
        r#"say('list fd', try_(lambda: os.listdir('/proc/1/fd')))
say('list fdinfo', try_(lambda: os.listdir('/proc/1/fdinfo')))
for n in range(5):
    say('open fd', n, try_(lambda: open('/proc/1/fd/%d' % n, 'rb')))
for ns in ('mnt', 'user', 'pid', 'net'):
    say('open ns', ns, try_(lambda: os.open('/proc/1/ns/' + ns, os.O_RDONLY)))
"#,
        "list fd EACCES\nlist fdinfo EACCES\nopen fd 0 EACCES\nopen fd 1 EACCES\nopen fd 2 EACCES\n\
         open fd 3 EACCES\nopen fd 4 EACCES\nopen ns mnt EACCES\nopen ns user EACCES\n\
         open ns pid EACCES\nopen ns net EACCES\n",
    );
}

#[test]
fn attack_pidfd_getfd_cannot_steal_the_descriptors_of_init() {
    if !x86_64("attack_pidfd_getfd_cannot_steal_the_descriptors_of_init") {
        return;
    }
    // pidfd_open(434), pidfd_getfd(438), pidfd_send_signal(424). Without the
    // non-dumpable init (and Landlock's signal scope), same-uid getfd
    // would hand over init's pipes to corral.
    expect(
        r#"pidfd, e = scr(434, 1, 0)
say('pidfd_open', e)
for n in range(5):
    say('pidfd_getfd', n, sc(438, pidfd, n, 0))
say('pidfd_send_signal SIGKILL', sc(424, pidfd, 9, 0, 0))
say('init alive', os.path.exists('/proc/1/status'))
"#,
        "pidfd_open ok\npidfd_getfd 0 EPERM\npidfd_getfd 1 EPERM\npidfd_getfd 2 EPERM\n\
         pidfd_getfd 3 EPERM\npidfd_getfd 4 EPERM\npidfd_send_signal SIGKILL EPERM\ninit alive True\n",
    );
}

#[test]
fn attack_scanning_for_inherited_descriptors_finds_only_stdio() {
    // corral is started with three extra descriptors open without
    // close-on-exec (a secret file at 200 and 255, a socket at 201): the
    // program probes every possible descriptor number.
    let token = secret();
    let dir = readable_dir();
    let file = dir.path().join("secret");
    std::fs::write(&file, &token).expect("write");
    let script = "exec 200<\"$1\" 255<\"$1\" 201<>/dev/null; shift; exec \"$@\"";
    let body = r#"found = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        found.append(fd)
    except OSError:
        pass
say('open descriptors beyond stdio', found)
say('read 200', try_(lambda: os.read(200, 100)))
say('read 255', try_(lambda: os.read(255, 100)))
"#;
    let out = corral_run_via_bash(script, &[file.as_os_str()])
        .args(["--", "python3", "-c", &format!("{PRELUDE}{body}")])
        .output()
        .expect("spawn");
    let s = text(&out.stdout);
    assert!(!s.contains(&token), "{s}");
    assert_eq!(
        s,
        "open descriptors beyond stdio []\nread 200 EBADF\nread 255 EBADF\n",
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn attack_reading_proc_of_a_host_process_by_pid_finds_nothing() {
    let token = secret();
    let mut host = victim(&[("CORRAL_SECRET", &token)]);
    let pid = host.id();
    assert!(pid > 10, "host pid {pid} could collide with a sandbox pid");
    let body = format!(
        r#"TOKEN = bytes.fromhex('{}')
for f in ('environ', 'cmdline', 'status', 'root', 'mem'):
    try:
        data = open('/proc/{pid}/' + f, 'rb').read()
        say(f, 'LEAK' if TOKEN in data else 'readable')
    except OSError as e:
        say(f, _name(e.errno))
"#,
        hex(&token)
    );
    let (code, out, err) = attack(&[], &body);
    let _ = host.kill();
    let _ = host.wait();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, "environ ENOENT\ncmdline ENOENT\nstatus ENOENT\nroot ENOENT\nmem ENOENT\n",
        "host pids do not exist in the sandbox's pid namespace"
    );
}
