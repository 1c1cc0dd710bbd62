//! Namespaces and mounts: the host's hostname and SysV IPC stay out of
//! reach; no new namespace, setns, clone flag, mount or pivot_root.

use crate::support::*;

#[test]
fn attack_hostname_change_is_refused() {
    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    expect(
        r#"say('sethostname', try_(lambda: socket.sethostname('pwned')))
say('setdomainname', lc('setdomainname', b'pwned', 5))
say('hostname', socket.gethostname())
"#,
        "sethostname EPERM\nsetdomainname EPERM\nhostname corral\n",
    );
    let after = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(before, after);
}

/// SysV objects the test creates on the host, removed on drop.
struct HostIpc {
    key: i32,
    shm: i32,
    msg: i32,
    sem: i32,
}

impl HostIpc {
    fn create() -> HostIpc {
        for attempt in 0..64 {
            let low = i32::try_from((std::process::id() + attempt) & 0xffff).expect("16 bits");
            let key = 0x4352_0000 | low;
            let flags = libc::IPC_CREAT | libc::IPC_EXCL | 0o666;
            // SAFETY: shmget takes only integers.
            let shm = unsafe { libc::shmget(key, 4096, flags) };
            if shm < 0 {
                continue;
            }
            // SAFETY: msgget takes only integers.
            let msg = unsafe { libc::msgget(key, flags) };
            // SAFETY: semget takes only integers.
            let sem = unsafe { libc::semget(key, 1, flags) };
            let ipc = HostIpc { key, shm, msg, sem };
            assert!(msg >= 0 && sem >= 0, "msgget/semget on the host failed");
            return ipc;
        }
        panic!("no free SysV key");
    }
}

impl Drop for HostIpc {
    fn drop(&mut self) {
        // SAFETY: IPC_RMID takes no buffer; a null pointer is allowed.
        unsafe {
            libc::shmctl(self.shm, libc::IPC_RMID, std::ptr::null_mut());
        }
        if self.msg >= 0 {
            // SAFETY: as above.
            unsafe {
                libc::msgctl(self.msg, libc::IPC_RMID, std::ptr::null_mut());
            }
        }
        if self.sem >= 0 {
            // SAFETY: IPC_RMID ignores the variadic argument.
            unsafe {
                libc::semctl(self.sem, 0, libc::IPC_RMID);
            }
        }
    }
}

#[test]
fn attack_host_sysv_ipc_objects_are_invisible() {
    let ipc = HostIpc::create();
    let body = format!(
        r#"key, shm, msg = {key}, {shm}, {msg}
say('shmget by key', lc('shmget', key, 0, 0))
say('msgget by key', lc('msgget', key, 0))
say('semget by key', lc('semget', key, 0, 0))
libc.shmat.restype = ctypes.c_long
ctypes.set_errno(0)
r = libc.shmat(shm, None, 0)
say('shmat by id', _name(ctypes.get_errno()) if r == -1 else 'ATTACHED')
say('msgctl by id', lc('msgctl', msg, 2, ctypes.create_string_buffer(256)))
say('listed', len(open('/proc/sysvipc/shm').read().splitlines()) - 1, len(open('/proc/sysvipc/msg').read().splitlines()) - 1)
"#,
        key = ipc.key,
        shm = ipc.shm,
        msg = ipc.msg
    );
    let (code, out, err) = attack(&[], &body);
    drop(ipc);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "shmget by key ENOENT\nmsgget by key ENOENT\nsemget by key ENOENT\nshmat by id EINVAL\n\
         msgctl by id EINVAL\nlisted 0 0\n"
    );
}

#[test]
fn attack_mount_is_refused() {
    if !x86_64("attack_mount_is_refused") {
        return;
    }
    // Baseline for the bad pointers: EFAULT (copied before any check).
    expect(
        r#"say('tmpfs over /tmp', sc(165, 'none', '/tmp', 'tmpfs', 0, 0))
say('remount /usr read-write', sc(165, 'none', '/usr', 0, 0x20 | 0x1000, 0))
say('bind / over workspace', sc(165, '/', '/workspace', 0, 0x1000 | 0x4000, 0))
say('proc', sc(165, 'proc', '/tmp', 'proc', 0, 0))
say('bad pointers', sc(165, 1, 1, 1, 0, 0))
"#,
        "tmpfs over /tmp EPERM\nremount /usr read-write EPERM\nbind / over workspace EPERM\n\
         proc EPERM\nbad pointers EPERM\n",
    );
}

#[test]
fn attack_umount2_is_refused() {
    if !x86_64("attack_umount2_is_refused") {
        return;
    }
    // Baseline for the unknown flag: EINVAL (checked first).
    expect(
        r#"say('detach /tmp', sc(166, '/tmp', 2))
say('umount /usr', sc(166, '/usr', 0))
say('detach /proc', sc(166, '/proc', 2))
say('bad flags', sc(166, '/tmp', 0x80000000))
"#,
        "detach /tmp EPERM\numount /usr EPERM\ndetach /proc EPERM\nbad flags EPERM\n",
    );
}

#[test]
fn attack_pivot_root_is_refused() {
    if !x86_64("attack_pivot_root_is_refused") {
        return;
    }
    expect(
        r#"os.mkdir('/tmp/old')
say('pivot_root /tmp', sc(155, '/tmp', '/tmp/old'))
say('pivot_root . .', sc(155, '.', '.'))
"#,
        "pivot_root /tmp EPERM\npivot_root . . EPERM\n",
    );
}

#[test]
fn attack_new_mount_api_is_refused() {
    if !x86_64("attack_new_mount_api_is_refused") {
        return;
    }
    // Baselines: open_tree without OPEN_TREE_CLONE returns an fd,
    // move_mount with unknown flags EINVAL, fsconfig/fsmount EBADF,
    // mount_setattr with a null attr EINVAL.
    expect(
        r#"say('fsopen tmpfs', sc(430, 'tmpfs', 0))
say('fspick /usr', sc(433, -100, '/usr', 0))
say('open_tree /tmp', sc(428, -100, '/tmp', 0))
say('open_tree clone /', sc(428, -100, '/', 1 | 0x8000))
say('move_mount', sc(429, -1, '', -1, '', 0xffffffff))
say('fsconfig', sc(431, -1, 0, 0, 0, 0))
say('fsmount', sc(432, -1, 0, 0))
say('mount_setattr /usr', sc(442, -100, '/usr', 0, 0, 0))
"#,
        "fsopen tmpfs EPERM\nfspick /usr EPERM\nopen_tree /tmp EPERM\nopen_tree clone / EPERM\n\
         move_mount EPERM\nfsconfig EPERM\nfsmount EPERM\nmount_setattr /usr EPERM\n",
    );
}

#[test]
fn attack_open_tree_attr_is_refused_like_open_tree() {
    if !x86_64("attack_open_tree_attr_is_refused_like_open_tree") {
        return;
    }
    // Baseline on Linux 6.15+: an fd for the plain call; ENOSYS before.
    let (code, out, err) = attack(
        &[],
        r#"say('open_tree_attr /tmp', sc(467, -100, '/tmp', 0, 0, 0))
say('open_tree_attr clone /', sc(467, -100, '/', 1 | 0x8000, 0, 0))
"#,
    );
    assert_eq!(code, 0, "{err}");
    for l in out.lines() {
        let e = l.rsplit(' ').next().unwrap_or("");
        // EPERM from the filter; ENOSYS only on kernels without the call.
        assert!(e == "EPERM" || e == "ENOSYS", "{l}");
    }
    assert_eq!(out.lines().count(), 2, "{out}");
}

#[test]
fn attack_unshare_of_a_user_namespace_is_refused() {
    if !x86_64("attack_unshare_of_a_user_namespace_is_refused") {
        return;
    }
    // Baseline: both calls return 0 (a fresh user namespace regains every
    // capability inside it; unshare(0) is a no-op).
    expect(
        r#"say('unshare(CLONE_NEWUSER)', sc(272, 0x10000000))
say('unshare(0)', sc(272, 0))
say('uid_map lines', len(open('/proc/self/uid_map').read().splitlines()))
import subprocess
p = subprocess.run(['unshare', '-Ur', 'id', '-u'], capture_output=True, text=True)
say('unshare -Ur', p.returncode, p.stdout.strip() == '', 'Operation not permitted' in p.stderr)
"#,
        "unshare(CLONE_NEWUSER) EPERM\nunshare(0) EPERM\nuid_map lines 1\nunshare -Ur 1 True True\n",
    );
}

#[test]
fn nested_user_namespaces_are_also_refused_by_the_namespace_limit() {
    // The second layer behind seccomp (bubblewrap's --disable-userns): the
    // sandbox's own user namespace allows no user namespace below it, and
    // the program cannot raise that limit (EPERM: it holds no capability).
    let host_before = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .expect("host max_user_namespaces");
    expect(
        r#"say('limit', open('/proc/sys/user/max_user_namespaces').read().strip())
try:
    open('/proc/sys/user/max_user_namespaces', 'w').write('10')
    say('raise', 'ok')
except OSError as e:
    say('raise', errno.errorcode[e.errno])
say('limit', open('/proc/sys/user/max_user_namespaces').read().strip())
"#,
        "limit 0\nraise EACCES\nlimit 0\n",
    );
    let host_after = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .expect("host max_user_namespaces");
    assert_eq!(host_before, host_after, "the host's own limit changed");
    assert_ne!(host_after.trim(), "0");
}

#[test]
fn attack_nested_namespaces_of_every_kind_are_refused() {
    if !x86_64("attack_nested_namespaces_of_every_kind_are_refused") {
        return;
    }
    expect(
        r#"flags = [('NEWNS', 0x20000), ('NEWCGROUP', 0x02000000), ('NEWUTS', 0x04000000), ('NEWIPC', 0x08000000), ('NEWUSER', 0x10000000), ('NEWPID', 0x20000000), ('NEWNET', 0x40000000), ('NEWTIME', 0x80), ('NEWUSER|NEWNS|NEWNET', 0x50020000)]
for name, f in flags:
    say('unshare', name, sc(272, f))
"#,
        "unshare NEWNS EPERM\nunshare NEWCGROUP EPERM\nunshare NEWUTS EPERM\nunshare NEWIPC EPERM\n\
         unshare NEWUSER EPERM\nunshare NEWPID EPERM\nunshare NEWNET EPERM\nunshare NEWTIME EPERM\n\
         unshare NEWUSER|NEWNS|NEWNET EPERM\n",
    );
}

#[test]
fn attack_setns_into_any_namespace_is_refused() {
    if !x86_64("attack_setns_into_any_namespace_is_refused") {
        return;
    }
    // Baseline for fd -1: EBADF.
    expect(
        r#"say('setns(-1)', sc(308, -1, 0))
fd = os.open('/proc/self/ns/net', os.O_RDONLY)
say('setns own net ns', sc(308, fd, 0x40000000))
say('open init mnt ns', try_(lambda: os.open('/proc/1/ns/mnt', os.O_RDONLY)))
pidfd, _ = scr(434, 1, 0)
say('setns pidfd of init', sc(308, pidfd, 0x10000000 | 0x20000))
"#,
        "setns(-1) EPERM\nsetns own net ns EPERM\nopen init mnt ns EACCES\nsetns pidfd of init EPERM\n",
    );
}

#[test]
fn attack_clone_with_namespace_flags_is_refused() {
    if !x86_64("attack_clone_with_namespace_flags_is_refused") {
        return;
    }
    // Raw clone(flags | SIGCHLD) without a new stack behaves like fork; the
    // child (only ever created where clone is allowed) leaves at once.
    expect(
        r#"def clone(flags):
    r, e = scr(56, flags | 17, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        return 'ok'
    return e
say('plain clone', clone(0))
for name, f in [('NEWUSER', 0x10000000), ('NEWUSER|NEWNS', 0x10020000), ('NEWNS', 0x20000), ('NEWPID', 0x20000000), ('NEWNET', 0x40000000), ('NEWIPC', 0x08000000), ('NEWUTS', 0x04000000), ('NEWCGROUP', 0x02000000), ('NEWUSER, high word set', 0xffffffff10000000)]:
    say('clone', name, clone(f))
say('plain clone, high word set', clone(0xffffffff00000000))
"#,
        "plain clone ok\nclone NEWUSER EPERM\nclone NEWUSER|NEWNS EPERM\nclone NEWNS EPERM\n\
         clone NEWPID EPERM\nclone NEWNET EPERM\nclone NEWIPC EPERM\nclone NEWUTS EPERM\n\
         clone NEWCGROUP EPERM\nclone NEWUSER, high word set EPERM\nplain clone, high word set ok\n",
    );
}

#[test]
fn attack_clone3_answers_enosys() {
    if !x86_64("attack_clone3_answers_enosys") {
        return;
    }
    // clone3 keeps its flags in memory, out of seccomp's reach. Baselines:
    // EINVAL for a null struct; a child in a new user namespace otherwise.
    expect(
        r#"say('clone3 null', sc(435, 0, 0))
args = ctypes.create_string_buffer(88)
struct.pack_into('=QQQQQ', args, 0, 0x10000000 | 0x20000, 0, 0, 0, 17)
r, e = scr(435, args, 88)
if r == 0:
    os._exit(0)
say('clone3 NEWUSER|NEWNS', e)
pid = os.fork()
if pid == 0:
    os._exit(7)
say('fork still works', os.waitpid(pid, 0)[1] >> 8)
"#,
        "clone3 null ENOSYS\nclone3 NEWUSER|NEWNS ENOSYS\nfork still works 7\n",
    );
}
