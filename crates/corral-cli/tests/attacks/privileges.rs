//! Privileges: capabilities, setuid and setgid, no_new_privs, chroot,
//! file capabilities, privileged clock and I/O port calls.

use crate::common::*;
use crate::support::*;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

#[test]
fn attack_capset_and_ambient_raise_cannot_regain_capabilities() {
    if !x86_64("attack_capset_and_ambient_raise_cannot_regain_capabilities") {
        return;
    }
    expect(
        r#"hdr = ctypes.create_string_buffer(struct.pack('=Ii', 0x20080522, 0))
full = ctypes.create_string_buffer(b'\xff' * 24)
say('capset everything', sc(126, hdr, full))
say('PR_CAP_AMBIENT_RAISE SYS_ADMIN', sc(157, 47, 2, 21, 0, 0))
say('PR_CAPBSET_READ SYS_ADMIN', scr(157, 23, 21, 0, 0, 0)[0])
for c in ('CapPrm', 'CapEff', 'CapBnd', 'CapAmb'):
    say(c, [l.split()[1] for l in open('/proc/self/status') if l.startswith(c + ':')][0])
"#,
        "capset everything EPERM\nPR_CAP_AMBIENT_RAISE SYS_ADMIN EPERM\nPR_CAPBSET_READ SYS_ADMIN 0\n\
         CapPrm 0000000000000000\nCapEff 0000000000000000\nCapBnd 0000000000000000\n\
         CapAmb 0000000000000000\n",
    );
}

#[test]
fn attack_becoming_root_with_setuid_fails() {
    // uid 0 is not mapped in the sandbox's user namespace: EINVAL where a
    // mapped but unprivileged target would be EPERM.
    let (code, out, err) = attack(
        &[],
        r#"uid = os.getuid()
say('setuid(0)', try_(lambda: os.setuid(0)))
say('setresuid(0,0,0)', try_(lambda: os.setresuid(0, 0, 0)))
say('setgid(0)', try_(lambda: os.setgid(0)))
say('setgroups([0])', try_(lambda: os.setgroups([0])))
open('/tmp/f', 'w').close()
say('chown to root', try_(lambda: os.chown('/tmp/f', 0, 0)))
say('still', os.getuid() == uid, os.geteuid() == uid, os.getresuid())
"#,
    );
    assert_eq!(code, 0, "{err}");
    let u = sandbox_uid();
    assert_eq!(
        out,
        format!(
            "setuid(0) EINVAL\nsetresuid(0,0,0) EINVAL\nsetgid(0) EINVAL\nsetgroups([0]) EPERM\n\
             chown to root EINVAL\nstill True True ({u}, {u}, {u})\n"
        )
    );
}

const WHOAMI: &str = r#"#include <stdio.h>
#include <unistd.h>
#include <sys/auxv.h>

int main(void) {
    printf("uid=%d euid=%d secure=%lu\n", (int)getuid(), (int)geteuid(), getauxval(AT_SECURE));
    return 0;
}
"#;

#[test]
fn attack_setuid_root_binaries_grant_nothing() {
    let prog = CProgram::compile("whoami", WHOAMI);
    if is_root() {
        // A setuid-root copy made by host root and bound in.
        let suid = prog.dir.path().join("whoami-suid");
        std::fs::copy(prog.dir.path().join("whoami"), &suid).expect("copy");
        std::fs::set_permissions(&suid, PermissionsExt::from_mode(0o4755)).expect("chmod");
    }
    let su = std::fs::metadata("/usr/bin/su").expect("/usr/bin/su on the host");
    assert!(
        su.uid() == 0 && su.mode() & 0o4000 != 0,
        "the host's su is setuid root"
    );
    let body = r#"import shutil, subprocess
def run(path):
    return subprocess.run([path], capture_output=True, text=True).stdout.strip()
if os.path.exists('/opt/attack/whoami-suid'):
    say('bound setuid-root copy', run('/opt/attack/whoami-suid'))
for d in ('/tmp', '/workspace', '/dev/shm'):
    shutil.copy('/opt/attack/whoami', d + '/w')
    os.chmod(d + '/w', 0o6755)
    say('setuid copy in', d, run(d + '/w'))
p = subprocess.Popen(['/usr/bin/su', 'root', '-c', 'id'], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
uids = None
for _ in range(500):
    st = open('/proc/%d/status' % p.pid).read()
    if 'Name:\tsu\n' in st:
        uids = [l for l in st.splitlines() if l.startswith('Uid:')][0].split()[1:]
        break
    time.sleep(0.01)
p.kill()
p.wait()
say('su uids', uids)
mounts = {l.split()[4]: l.split()[5] for l in open('/proc/self/mountinfo')}
say('nosuid', [m for m in ('/tmp', '/workspace', '/usr', '/dev/shm', '/opt/attack') if 'nosuid' in mounts[m].split(',')])
"#;
    let out = prog.run(&[], &["python3", "-c", &format!("{PRELUDE}{body}")]);
    let u = sandbox_uid();
    let me = format!("uid={u} euid={u} secure=0");
    let mut expected = String::new();
    if is_root() {
        expected.push_str(&format!("bound setuid-root copy {me}\n"));
    }
    expected.push_str(&format!(
        "setuid copy in /tmp {me}\nsetuid copy in /workspace {me}\nsetuid copy in /dev/shm {me}\n\
         su uids ['{u}', '{u}', '{u}', '{u}']\n\
         nosuid ['/tmp', '/workspace', '/usr', '/dev/shm', '/opt/attack']\n"
    ));
    assert_eq!(text(&out.stdout), expected, "{}", text(&out.stderr));
}

#[test]
fn attack_setgid_root_binary_cannot_be_planted_on_the_host() {
    // Files the sandbox creates in a writable bind land on the host, where
    // nosuid no longer applies. Unprivileged, they carry the invoking
    // user's ids (nothing gained). As root, an ordinary-uid directory whose
    // group is root must be refused or must not yield gid-0 files.
    let dir = workdir();
    let out_dir = workdir();
    if is_root() {
        for d in [dir.path(), out_dir.path()] {
            let st = Command::new("chown")
                .arg("4242:0")
                .arg(d)
                .status()
                .expect("chown");
            assert!(st.success());
        }
    }
    let wd = dir.path().to_str().expect("utf-8").to_string();
    let rw = format!("{}:/out", out_dir.path().display());
    let out = run(
        &["--workdir", &wd, "--rw", &rw],
        &[
            "sh",
            "-c",
            "for d in /workspace /out; do cp /usr/bin/id $d/g && chmod 2755 $d/g; \
             cp /usr/bin/id $d/u && chmod 4755 $d/u; done; true",
        ],
    );
    if out.status.code() == Some(125) {
        assert!(names(dir.path()).is_empty() && names(out_dir.path()).is_empty());
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for d in [dir.path(), out_dir.path()] {
        for n in ["g", "u"] {
            let m = std::fs::metadata(d.join(n)).expect("planted file");
            assert!(
                !(m.mode() & 0o2000 != 0 && m.gid() == 0),
                "setgid-root file planted on the host: {}",
                d.join(n).display()
            );
            assert!(
                !(m.mode() & 0o4000 != 0 && m.uid() == 0),
                "setuid-root file planted on the host: {}",
                d.join(n).display()
            );
        }
    }
}

#[test]
fn attack_no_new_privs_cannot_be_cleared() {
    if !x86_64("attack_no_new_privs_cannot_be_cleared") {
        return;
    }
    expect(
        r#"say('PR_SET_NO_NEW_PRIVS 0', sc(157, 38, 0, 0, 0, 0))
say('PR_GET_NO_NEW_PRIVS', scr(157, 39, 0, 0, 0, 0)[0])
say([l.strip() for l in open('/proc/self/status') if l.startswith(('NoNewPrivs', 'Seccomp:'))])
"#,
        "PR_SET_NO_NEW_PRIVS 0 EINVAL\nPR_GET_NO_NEW_PRIVS 1\n['NoNewPrivs:\\t1', 'Seccomp:\\t2']\n",
    );
}

#[test]
fn attack_chroot_breakout_is_refused() {
    // The classic: chroot into a subdirectory, then chdir("..") past it.
    expect(
        r#"os.mkdir('/tmp/jail')
say('chroot', try_(lambda: os.chroot('/tmp/jail')))
say('fchdir+chroot', try_(lambda: (os.chdir('/'), os.chroot('.'))))
"#,
        "chroot EPERM\nfchdir+chroot EPERM\n",
    );
}

#[test]
fn attack_file_capabilities_cannot_be_set() {
    // security.capability on a copied python would grant caps on exec.
    expect(
        r#"import shutil
shutil.copy('/usr/bin/python3', '/tmp/py')
cap = struct.pack('=IIIII', 0x02000000 | 1, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff)
say('security.capability', try_(lambda: os.setxattr('/tmp/py', 'security.capability', cap)))
say('trusted.x', try_(lambda: os.setxattr('/tmp/py', 'trusted.x', b'1')))
say('security.capability in workspace', try_(lambda: (shutil.copy('/usr/bin/python3', '/workspace/py'), os.setxattr('/workspace/py', 'security.capability', cap))))
"#,
        "security.capability EPERM\ntrusted.x EPERM\nsecurity.capability in workspace EPERM\n",
    );
}

#[test]
fn attack_privileged_clock_and_io_port_syscalls_are_refused() {
    if !x86_64("attack_privileged_clock_and_io_port_syscalls_are_refused") {
        return;
    }
    // Left to the missing capabilities (CAP_SYS_TIME, CAP_SYS_RAWIO).
    let (code, out, err) = attack(
        &[],
        r#"ts = ctypes.create_string_buffer(16)
say('settimeofday', sc(164, ts, 0))
say('clock_settime', sc(227, 0, ts))
tx = ctypes.create_string_buffer(208)
struct.pack_into('=I', tx, 0, 1)
say('adjtimex ADJ_OFFSET', sc(159, tx))
say('iopl', sc(172, 3))
say('ioperm', sc(173, 0x80, 1, 1))
"#,
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        &lines[..3],
        [
            "settimeofday EPERM",
            "clock_settime EPERM",
            "adjtimex ADJ_OFFSET EPERM"
        ]
    );
    // iopl/ioperm: EPERM, or ENOSYS on kernels built without them.
    for l in &lines[3..] {
        assert!(l.ends_with(" EPERM") || l.ends_with(" ENOSYS"), "{l}");
    }
    assert_eq!(lines.len(), 5, "{out}");
}
