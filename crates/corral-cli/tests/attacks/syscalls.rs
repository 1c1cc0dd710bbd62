//! Kernel interfaces: one test per remaining rule family of the default
//! seccomp deny-list (keys, BPF, perf, userfaultfd, io_uring, kexec,
//! modules, reboot, swap, accounting, quotas, file handles, personality,
//! fanotify, the kernel log), and the other syscall ABIs (i386, x32).

use crate::common::*;
use crate::support::*;

#[test]
fn attack_keyctl_is_refused() {
    if !x86_64("attack_keyctl_is_refused") {
        return;
    }
    // Baseline: keyring serial numbers (keyrings are not namespaced).
    expect(
        r#"say('KEYCTL_GET_KEYRING_ID session', sc(250, 0, -3, 0))
say('KEYCTL_GET_KEYRING_ID user', sc(250, 0, -4, 0))
say('KEYCTL_JOIN_SESSION_KEYRING', sc(250, 1, 0))
say('KEYCTL_READ user', sc(250, 11, -4, 0, 0))
"#,
        "KEYCTL_GET_KEYRING_ID session EPERM\nKEYCTL_GET_KEYRING_ID user EPERM\n\
         KEYCTL_JOIN_SESSION_KEYRING EPERM\nKEYCTL_READ user EPERM\n",
    );
}

#[test]
fn attack_add_key_and_request_key_are_refused() {
    if !x86_64("attack_add_key_and_request_key_are_refused") {
        return;
    }
    // Baseline: a key serial for both.
    expect(
        r#"say('add_key', sc(248, 'user', 'corral', 'secret', 6, -2))
say('request_key', sc(249, 'user', 'corral', 0, -2))
"#,
        "add_key EPERM\nrequest_key EPERM\n",
    );
}

#[test]
fn attack_bpf_is_refused() {
    if !x86_64("attack_bpf_is_refused") {
        return;
    }
    // Baseline for the bad pointer: EFAULT (the attr is copied first).
    expect(
        r#"attr = ctypes.create_string_buffer(128)
struct.pack_into('=IIII', attr, 0, 2, 4, 4, 1)
say('BPF_MAP_CREATE', sc(321, 0, attr, 72))
say('BPF_PROG_LOAD', sc(321, 5, attr, 128))
say('bad pointer', sc(321, 0, 1, 16))
"#,
        "BPF_MAP_CREATE EPERM\nBPF_PROG_LOAD EPERM\nbad pointer EPERM\n",
    );
}

#[test]
fn attack_perf_event_open_is_refused() {
    if !x86_64("attack_perf_event_open_is_refused") {
        return;
    }
    // Baseline for the null attr: EFAULT.
    expect(
        r#"attr = ctypes.create_string_buffer(128)
struct.pack_into('=IIQ', attr, 0, 1, 128, 0)
say('software clock on self', sc(298, attr, 0, -1, -1, 0))
say('any cpu', sc(298, attr, -1, 0, -1, 0))
say('null attr', sc(298, 0, 0, -1, -1, 0))
"#,
        "software clock on self EPERM\nany cpu EPERM\nnull attr EPERM\n",
    );
}

#[test]
fn attack_userfaultfd_is_refused() {
    if !x86_64("attack_userfaultfd_is_refused") {
        return;
    }
    // Baseline: UFFD_USER_MODE_ONLY is allowed to anyone and returns an fd.
    expect(
        r#"say('userfaultfd(UFFD_USER_MODE_ONLY)', sc(323, 1))
say('userfaultfd(O_CLOEXEC|UFFD_USER_MODE_ONLY)', sc(323, 0x80001))
say('/dev/userfaultfd', try_(lambda: open('/dev/userfaultfd', 'rb')))
"#,
        "userfaultfd(UFFD_USER_MODE_ONLY) EPERM\nuserfaultfd(O_CLOEXEC|UFFD_USER_MODE_ONLY) EPERM\n\
         /dev/userfaultfd ENOENT\n",
    );
}

#[test]
fn attack_io_uring_is_refused() {
    if !x86_64("attack_io_uring_is_refused") {
        return;
    }
    // Baseline: io_uring_setup returns a ring fd (kernel.io_uring_disabled
    // = 0 here); its operations would run outside seccomp's view.
    expect(
        r#"params = ctypes.create_string_buffer(120)
say('io_uring_setup', sc(425, 8, params))
say('io_uring_enter', sc(426, 0, 1, 0, 0, 0, 0))
say('io_uring_register', sc(427, 0, 0, 0, 0))
"#,
        "io_uring_setup EPERM\nio_uring_enter EPERM\nio_uring_register EPERM\n",
    );
}

#[test]
fn attack_kexec_is_refused() {
    if !x86_64("attack_kexec_is_refused") {
        return;
    }
    expect(
        r#"say('kexec_load', sc(246, 0, 0, 0, 0))
fd = os.open('/usr/bin/python3', os.O_RDONLY)
say('kexec_file_load', sc(320, fd, fd, 1, '', 0))
"#,
        "kexec_load EPERM\nkexec_file_load EPERM\n",
    );
}

#[test]
fn attack_kernel_module_loading_is_refused() {
    if !x86_64("attack_kernel_module_loading_is_refused") {
        return;
    }
    expect(
        r#"image = ctypes.create_string_buffer(b'\x7fELF', 64)
say('init_module', sc(175, image, 64, ''))
fd = os.open('/usr/bin/python3', os.O_RDONLY)
say('finit_module', sc(313, fd, '', 0))
say('delete_module', sc(176, 'ext4', os.O_NONBLOCK))
"#,
        "init_module EPERM\nfinit_module EPERM\ndelete_module EPERM\n",
    );
}

#[test]
fn attack_reboot_is_refused() {
    if !x86_64("attack_reboot_is_refused") {
        return;
    }
    // LINUX_REBOOT_CMD_CAD_OFF: the mildest command, with the real magic.
    expect(
        r#"say('reboot CAD_OFF', sc(169, 0xfee1dead, 672274793, 0, 0))
say('reboot POWER_OFF', sc(169, 0xfee1dead, 672274793, 0x4321fedc, 0))
"#,
        "reboot CAD_OFF EPERM\nreboot POWER_OFF EPERM\n",
    );
}

#[test]
fn attack_swapon_and_swapoff_are_refused() {
    if !x86_64("attack_swapon_and_swapoff_are_refused") {
        return;
    }
    // Baseline for the unknown flags: EINVAL.
    expect(
        r#"open('/tmp/swap', 'wb').write(b'\0' * 65536)
say('swapon', sc(167, '/tmp/swap', 0))
say('swapon bad flags', sc(167, '/tmp/swap', 0xffffffff))
say('swapoff', sc(168, '/tmp/swap'))
"#,
        "swapon EPERM\nswapon bad flags EPERM\nswapoff EPERM\n",
    );
}

#[test]
fn attack_acct_is_refused() {
    if !x86_64("attack_acct_is_refused") {
        return;
    }
    expect(
        r#"open('/tmp/acct', 'wb').close()
say('acct on', sc(163, '/tmp/acct'))
say('acct off', sc(163, 0))
"#,
        "acct on EPERM\nacct off EPERM\n",
    );
}

#[test]
fn attack_quotactl_is_refused() {
    if !x86_64("attack_quotactl_is_refused") {
        return;
    }
    // Baseline for the unknown quota type: EINVAL.
    expect(
        r#"buf = ctypes.create_string_buffer(128)
say('Q_GETQUOTA', sc(179, (0x800007 << 8) | 0, '/tmp', os.getuid(), buf))
say('Q_SYNC all', sc(179, (0x800001 << 8) | 0, 0, 0, 0))
say('bad type', sc(179, (0x800001 << 8) | 7, 0, 0, 0))
"#,
        "Q_GETQUOTA EPERM\nQ_SYNC all EPERM\nbad type EPERM\n",
    );
}

#[test]
fn attack_quotactl_fd_is_refused_like_quotactl() {
    if !x86_64("attack_quotactl_fd_is_refused_like_quotactl") {
        return;
    }
    // Baseline: ESRCH from the filesystem (no quotas on /usr), not EPERM.
    expect(
        r#"fd = os.open('/usr', os.O_RDONLY)
say('quotactl_fd Q_GETQUOTA', sc(443, fd, (0x800007 << 8) | 0, os.getuid(), ctypes.create_string_buffer(128)))
"#,
        "quotactl_fd Q_GETQUOTA EPERM\n",
    );
}

#[test]
fn attack_open_by_handle_at_shocker_is_refused() {
    if !x86_64("attack_open_by_handle_at_shocker_is_refused") {
        return;
    }
    // CVE-2014-3519: a file handle opens files by inode, past any mount.
    // Baseline: name_to_handle_at succeeds unprivileged; open_by_handle_at
    // with a bad mount fd is EBADF.
    expect(
        r#"handle = ctypes.create_string_buffer(136)
struct.pack_into('=I', handle, 0, 128)
mount_id = ctypes.c_int()
say('name_to_handle_at', sc(303, -100, '/tmp', handle, ctypes.byref(mount_id), 0))
struct.pack_into('=IiQ', handle, 0, 8, 1, 2)
say('open_by_handle_at root inode', sc(304, os.open('/tmp', os.O_RDONLY), handle, 0))
say('open_by_handle_at bad fd', sc(304, -1, handle, 0))
"#,
        "name_to_handle_at EPERM\nopen_by_handle_at root inode EPERM\nopen_by_handle_at bad fd EPERM\n",
    );
}

#[test]
fn attack_personality_changes_are_refused() {
    if !x86_64("attack_personality_changes_are_refused") {
        return;
    }
    // Baseline: all succeed (0xffffffff only queries).
    expect(
        r#"say('READ_IMPLIES_EXEC', sc(135, 0x0400000))
say('ADDR_NO_RANDOMIZE', sc(135, 0x0040000))
say('query', sc(135, 0xffffffff))
say('personality now', open('/proc/self/personality').read().strip())
"#,
        "READ_IMPLIES_EXEC EPERM\nADDR_NO_RANDOMIZE EPERM\nquery EPERM\npersonality now 00000000\n",
    );
}

#[test]
fn attack_fanotify_groups_are_refused() {
    if !x86_64("attack_fanotify_groups_are_refused") {
        return;
    }
    // Baseline: since Linux 5.13 an unprivileged process gets a group
    // with FAN_REPORT_FID (0x200), and the groups of every sandbox count
    // against one budget of the host user they share (128 by default):
    // one sandbox holding them all left the others none.
    expect(
        r#"say('fanotify_init', sc(300, 0x200, 0))
say('fanotify_init FAN_CLASS_CONTENT', sc(300, 0x4, 0))
"#,
        "fanotify_init EPERM\nfanotify_init FAN_CLASS_CONTENT EPERM\n",
    );
}

#[test]
fn attack_kernel_log_and_obsolete_entry_points_are_refused() {
    if !x86_64("attack_kernel_log_and_obsolete_entry_points_are_refused") {
        return;
    }
    // Baselines: syslog SIZE_BUFFER is allowed with dmesg_restrict=0;
    // lookup_dcookie and uselib are ENOSYS on modern kernels.
    expect(
        r#"say('syslog SIZE_BUFFER', sc(103, 10, 0, 0))
say('syslog READ_ALL', sc(103, 3, ctypes.create_string_buffer(4096), 4096))
say('vhangup', sc(153))
say('lookup_dcookie', sc(212, 0, 0, 0))
say('uselib', sc(134, '/usr/bin/python3'))
"#,
        "syslog SIZE_BUFFER EPERM\nsyslog READ_ALL EPERM\nvhangup EPERM\nlookup_dcookie EPERM\nuselib EPERM\n",
    );
}

/// getpid through another ABI: `int 0x80` (i386 table, eax 20) or the
/// x32 table (39 | __X32_SYSCALL_BIT). Prints before and after.
const OTHER_ABI: &str = r#"#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>

int main(int argc, char **argv) {
    long r;
    if (argc < 2) return 2;
    printf("calling %s\n", argv[1]);
    fflush(stdout);
    if (strcmp(argv[1], "int80") == 0) {
        __asm__ volatile ("int $0x80" : "=a"(r) : "a"(20L) : "memory", "r8", "r9", "r10", "r11");
    } else {
        r = syscall(39 | 0x40000000L);
    }
    printf("survived: %ld errno %d\n", r, errno);
    return 0;
}
"#;

#[test]
fn attack_i386_syscall_via_int_0x80_kills_the_process() {
    if !x86_64("attack_i386_syscall_via_int_0x80_kills_the_process") {
        return;
    }
    let prog = CProgram::compile("abi", OTHER_ABI);
    let out = prog.run(&[], &["/opt/attack/abi", "int80"]);
    // Baseline: returns the pid (or -ENOSYS without IA32 emulation).
    assert_eq!(
        text(&out.stdout),
        "calling int80\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(128 + 31), "SIGSYS: {out:?}");
}

#[test]
fn attack_x32_syscall_kills_the_process() {
    if !x86_64("attack_x32_syscall_kills_the_process") {
        return;
    }
    let prog = CProgram::compile("abi", OTHER_ABI);
    let (v, out) = run_json(
        &[
            "--config",
            prog.cfg.to_str().expect("utf-8"),
            "--profile",
            "attack",
            "--ro",
            &prog.bind(),
        ],
        &["/opt/attack/abi", "x32"],
    );
    // Baseline: the pid, or ENOSYS on kernels without x32.
    assert_eq!(v["stdout"], "calling x32\n", "{v}");
    assert_eq!(v["signal"], 31, "{v}");
    assert_eq!(out.status.code(), Some(159));
}
