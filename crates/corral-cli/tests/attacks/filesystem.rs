//! Filesystem: root-only files, writes outside the workspace, races,
//! links, special files, denied paths, and read-only places where
//! Landlock and the mounts each refuse on their own.

use crate::common::*;
use crate::support::*;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn attack_host_credentials_and_shadow_files_are_absent() {
    assert!(
        Path::new("/etc/shadow").exists(),
        "the target exists on the host"
    );
    expect(
        r#"for p in ('/etc/shadow', '/etc/gshadow', '/etc/sudoers', '/etc/ssh', '/root', '/home', '/var', '/run', '/boot', '/etc/machine-id', '/workspace/../../etc/shadow', '/tmp/../../../etc/shadow', '/usr/../etc/shadow'):
    say(p, try_(lambda: os.stat(p)))
"#,
        "/etc/shadow ENOENT\n/etc/gshadow ENOENT\n/etc/sudoers ENOENT\n/etc/ssh ENOENT\n/root ENOENT\n\
         /home ENOENT\n/var ENOENT\n/run ENOENT\n/boot ENOENT\n/etc/machine-id ENOENT\n\
         /workspace/../../etc/shadow ENOENT\n/tmp/../../../etc/shadow ENOENT\n/usr/../etc/shadow ENOENT\n",
    );
}

#[test]
fn attack_root_only_file_bound_in_cannot_be_read_chmodded_or_linked() {
    let before = std::fs::metadata("/etc/shadow").expect("host /etc/shadow");
    let (code, out, err) = attack(
        &["--ro", "/etc/shadow:/data/shadow"],
        r#"say('read', try_(lambda: open('/data/shadow').read()))
say('chmod', try_(lambda: os.chmod('/data/shadow', 0o644)))
say('chown', try_(lambda: os.chown('/data/shadow', os.getuid(), os.getgid())))
say('link into /tmp', try_(lambda: os.link('/data/shadow', '/tmp/shadow')))
say('link into workspace', try_(lambda: os.link('/data/shadow', '/workspace/shadow')))
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "read EACCES\nchmod EROFS\nchown EROFS\nlink into /tmp EXDEV\nlink into workspace EXDEV\n"
    );
    let after = std::fs::metadata("/etc/shadow").expect("host /etc/shadow");
    assert_eq!(before.mode(), after.mode());
    assert_eq!(before.uid(), after.uid());
}

#[test]
fn attack_writes_to_system_files_and_ld_so_preload_fail() {
    assert!(
        !Path::new("/etc/ld.so.preload").exists(),
        "host already has /etc/ld.so.preload"
    );
    let (code, out, err) = attack(
        &[],
        r#"attempts = [
    ('create /etc/ld.so.preload', lambda: open('/etc/ld.so.preload', 'w')),
    ('append /etc/passwd', lambda: open('/etc/passwd', 'a')),
    ('open python for writing', lambda: open('/usr/bin/python3', 'r+b')),
    ('truncate python', lambda: os.truncate('/usr/bin/python3', 0)),
    ('chmod python setuid', lambda: os.chmod('/usr/bin/python3', 0o4777)),
    ('utime python', lambda: os.utime('/usr/bin/python3', (0, 0))),
    ('unlink /etc/hostname', lambda: os.unlink('/etc/hostname')),
    ('rename /usr/bin', lambda: os.rename('/usr/bin', '/usr/bin2')),
    ('mkdir /pwn', lambda: os.mkdir('/pwn')),
    ('symlink in /usr/lib', lambda: os.symlink('/tmp/x', '/usr/lib/pwn.so')),
    ('create in /dev', lambda: open('/dev/pwn', 'w')),
]
for name, f in attempts:
    say(name, try_(f))
"#,
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 11, "{out}");
    for l in lines {
        let e = l.rsplit(' ').next().unwrap_or("");
        assert!(
            ["EROFS", "EACCES", "EPERM"].contains(&e),
            "a write outside the workspace was not refused: {l}"
        );
    }
    assert!(!Path::new("/etc/ld.so.preload").exists());
    assert!(!Path::new("/usr/lib/pwn.so").exists());
}

#[test]
fn attack_symlink_swap_race_inside_the_workspace_never_reaches_host_files() {
    // A host directory that is bound nowhere holds the prize. Inside, one
    // process swaps `link` between a real directory and a symlink to the
    // prize's host path (RENAME_EXCHANGE, atomically, thousands of times)
    // while another reads and writes through `link`. Everything resolves in
    // the sandbox's own mount namespace, so the host path means nothing.
    let token = secret();
    let prize = readable_dir();
    std::fs::write(prize.path().join("secret"), &token).expect("write");
    std::fs::set_permissions(
        prize.path().join("secret"),
        PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let dir = workdir();
    let wd = dir.path().to_str().expect("utf-8").to_string();
    let body = format!(
        r#"TOKEN = bytes.fromhex('{tok}')
os.mkdir('real')
open('real/secret', 'w').write('decoy')
os.symlink('{prize}', 'alias')
os.rename('real', 'link')
child = os.fork()
if child == 0:
    for _ in range(20000):
        libc.renameat2(-100, b'link', -100, b'alias', 2)
    os._exit(0)
leaks, decoys, writes = 0, 0, 0
for _ in range(4000):
    try:
        data = open('link/secret', 'rb').read()
        if TOKEN in data:
            leaks += 1
        else:
            decoys += 1
    except OSError:
        pass
    try:
        open('link/pwned', 'w').write('x')
        writes += 1
    except OSError:
        pass
os.waitpid(child, 0)
say('leaks', leaks)
say('decoy reads', decoys > 0)
"#,
        tok = hex(&token),
        prize = prize.path().display()
    );
    let (code, out, err) = attack(&["--workdir", &wd], &body);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "leaks 0\ndecoy reads True\n", "{err}");
    assert_eq!(
        names(prize.path()),
        ["secret"],
        "a write reached the host directory"
    );
}

#[test]
fn attack_rename_race_against_corrals_mount_setup_never_escapes_the_workdir() {
    // Sandbox A swaps `sub` in a shared workdir between a real directory
    // and a symlink to a host directory, as fast as it can. Meanwhile corral
    // starts sandbox B, again and again, on the same workdir with a bind
    // whose destination lies under `sub`: corral must create that mount
    // point inside the workdir or refuse (125), never follow the swapped-in
    // symlink and create it in the host directory.
    let target = readable_dir();
    if is_root() {
        // Writable for anyone, so only corral's own checks protect it.
        std::fs::set_permissions(target.path(), PermissionsExt::from_mode(0o777)).expect("chmod");
    }
    let dir = workdir();
    let wd = dir.path().to_str().expect("utf-8").to_string();
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::os::unix::fs::symlink(target.path(), dir.path().join("alias")).expect("symlink");
    if is_root() {
        for p in ["sub", "alias"] {
            let st = Command::new("chown")
                .args(["-h", "4242:4242"])
                .arg(dir.path().join(p))
                .status()
                .expect("chown");
            assert!(st.success());
        }
    }
    let swapper = r#"n = 0
deadline = time.time() + 20
while not os.path.exists('/workspace/stop') and time.time() < deadline:
    for _ in range(500):
        if libc.renameat2(-100, b'/workspace/sub', -100, b'/workspace/alias', 2) == 0:
            n += 1
    if not os.path.exists('/workspace/started'):
        open('/workspace/started', 'w').close()
say('swapped', n > 1000)
"#;
    let a = corral_run()
        .args([
            "--timeout",
            "40",
            "--workdir",
            &wd,
            "--",
            "python3",
            "-c",
            &format!("{PRELUDE}{swapper}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn swapper");
    wait_until(15, "the swapper never started", || {
        dir.path().join("started").exists()
    });
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..12 {
        let out = run(
            &[
                "--workdir",
                &wd,
                "--ro",
                "/usr/share/zoneinfo:/workspace/sub/x",
            ],
            // The mount moves with its directory, which A keeps renaming.
            &[
                "sh",
                "-c",
                "cd /workspace; for i in 1 2 3 4 5 6 7 8; do \
                 test -e sub/x/UTC && echo mounted && exit 0; \
                 test -e alias/x/UTC && echo mounted && exit 0; done; exit 1",
            ],
        );
        match out.status.code() {
            Some(0) => {
                assert_eq!(text(&out.stdout), "mounted\n");
                ok += 1;
            }
            Some(125) => refused += 1,
            other => panic!("unexpected {other:?}: {}", text(&out.stderr)),
        }
    }
    std::fs::write(dir.path().join("stop"), "").expect("stop");
    let a = a.wait_with_output().expect("swapper");
    assert_eq!(
        text(&a.stdout),
        "swapped True\n",
        "swapper: {}",
        text(&a.stderr)
    );
    assert_eq!(ok + refused, 12);
    eprintln!("rename race: {ok} runs mounted inside the workdir, {refused} refused");
    assert_eq!(
        names(target.path()),
        Vec::<String>::new(),
        "corral created a mount point in the host directory behind the symlink"
    );
}

#[test]
fn attack_renaming_the_workspace_or_a_bind_mount_point_fails() {
    let dir = workdir();
    let out_dir = workdir();
    let wd = dir.path().to_str().expect("utf-8").to_string();
    let rw = format!("{}:/workspace/out", out_dir.path().display());
    let (code, out, err) = attack(
        &["--workdir", &wd, "--rw", &rw],
        r#"os.mkdir('/workspace/decoy')
say('rename /workspace', try_(lambda: os.rename('/workspace', '/w2')))
say('rmdir /workspace', try_(lambda: os.rmdir('/workspace')))
say('rename out', try_(lambda: os.rename('/workspace/out', '/workspace/moved')))
say('rmdir out', try_(lambda: os.rmdir('/workspace/out')))
say('exchange out', lc('renameat2', -100, '/workspace/out', -100, '/workspace/decoy', 2))
say('replace out', lc('renameat2', -100, '/workspace/decoy', -100, '/workspace/out', 0))
open('/workspace/out/file', 'w').write('inside')
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "rename /workspace EROFS\nrmdir /workspace EROFS\nrename out EBUSY\nrmdir out EBUSY\n\
         exchange out EBUSY\nreplace out EBUSY\n"
    );
    assert_eq!(names(out_dir.path()), ["file"]);
}

#[test]
fn attack_hard_links_to_files_outside_the_workspace_fail_with_exdev() {
    let data = readable_dir();
    std::fs::write(data.path().join("f"), "host data").expect("write");
    std::fs::set_permissions(data.path().join("f"), PermissionsExt::from_mode(0o644))
        .expect("chmod");
    let dir = workdir();
    let wd = dir.path().to_str().expect("utf-8").to_string();
    let ro = format!("{}:/data", data.path().display());
    let (code, out, err) = attack(
        &["--workdir", &wd, "--ro", &ro],
        r#"for src, dst in (('/data/f', '/workspace/f'), ('/data/f', '/tmp/f'), ('/etc/passwd', '/workspace/passwd'), ('/usr/bin/python3', '/tmp/py'), ('/etc/hostname', '/dev/shm/h')):
    say(src, dst, try_(lambda: os.link(src, dst)))
os.symlink('/data/f', '/workspace/sym')
say('linkat through a symlink', lc('linkat', -100, '/workspace/sym', -100, '/workspace/f2', 0x400))
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "/data/f /workspace/f EXDEV\n/data/f /tmp/f EXDEV\n/etc/passwd /workspace/passwd EXDEV\n\
         /usr/bin/python3 /tmp/py EXDEV\n/etc/hostname /dev/shm/h EXDEV\nlinkat through a symlink EXDEV\n"
    );
    assert_eq!(
        std::fs::metadata(data.path().join("f"))
            .expect("stat")
            .nlink(),
        1
    );
    assert_eq!(names(dir.path()), ["sym"]);
}

#[test]
fn attack_device_nodes_cannot_be_made_or_opened() {
    let dir = workdir();
    let wd = dir.path().to_str().expect("utf-8").to_string();
    if is_root() {
        // The host plants a character device (1,3: a /dev/null twin) in
        // the workdir: the mount is nodev, so it must not open.
        let planted = dir.path().join("planted");
        let st = Command::new("mknod")
            .arg(&planted)
            .args(["c", "1", "3"])
            .status()
            .expect("mknod");
        assert!(st.success());
        std::fs::set_permissions(&planted, PermissionsExt::from_mode(0o666)).expect("chmod");
    }
    let (code, out, err) = attack(
        &["--workdir", &wd],
        r#"say('mknod /dev/mem twin in /tmp', try_(lambda: os.mknod('/tmp/mem', 0o20666, os.makedev(1, 1))))
say('mknod kmsg in workspace', try_(lambda: os.mknod('/workspace/kmsg', 0o20666, os.makedev(1, 11))))
say('mknod disk in /dev/shm', try_(lambda: os.mknod('/dev/shm/sda', 0o60666, os.makedev(8, 0))))
if os.path.exists('/workspace/planted'):
    say('open planted device', try_(lambda: open('/workspace/planted', 'rb').read(1)))
"#,
    );
    assert_eq!(code, 0, "{err}");
    let mut expected = String::from(
        "mknod /dev/mem twin in /tmp EPERM\nmknod kmsg in workspace EPERM\nmknod disk in /dev/shm EPERM\n",
    );
    if is_root() {
        expected.push_str("open planted device EACCES\n");
    }
    assert_eq!(out, expected);
}

#[test]
fn attack_dev_mem_kmem_port_and_disks_are_absent() {
    expect(
        r#"for d in ('mem', 'kmem', 'port', 'kmsg', 'sda', 'vda', 'nvme0n1', 'kvm', 'tty', 'console', 'ptmx', 'net/tun', 'fuse', 'userfaultfd', 'vsock', 'mapper/control'):
    say(d, try_(lambda: open('/dev/' + d, 'rb')))
"#,
        "mem ENOENT\nkmem ENOENT\nport ENOENT\nkmsg ENOENT\nsda ENOENT\nvda ENOENT\nnvme0n1 ENOENT\n\
         kvm ENOENT\ntty ENOENT\nconsole ENOENT\nptmx ENOENT\nnet/tun ENOENT\nfuse ENOENT\n\
         userfaultfd ENOENT\nvsock ENOENT\nmapper/control ENOENT\n",
    );
}

#[test]
fn attack_root_and_dev_are_read_only_run_nothing_and_hide_the_scratch_tmpfs() {
    // The sandbox's / and /dev are directories of the tmpfs corral builds
    // the root in; that tmpfs also holds the host root's parking place and
    // the stand-ins for denied paths, none of which may be reachable, and
    // nothing may be created in / or /dev.
    expect(
        r#"for p in ('/x', '/dev/x', '/dev/shm/../x', '/etc/x'):
    say('create ' + p, try_(lambda: open(p, 'w')))
say('mkdir /dev/d', try_(lambda: os.mkdir('/dev/d')))
say('symlink in /dev', try_(lambda: os.symlink('/proc/self/mem', '/dev/mem')))
say('chmod /dev', try_(lambda: os.chmod('/dev', 0o777)))
names = set(os.listdir('/')) | set(os.listdir('/..')) | set(os.listdir('/proc/self/root/..'))
say('scratch entries', sorted(names & {'oldroot', 'newroot', 'empty-dir', 'empty-file'}))
mounts = [l.split() for l in open('/proc/self/mountinfo')]
root = [m for m in mounts if m[4] == '/'][0]
say('/ options', sorted(set(root[5].split(',')) & {'ro', 'noexec', 'nosuid', 'nodev'}))
say('/dev mounts', sorted(m[4] for m in mounts if m[4] == '/dev'))
"#,
        "create /x EROFS\ncreate /dev/x EROFS\ncreate /dev/shm/../x EROFS\ncreate /etc/x EROFS\n\
         mkdir /dev/d EROFS\nsymlink in /dev EROFS\nchmod /dev EROFS\nscratch entries []\n\
         / options ['nodev', 'noexec', 'nosuid', 'ro']\n/dev mounts []\n",
    );
}

#[test]
fn attack_sys_is_absent_and_cannot_be_mounted() {
    expect(
        r#"for p in ('/sys', '/sys/kernel', '/sys/fs/cgroup', '/sys/firmware', '/sys/class/net'):
    say(p, try_(lambda: os.stat(p)))
say('mount sysfs', lc('mount', 'sysfs', '/tmp', 'sysfs', 0, 0))
"#,
        "/sys ENOENT\n/sys/kernel ENOENT\n/sys/fs/cgroup ENOENT\n/sys/firmware ENOENT\n\
         /sys/class/net ENOENT\nmount sysfs EPERM\n",
    );
}

#[test]
fn attack_kernel_knobs_in_proc_sys_are_not_writable() {
    // core_pattern and modprobe are the classic container escapes (a
    // kernel without modules has no modprobe knob: those are left out).
    let knobs = [
        "kernel/core_pattern",
        "kernel/modprobe",
        "vm/drop_caches",
        "kernel/hostname",
        "net/ipv4/ip_forward",
        "user/max_user_namespaces",
        "fs/suid_dumpable",
    ];
    let present: Vec<&str> = knobs
        .into_iter()
        .filter(|k| Path::new("/proc/sys").join(k).exists())
        .collect();
    assert!(present.contains(&"kernel/core_pattern"));
    let body = format!(
        "for p in {present:?}:\n    say(p, try_(lambda: open('/proc/sys/' + p, 'w').write('|/tmp/x')))\n"
    );
    let expected: String = present.iter().map(|k| format!("{k} EACCES\n")).collect();
    expect(&body, &expected);
}

#[test]
fn attack_denied_paths_stay_hidden_through_aliases() {
    let (_d, cfg) = config(
        "[profile.d]\nextends = \"code\"\n[profile.d.filesystem]\ndeny = [\"/usr/share/doc\", \"/etc/nsswitch.conf\"]\n",
    );
    let (code, out, err) = attack(
        &["--config", cfg.to_str().expect("utf-8"), "--profile", "d"],
        r#"os.symlink('/usr/share/doc', '/tmp/doc')
for p in ('/usr/share/doc', '/proc/self/root/usr/share/doc', '/lib/../share/doc', '/tmp/doc', '/usr/share/./doc'):
    say('list', p, try_(lambda: os.listdir(p)))
for p in ('/etc/nsswitch.conf', '/proc/self/root/etc/nsswitch.conf', '/proc/%d/root/etc/nsswitch.conf' % os.getpid()):
    say('read', p, try_(lambda: open(p).read()))
say('chmod stand-in', try_(lambda: os.chmod('/usr/share/doc', 0o755)))
say('umount stand-in', lc('umount2', '/usr/share/doc', 2))
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "list /usr/share/doc EACCES\nlist /proc/self/root/usr/share/doc EACCES\n\
         list /lib/../share/doc EACCES\nlist /tmp/doc EACCES\nlist /usr/share/./doc EACCES\n\
         read /etc/nsswitch.conf EACCES\nread /proc/self/root/etc/nsswitch.conf EACCES\n\
         read /proc/2/root/etc/nsswitch.conf EACCES\nchmod stand-in EROFS\numount stand-in EPERM\n"
    );
}

#[test]
fn attack_writing_proc_self_mem_and_other_proc_files_is_refused_by_landlock() {
    // /proc is mounted read-write and these files are the program's own,
    // so neither the mount nor the permissions refuse: Landlock's
    // read-only rule on /proc does (EACCES). Baseline: all open.
    expect(
        r#"for f in ('mem', 'comm', 'oom_score_adj', 'attr/current', 'timerslack_ns', 'task/%d/comm' % os.getpid()):
    say(f, try_(lambda: open('/proc/self/' + f, 'r+b')))
say('read mem still allowed', try_(lambda: open('/proc/self/mem', 'rb')))
"#,
        "mem EACCES\ncomm EACCES\noom_score_adj EACCES\nattr/current EACCES\ntimerslack_ns EACCES\n\
         task/2/comm EACCES\nread mem still allowed ok\n",
    );
}

#[test]
fn attack_writes_into_a_read_only_bind_fail() {
    let data = readable_dir();
    std::fs::write(data.path().join("f"), "original").expect("write");
    std::fs::set_permissions(data.path().join("f"), PermissionsExt::from_mode(0o666))
        .expect("chmod");
    std::fs::create_dir(data.path().join("sub")).expect("mkdir");
    std::fs::set_permissions(data.path().join("sub"), PermissionsExt::from_mode(0o777))
        .expect("chmod");
    // World-writable on the host: only the read-only bind and Landlock stop
    // the writes.
    std::fs::set_permissions(data.path(), PermissionsExt::from_mode(0o777)).expect("chmod");
    let (_d, cfg) = config(&format!(
        "[profile.ro]\nextends = \"code\"\n[profile.ro.filesystem]\nread_only = [\"{}:/data\"]\n",
        data.path().display()
    ));
    let (code, out, err) = attack(
        &["--config", cfg.to_str().expect("utf-8"), "--profile", "ro"],
        r#"attempts = [
    ('create', lambda: open('/data/new', 'w')),
    ('append', lambda: open('/data/f', 'a').write('x')),
    ('truncate', lambda: os.truncate('/data/f', 0)),
    ('mkdir', lambda: os.mkdir('/data/d')),
    ('create in subdir', lambda: open('/data/sub/new', 'w')),
    ('symlink', lambda: os.symlink('/', '/data/root')),
    ('rename', lambda: os.rename('/data/f', '/data/g')),
    ('unlink', lambda: os.unlink('/data/f')),
    ('chmod', lambda: os.chmod('/data/f', 0o777)),
    ('utime', lambda: os.utime('/data/f', (0, 0))),
    ('mkfifo', lambda: os.mkfifo('/data/fifo')),
]
for name, f in attempts:
    say(name, try_(f))
say('read', open('/data/f').read())
"#,
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 12, "{out}");
    for l in &lines[..11] {
        let e = l.rsplit(' ').next().unwrap_or("");
        assert!(e == "EROFS" || e == "EACCES", "{l}");
    }
    assert_eq!(lines[11], "read original");
    assert_eq!(names(data.path()), ["f", "sub"]);
    assert_eq!(
        std::fs::read_to_string(data.path().join("f")).expect("read"),
        "original"
    );
}

#[test]
fn attack_writes_into_a_read_only_bind_inside_the_workspace_fail_with_erofs() {
    // The reverse of the /proc case: Landlock grants every right beneath
    // /workspace, so only the read-only mount refuses these writes.
    let data = readable_dir();
    std::fs::write(data.path().join("f"), "original").expect("write");
    std::fs::set_permissions(data.path().join("f"), PermissionsExt::from_mode(0o666))
        .expect("chmod");
    std::fs::set_permissions(data.path(), PermissionsExt::from_mode(0o777)).expect("chmod");
    let ro = format!("{}:/workspace/ro", data.path().display());
    let (code, out, err) = attack(
        &["--ro", &ro],
        r#"say('create', try_(lambda: open('/workspace/ro/new', 'w')))
say('mkdir', try_(lambda: os.mkdir('/workspace/ro/d')))
say('unlink', try_(lambda: os.unlink('/workspace/ro/f')))
say('chmod', try_(lambda: os.chmod('/workspace/ro/f', 0o777)))
say('rename out', try_(lambda: os.rename('/workspace/ro/f', '/workspace/ro/g')))
say('writable next to it', try_(lambda: open('/workspace/ok', 'w').write('x')))
"#,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "create EROFS\nmkdir EROFS\nunlink EROFS\nchmod EROFS\nrename out EROFS\nwritable next to it ok\n"
    );
    assert_eq!(names(data.path()), ["f"]);
}

/// A directory another user owns (as root; the caller's own otherwise)
/// with a 0600 secret in it and a subdirectory: what a planted link
/// would expose.
fn victim_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("corral-victim-")
        .tempdir()
        .expect("tempdir");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir sub");
    let secret = dir.path().join("id_ed25519");
    std::fs::write(&secret, "VICTIM-SECRET-KEY\n").expect("write secret");
    std::fs::set_permissions(&secret, PermissionsExt::from_mode(0o600)).expect("chmod");
    if is_root() {
        let status = std::process::Command::new("chown")
            .args(["-R", "4243:4243"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(status.success());
    }
    dir
}

/// A sandbox plants `name -> target` in its writable workdir `work`, as an
/// untrusted job can between two runs.
fn plant_link(work: &Path, name: &str, target: &Path) {
    let script = format!("ln -s '{}' /workspace/{name}", target.display());
    let out = run(
        &["--workdir", &work.display().to_string()],
        &["sh", "-c", &script],
    );
    assert!(out.status.success(), "planting: {}", text(&out.stderr));
    assert!(std::fs::symlink_metadata(work.join(name))
        .expect("planted link")
        .file_type()
        .is_symlink());
}

#[test]
fn attack_a_planted_symlink_cannot_redirect_a_later_bind() {
    let victim = victim_dir();
    let work = workdir();
    // `out` -> the victim directory, `up` -> its parent (for a link in the
    // middle of the path).
    plant_link(work.path(), "out", victim.path());
    let parent = victim.path().parent().expect("parent");
    plant_link(work.path(), "up", parent);
    let w = work.path().display().to_string();
    let vname = victim
        .path()
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let (_cfg_dir, cfg) = config(&format!(
        "[profile.binds]\nextends = \"code\"\n[profile.binds.filesystem]\nread_only = [\"{w}/out:/data\"]\n"
    ));
    let cfg = cfg.display().to_string();
    let last = format!("{w}/out:/data");
    let middle = format!("{w}/up/{vname}:/data");
    let dotdot = format!("{w}/out/..:/data");
    let workdir_link = format!("{w}/out");
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("--rw, link last", vec!["--rw", &last], "mount.symlink"),
        ("--ro, link last", vec!["--ro", &last], "mount.symlink"),
        (
            "--ro, link in the middle",
            vec!["--ro", &middle],
            "mount.symlink",
        ),
        (
            "--rw, link in the middle",
            vec!["--rw", &middle],
            "mount.symlink",
        ),
        // `..` is refused before any link is looked at.
        ("--ro, link then ..", vec!["--ro", &dotdot], "mount.invalid"),
        (
            "--workdir through a link",
            vec!["--workdir", &workdir_link],
            "mount.symlink",
        ),
        (
            "profile bind through a link",
            vec!["--config", &cfg, "--profile", "binds"],
            "mount.symlink",
        ),
    ];
    let script = "cat /data/id_ed25519 /workspace/id_ed25519 2>/dev/null; \
                  touch /data/planted /workspace/planted 2>/dev/null; true";
    for (what, flags, code) in cases {
        let (v, _) = run_json(&flags, &["sh", "-c", script]);
        assert_eq!(v["error"]["code"], code, "{what}: {v}");
        assert_eq!(v["exit_code"], 125, "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("symlink") || message.contains("`..`"),
            "{what}: {message}"
        );
        assert!(
            !v["stdout"].as_str().unwrap_or("").contains("VICTIM"),
            "{what}: the victim's secret was read: {v}"
        );
    }
    // Nothing was written into the victim's directory.
    let mut left: Vec<String> = std::fs::read_dir(victim.path())
        .expect("read victim")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["id_ed25519", "sub"]);
}

#[test]
fn a_bind_source_without_symlinks_still_works() {
    // The same shapes with the real path: the refusal above is about the
    // link, not about binding the directory.
    let work = workdir();
    std::fs::create_dir(work.path().join("real")).expect("mkdir");
    std::fs::write(work.path().join("real/hello"), "hi\n").expect("write");
    let src = format!("{}/real:/data", work.path().display());
    let (v, _) = run_json(&["--ro", &src], &["sh", "-c", "cat /data/hello"]);
    assert_eq!(v["stdout"], "hi\n", "{v}");
}
