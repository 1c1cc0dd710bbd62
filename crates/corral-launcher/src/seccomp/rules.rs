//! The seccomp rules as data, and the BPF programs built from them.
//!
//! This file depends on nothing but `std`, `libc` and `seccompiler`: the
//! launcher's build script includes it too (`#[path]`) and builds every
//! program once at build time (see `build.rs`), so `corral run` does not
//! spend its start-up compiling constant filters. The launcher compiles
//! at run time only when the build could not (a cross build), and its
//! tests check that the prebuilt programs are exactly what this file
//! builds.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

/// One BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bpf {
    /// Operation (`BPF_LD | BPF_W | BPF_ABS` ...).
    pub(crate) code: u16,
    /// Jump offset when the test is true.
    pub(crate) jt: u8,
    /// Jump offset when the test is false.
    pub(crate) jf: u8,
    /// Operand.
    pub(crate) k: u32,
}

/// Every program corral installs; the filters of a run are a few of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Program {
    /// The profile's main filter: the default deny-list or (`strict`) the
    /// allowlist, with or without `AF_UNIX` sockets; either answers
    /// `clone3` with ENOSYS ([`CLONE3_ENOSYS`]).
    Main {
        /// The strict allowlist instead of the default deny-list.
        strict: bool,
        /// `security.unix_sockets`.
        unix_sockets: bool,
    },
    /// What init may still do once the program runs ([`INIT_ALLOWED`]).
    Init,
    /// Reduced mode's extra filter: no socket(2), no SysV IPC, no
    /// scheduling of another process.
    Reduced,
    /// `commands.restrict_exec`'s extra filter: no memfd
    /// ([`restrict_exec_rules`]).
    RestrictExec,
}

impl Program {
    /// Every program, in the order the prebuilt table holds them (read
    /// by build.rs and the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const ALL: [Program; 7] = [
        Program::Main {
            strict: false,
            unix_sockets: false,
        },
        Program::Main {
            strict: false,
            unix_sockets: true,
        },
        Program::Main {
            strict: true,
            unix_sockets: false,
        },
        Program::Main {
            strict: true,
            unix_sockets: true,
        },
        Program::Init,
        Program::Reduced,
        Program::RestrictExec,
    ];

    /// The position of `self` in [`Program::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            Program::Main {
                strict,
                unix_sockets,
            } => usize::from(strict) * 2 + usize::from(unix_sockets),
            Program::Init => 4,
            Program::Reduced => 5,
            Program::RestrictExec => 6,
        }
    }
}

/// `clone3` keeps its flags in memory, out of a filter's reach: the main
/// programs answer it with ENOSYS, whatever their rules say, so the C
/// library falls back to `clone`, whose flags they inspect. (It was a
/// filter of its own; one filter fewer is one fewer to build at each
/// start and to run at each system call.)
pub(crate) const CLONE3_ENOSYS: (i64, u32) = (
    libc::SYS_clone3,
    0x0005_0000 | libc::ENOSYS as u32, // SECCOMP_RET_ERRNO | ENOSYS
);

/// [`CLONE3_ENOSYS`] as the search tree's leaf.
fn clone3_enosys() -> (i64, Leaf) {
    (CLONE3_ENOSYS.0, Leaf::Return(CLONE3_ENOSYS.1))
}

/// The default deny-list's `clone` rule, decided in the search tree: the
/// match action (EPERM) when any namespace flag is set. It says what
/// [`default_rules`]' eight seccompiler rules say (one per flag, the
/// reference the tests hold it to) in one test of the flags' low word,
/// where the kernel reads them (`lower_32_bits(clone_flags)`,
/// kernel/fork.c), instead of eight tests of both words: a load and a
/// `JSET` (and the returns the tree shares) for 74 instructions, which
/// the kernel converts and JIT-compiles at every program's start.
fn clone_namespaces_denied() -> (i64, Leaf) {
    (
        libc::SYS_clone,
        Leaf::AnyFlag {
            arg: 0,
            mask: NS_MASK,
        },
    )
}

/// Builds `program` with seccompiler, the x32 guard added.
pub(crate) fn build(program: Program) -> Result<Vec<Bpf>, String> {
    build_laid_out(program, Layout::Compact)
}

/// [`build`] with the search tree laid out one return per leaf, as it is
/// when the compact layout's jumps would not reach (the tests hold both
/// layouts to seccompiler's program).
#[cfg(test)]
pub(crate) fn build_spread(program: Program) -> Result<Vec<Bpf>, String> {
    build_laid_out(program, Layout::Spread)
}

/// How the search tree is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Leaves jump to returns shared at the tree's end ([`compact_tree`]);
    /// [`Layout::Spread`] where a jump would not reach.
    Compact,
    /// One return per leaf ([`search_tree`]).
    #[cfg_attr(not(test), allow(dead_code))]
    Spread,
}

fn build_laid_out(program: Program, layout: Layout) -> Result<Vec<Bpf>, String> {
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let compile_one =
        |rules, mismatch, matched, own| compile_one(rules, mismatch, matched, own, layout);
    match program {
        Program::Main {
            strict: false,
            unix_sockets,
        } => compile_one(
            default_rules(unix_sockets)?,
            SeccompAction::Allow,
            eperm,
            &[clone3_enosys(), clone_namespaces_denied()],
        ),
        Program::Main {
            strict: true,
            unix_sockets,
        } => compile_one(
            strict_rules(unix_sockets)?,
            eperm,
            SeccompAction::Allow,
            &[clone3_enosys()],
        ),
        Program::Init => {
            let rules = INIT_ALLOWED.iter().map(|(_, nr)| (*nr, vec![])).collect();
            compile_one(rules, eperm, SeccompAction::Allow, &[])
        }
        Program::Reduced => compile_one(reduced_rules()?, SeccompAction::Allow, eperm, &[]),
        Program::RestrictExec => {
            compile_one(restrict_exec_rules()?, SeccompAction::Allow, eperm, &[])
        }
    }
}

/// `commands.restrict_exec`'s rules: no `memfd_create(2)` and no
/// `memfd_secret(2)` at all.
///
/// Landlock's execute right governs files of the mounted tree; a memfd
/// lives outside it, on an internal mount that is not `noexec`. A program
/// could write any binary into one and `execve` it (`/proc/self/fd/N`),
/// and even one sealed against execution (`MFD_NOEXEC_SEAL`) can still be
/// mapped as code by the dynamic loader run as a program (`ld.so
/// /proc/self/fd/N`) or by `dlopen`. So under `restrict_exec` a program
/// gets none (EPERM); the host's `vm.memfd_noexec` cannot be relied on
/// (0 by default) and would not stop the mapping either.
fn restrict_exec_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules = BTreeMap::new();
    rules.insert(libc::SYS_memfd_create, vec![]);
    rules.insert(libc::SYS_memfd_secret, vec![]);
    Ok(rules)
}

/// Reduced mode's extra rules: SysV IPC, every socket(2), and scheduling
/// calls aimed at another process.
fn reduced_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        SYSV_IPC.iter().map(|(_, nr)| (*nr, vec![])).collect();
    // Every socket(2): without a network namespace even AF_UNIX would
    // reach the host's named sockets (the D-Bus session bus, ssh-agent),
    // which Landlock below ABI 9 cannot restrict. socketpair(2) stays.
    rules.insert(libc::SYS_socket, vec![]);
    rules.extend(other_process_scheduling()?);
    Ok(rules)
}

/// `setpriority(2)` and `ioprio_set(2)`'s "every process of a uid".
const PRIO_USER: u64 = 2;
const IOPRIO_WHO_USER: u64 = 3;

/// Scheduling calls aimed at another process: refused in reduced mode.
///
/// Changing another process's nice value, CPU affinity, policy or I/O
/// priority needs no capability when both run as the same uid
/// ([sched(7)](https://man7.org/linux/man-pages/man7/sched.7.html),
/// [setpriority(2)](https://man7.org/linux/man-pages/man2/setpriority.2.html)),
/// and neither Landlock's signal scope nor anything else stands between
/// them. Without a pid namespace the same uid is every other sandbox
/// started by root (uid 65534) or, for an ordinary user, the user's own
/// processes: a program could put them on `SCHED_IDLE` or pin them to
/// one CPU. Inside a pid namespace only the sandbox's own processes and
/// init are reachable, and nothing depends on their priority (corral
/// enforces the timeout and the kill from outside), so the main filter
/// leaves these calls alone: threads address themselves by thread id
/// (`pthread_setaffinity_np`, `pthread_setschedparam`), which a filter
/// cannot tell from another process's pid. Here that is the price: only
/// the calling process itself (pid 0) and its own process group (`who`
/// 0) remain.
fn other_process_scheduling() -> Result<Vec<(i64, Vec<SeccompRule>)>, String> {
    let who_not_self = |arg: u8| rule(vec![cond(arg, Len::Dword, Op::Ne, 0)?]);
    let which_is = |value: u64| rule(vec![cond(0, Len::Dword, Op::Eq, value)?]);
    let mut rules = Vec::new();
    for nr in [
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
    ] {
        rules.push((nr, vec![who_not_self(0)?]));
    }
    rules.push((
        libc::SYS_setpriority,
        vec![who_not_self(1)?, which_is(PRIO_USER)?],
    ));
    rules.push((
        libc::SYS_ioprio_set,
        vec![who_not_self(1)?, which_is(IOPRIO_WHO_USER)?],
    ));
    Ok(rules)
}

const NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];
/// Every namespace flag of `clone(2)`, all in the low word of its flags.
const NS_MASK: u32 = libc::CLONE_NEWNS as u32
    | libc::CLONE_NEWUSER as u32
    | libc::CLONE_NEWPID as u32
    | libc::CLONE_NEWNET as u32
    | libc::CLONE_NEWIPC as u32
    | libc::CLONE_NEWUTS as u32
    | libc::CLONE_NEWCGROUP as u32
    | 0x80; // CLONE_NEWTIME

/// `TIOCSTI`: push a byte into a terminal's input queue (CVE-2017-5226).
const TIOCSTI: u64 = 0x5412;
/// `TIOCLINUX`: the console's selection paste does the same (CVE-2023-1523 class).
const TIOCLINUX: u64 = 0x541C;

/// Syscalls denied outright by the default profile, with the reason.
pub(crate) const DENIED: &[(&str, i64, &str)] = &[
    (
        "ptrace",
        libc::SYS_ptrace,
        "inspect or control other processes",
    ),
    (
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        "read another process's memory",
    ),
    (
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        "write another process's memory",
    ),
    ("mount", libc::SYS_mount, "change the filesystem view"),
    ("umount2", libc::SYS_umount2, "reveal what a mount hides"),
    ("pivot_root", libc::SYS_pivot_root, "change the root"),
    ("fsopen", libc::SYS_fsopen, "new mount API"),
    ("fsconfig", libc::SYS_fsconfig, "new mount API"),
    ("fsmount", libc::SYS_fsmount, "new mount API"),
    ("fspick", libc::SYS_fspick, "new mount API"),
    ("move_mount", libc::SYS_move_mount, "new mount API"),
    ("open_tree", libc::SYS_open_tree, "new mount API"),
    (
        "mount_setattr",
        libc::SYS_mount_setattr,
        "new mount API: clear read-only flags",
    ),
    (
        "unshare",
        libc::SYS_unshare,
        "new namespaces: a fresh user namespace regains capabilities",
    ),
    ("setns", libc::SYS_setns, "enter other namespaces"),
    (
        "keyctl",
        libc::SYS_keyctl,
        "kernel keyrings are not namespaced",
    ),
    (
        "add_key",
        libc::SYS_add_key,
        "kernel keyrings are not namespaced",
    ),
    (
        "request_key",
        libc::SYS_request_key,
        "kernel keyrings are not namespaced",
    ),
    ("bpf", libc::SYS_bpf, "load programs into the kernel"),
    (
        "perf_event_open",
        libc::SYS_perf_event_open,
        "kernel attack surface and side channels",
    ),
    (
        "userfaultfd",
        libc::SYS_userfaultfd,
        "stalls kernel threads; a staple of kernel exploits",
    ),
    (
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        "bypasses seccomp for the operations it runs",
    ),
    (
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        "bypasses seccomp for the operations it runs",
    ),
    (
        "io_uring_register",
        libc::SYS_io_uring_register,
        "bypasses seccomp for the operations it runs",
    ),
    ("kexec_load", libc::SYS_kexec_load, "replace the kernel"),
    (
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        "replace the kernel",
    ),
    ("init_module", libc::SYS_init_module, "load kernel modules"),
    (
        "finit_module",
        libc::SYS_finit_module,
        "load kernel modules",
    ),
    (
        "delete_module",
        libc::SYS_delete_module,
        "unload kernel modules",
    ),
    ("reboot", libc::SYS_reboot, "reboot the host"),
    ("swapon", libc::SYS_swapon, "change host swap"),
    ("swapoff", libc::SYS_swapoff, "change host swap"),
    ("acct", libc::SYS_acct, "process accounting to a file"),
    ("quotactl", libc::SYS_quotactl, "filesystem quotas"),
    ("quotactl_fd", libc::SYS_quotactl_fd, "filesystem quotas"),
    (
        "open_tree_attr",
        SYS_OPEN_TREE_ATTR,
        "new mount API: clone a tree with new attributes",
    ),
    (
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        "file handles escape mount confinement (CVE-2014-3519, 'shocker')",
    ),
    (
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        "file handles escape mount confinement (CVE-2014-3519, 'shocker')",
    ),
    (
        "lookup_dcookie",
        libc::SYS_lookup_dcookie,
        "kernel internals",
    ),
    ("vhangup", libc::SYS_vhangup, "hang up a terminal"),
    ("syslog", libc::SYS_syslog, "read the kernel log"),
    ("uselib", libc::SYS_uselib, "obsolete loader entry point"),
    (
        "personality",
        libc::SYS_personality,
        "READ_IMPLIES_EXEC and ASLR switches",
    ),
    (
        "fanotify_init",
        libc::SYS_fanotify_init,
        "filesystem-wide monitors; their groups are one budget per host user, shared by every sandbox",
    ),
];

/// `open_tree_attr` (Linux 6.15), not yet in the libc crate; the same
/// number on every architecture that uses the generic syscall table.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Socket families a sandbox may open; everything else fails (AF_PACKET,
/// AF_VSOCK, AF_BLUETOOTH, AF_ALG, AF_KEY, AF_XDP, ...).
const ALLOWED_FAMILIES: [u64; 4] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

/// Syscalls the strict allowlist permits: what python3, node, sh and
/// coreutils need to compute, read and write files, and talk over pipes and
/// unix sockets.
pub(crate) const STRICT_ALLOWED: &[(&str, i64)] = &[
    ("read", libc::SYS_read),
    ("write", libc::SYS_write),
    ("readv", libc::SYS_readv),
    ("writev", libc::SYS_writev),
    ("pread64", libc::SYS_pread64),
    ("pwrite64", libc::SYS_pwrite64),
    ("preadv", libc::SYS_preadv),
    ("pwritev", libc::SYS_pwritev),
    ("open", libc::SYS_open),
    ("openat", libc::SYS_openat),
    ("close", libc::SYS_close),
    ("close_range", libc::SYS_close_range),
    ("creat", libc::SYS_creat),
    ("stat", libc::SYS_stat),
    ("fstat", libc::SYS_fstat),
    ("lstat", libc::SYS_lstat),
    ("newfstatat", libc::SYS_newfstatat),
    ("statx", libc::SYS_statx),
    ("statfs", libc::SYS_statfs),
    ("fstatfs", libc::SYS_fstatfs),
    ("lseek", libc::SYS_lseek),
    ("access", libc::SYS_access),
    ("faccessat", libc::SYS_faccessat),
    ("faccessat2", libc::SYS_faccessat2),
    ("poll", libc::SYS_poll),
    ("ppoll", libc::SYS_ppoll),
    ("select", libc::SYS_select),
    ("pselect6", libc::SYS_pselect6),
    ("epoll_create", libc::SYS_epoll_create),
    ("epoll_create1", libc::SYS_epoll_create1),
    ("epoll_ctl", libc::SYS_epoll_ctl),
    ("epoll_wait", libc::SYS_epoll_wait),
    ("epoll_pwait", libc::SYS_epoll_pwait),
    ("epoll_pwait2", libc::SYS_epoll_pwait2),
    ("eventfd2", libc::SYS_eventfd2),
    ("timerfd_create", libc::SYS_timerfd_create),
    ("timerfd_settime", libc::SYS_timerfd_settime),
    ("timerfd_gettime", libc::SYS_timerfd_gettime),
    ("signalfd4", libc::SYS_signalfd4),
    ("mmap", libc::SYS_mmap),
    ("mprotect", libc::SYS_mprotect),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("brk", libc::SYS_brk),
    ("madvise", libc::SYS_madvise),
    ("mincore", libc::SYS_mincore),
    ("msync", libc::SYS_msync),
    ("mlock", libc::SYS_mlock),
    ("munlock", libc::SYS_munlock),
    ("membarrier", libc::SYS_membarrier),
    ("rt_sigaction", libc::SYS_rt_sigaction),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("rt_sigsuspend", libc::SYS_rt_sigsuspend),
    ("rt_sigpending", libc::SYS_rt_sigpending),
    ("rt_sigtimedwait", libc::SYS_rt_sigtimedwait),
    ("sigaltstack", libc::SYS_sigaltstack),
    ("kill", libc::SYS_kill),
    ("tgkill", libc::SYS_tgkill),
    ("tkill", libc::SYS_tkill),
    ("pipe", libc::SYS_pipe),
    ("pipe2", libc::SYS_pipe2),
    ("dup", libc::SYS_dup),
    ("dup2", libc::SYS_dup2),
    ("dup3", libc::SYS_dup3),
    ("fcntl", libc::SYS_fcntl),
    ("flock", libc::SYS_flock),
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("truncate", libc::SYS_truncate),
    ("ftruncate", libc::SYS_ftruncate),
    ("fallocate", libc::SYS_fallocate),
    ("fadvise64", libc::SYS_fadvise64),
    ("getdents64", libc::SYS_getdents64),
    ("getcwd", libc::SYS_getcwd),
    ("chdir", libc::SYS_chdir),
    ("fchdir", libc::SYS_fchdir),
    ("rename", libc::SYS_rename),
    ("renameat", libc::SYS_renameat),
    ("renameat2", libc::SYS_renameat2),
    ("mkdir", libc::SYS_mkdir),
    ("mkdirat", libc::SYS_mkdirat),
    ("rmdir", libc::SYS_rmdir),
    ("link", libc::SYS_link),
    ("linkat", libc::SYS_linkat),
    ("unlink", libc::SYS_unlink),
    ("unlinkat", libc::SYS_unlinkat),
    ("symlink", libc::SYS_symlink),
    ("symlinkat", libc::SYS_symlinkat),
    ("readlink", libc::SYS_readlink),
    ("readlinkat", libc::SYS_readlinkat),
    ("chmod", libc::SYS_chmod),
    ("fchmod", libc::SYS_fchmod),
    ("fchmodat", libc::SYS_fchmodat),
    ("umask", libc::SYS_umask),
    ("utimensat", libc::SYS_utimensat),
    ("copy_file_range", libc::SYS_copy_file_range),
    ("sendfile", libc::SYS_sendfile),
    ("splice", libc::SYS_splice),
    ("memfd_create", libc::SYS_memfd_create),
    ("clone", libc::SYS_clone),
    ("fork", libc::SYS_fork),
    ("vfork", libc::SYS_vfork),
    ("execve", libc::SYS_execve),
    ("execveat", libc::SYS_execveat),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
    ("wait4", libc::SYS_wait4),
    ("waitid", libc::SYS_waitid),
    ("pidfd_open", libc::SYS_pidfd_open),
    ("getpid", libc::SYS_getpid),
    ("getppid", libc::SYS_getppid),
    ("gettid", libc::SYS_gettid),
    ("getuid", libc::SYS_getuid),
    ("geteuid", libc::SYS_geteuid),
    ("getgid", libc::SYS_getgid),
    ("getegid", libc::SYS_getegid),
    ("getgroups", libc::SYS_getgroups),
    ("getresuid", libc::SYS_getresuid),
    ("getresgid", libc::SYS_getresgid),
    ("getpgrp", libc::SYS_getpgrp),
    ("getpgid", libc::SYS_getpgid),
    ("setpgid", libc::SYS_setpgid),
    ("getsid", libc::SYS_getsid),
    ("setsid", libc::SYS_setsid),
    ("uname", libc::SYS_uname),
    ("sysinfo", libc::SYS_sysinfo),
    ("times", libc::SYS_times),
    ("getrusage", libc::SYS_getrusage),
    ("getrlimit", libc::SYS_getrlimit),
    ("setrlimit", libc::SYS_setrlimit),
    ("prlimit64", libc::SYS_prlimit64),
    ("getpriority", libc::SYS_getpriority),
    ("sched_yield", libc::SYS_sched_yield),
    ("sched_getaffinity", libc::SYS_sched_getaffinity),
    ("sched_getparam", libc::SYS_sched_getparam),
    ("sched_getscheduler", libc::SYS_sched_getscheduler),
    ("nanosleep", libc::SYS_nanosleep),
    ("clock_nanosleep", libc::SYS_clock_nanosleep),
    ("clock_gettime", libc::SYS_clock_gettime),
    ("clock_getres", libc::SYS_clock_getres),
    ("gettimeofday", libc::SYS_gettimeofday),
    ("time", libc::SYS_time),
    ("alarm", libc::SYS_alarm),
    ("getitimer", libc::SYS_getitimer),
    ("setitimer", libc::SYS_setitimer),
    ("pause", libc::SYS_pause),
    ("futex", libc::SYS_futex),
    ("set_tid_address", libc::SYS_set_tid_address),
    ("set_robust_list", libc::SYS_set_robust_list),
    ("get_robust_list", libc::SYS_get_robust_list),
    ("rseq", libc::SYS_rseq),
    ("arch_prctl", libc::SYS_arch_prctl),
    ("prctl", libc::SYS_prctl),
    ("getrandom", libc::SYS_getrandom),
    ("restart_syscall", libc::SYS_restart_syscall),
    ("capget", libc::SYS_capget),
    ("ioctl", libc::SYS_ioctl),
    ("socket", libc::SYS_socket),
    ("socketpair", libc::SYS_socketpair),
    ("connect", libc::SYS_connect),
    ("bind", libc::SYS_bind),
    ("listen", libc::SYS_listen),
    ("accept", libc::SYS_accept),
    ("accept4", libc::SYS_accept4),
    ("getsockname", libc::SYS_getsockname),
    ("getpeername", libc::SYS_getpeername),
    ("sendto", libc::SYS_sendto),
    ("recvfrom", libc::SYS_recvfrom),
    ("sendmsg", libc::SYS_sendmsg),
    ("recvmsg", libc::SYS_recvmsg),
    ("shutdown", libc::SYS_shutdown),
    ("setsockopt", libc::SYS_setsockopt),
    ("getsockopt", libc::SYS_getsockopt),
    ("clone3", libc::SYS_clone3),
];

fn cond(arg: u8, len: Len, op: Op, value: u64) -> Result<Cond, String> {
    Cond::new(arg, len, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())
}

/// Builds one program: seccompiler's architecture check, the x32 guard,
/// then a binary search on the syscall number, and seccompiler's chains
/// for the syscalls whose rules look at arguments.
///
/// seccompiler alone tests the syscall number against each entry in
/// turn, so a syscall of no entry walks the whole list (a few hundred
/// instructions). The kernel walks it too, for every syscall number, when
/// it attaches the filter and builds its action cache, and does so with
/// interrupts off: about 0.14 ms per program start for the default
/// deny-list. A search tree decides any number in about ten instructions.
/// What each number gets is unchanged: the tests run both layouts through
/// a BPF interpreter over every number and argument edge. `own` are
/// numbers the tree decides itself, whatever `rules` say of them.
fn compile_one(
    mut rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
    own: &[(i64, Leaf)],
    layout: Layout,
) -> Result<Vec<Bpf>, String> {
    let mut leaves = BTreeMap::new();
    let mut with_arguments = BTreeMap::new();
    for &(nr, leaf) in own {
        rules.remove(&nr);
        let number = u32::try_from(nr).map_err(|_| format!("syscall number {nr} out of range"))?;
        leaves.insert(number, leaf);
    }
    for (nr, chain) in rules {
        let number = u32::try_from(nr).map_err(|_| format!("syscall number {nr} out of range"))?;
        if chain.is_empty() {
            leaves.insert(number, Leaf::Matched);
        } else {
            leaves.insert(number, Leaf::Arguments);
            with_arguments.insert(nr, chain);
        }
    }
    let chains = seccompiler_program(with_arguments, mismatch.clone(), matched.clone())?;
    let (prologue, chains) = split_arch_check(&chains)?;
    let mut insns = prologue.to_vec();
    reject_x32(&mut insns);
    insns.push(load_nr());
    let ranges = number_ranges(&leaves);
    let exits = Exits {
        matched: u32::from(matched),
        mismatch: u32::from(mismatch),
    };
    // Jumps into the chains land on their first instruction, right after
    // the tree (seccompiler's own load of the number).
    let compact = match layout {
        Layout::Compact => compact_tree(&ranges, &exits),
        Layout::Spread => None,
    };
    let mut tree = match compact {
        Some(tree) => tree,
        None => {
            let (mut tree, to_chains) = search_tree(&ranges, &exits);
            for at in to_chains {
                tree[at].k = u32::try_from(tree.len() - at - 1).map_err(|e| e.to_string())?;
            }
            tree
        }
    };
    insns.append(&mut tree);
    if leaves.values().any(|l| *l == Leaf::Arguments) {
        insns.extend_from_slice(chains);
    }
    // BPF_MAXINSNS: the kernel refuses longer programs.
    if insns.len() > 4096 {
        return Err(format!(
            "{} instructions, over the kernel's 4096",
            insns.len()
        ));
    }
    Ok(insns)
}

/// seccompiler's program for `rules`, as is.
fn seccompiler_program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<Vec<Bpf>, String> {
    let filter =
        SeccompFilter::new(rules, mismatch, matched, arch()?).map_err(|e| e.to_string())?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    Ok(prog
        .iter()
        .map(|f| Bpf {
            code: f.code,
            jt: f.jt,
            jf: f.jf,
            k: f.k,
        })
        .collect())
}

/// The program seccompiler alone builds, x32 guard added: one test of the
/// syscall number after another. The tests hold the tree to it.
#[cfg(test)]
pub(crate) fn build_linear(program: Program) -> Result<Vec<Bpf>, String> {
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let (rules, mismatch, matched) = match program {
        Program::Main {
            strict: false,
            unix_sockets,
        } => (default_rules(unix_sockets)?, SeccompAction::Allow, eperm),
        Program::Main {
            strict: true,
            unix_sockets,
        } => (strict_rules(unix_sockets)?, eperm, SeccompAction::Allow),
        Program::Init => (
            INIT_ALLOWED.iter().map(|(_, nr)| (*nr, vec![])).collect(),
            eperm,
            SeccompAction::Allow,
        ),
        Program::Reduced => (reduced_rules()?, SeccompAction::Allow, eperm),
        Program::RestrictExec => (restrict_exec_rules()?, SeccompAction::Allow, eperm),
    };
    let mut insns = seccompiler_program(rules, mismatch, matched)?;
    reject_x32(&mut insns);
    Ok(insns)
}

/// seccompiler's program split after its architecture check (load the
/// architecture, compare, kill on a mismatch), which every program keeps.
fn split_arch_check(program: &[Bpf]) -> Result<(&[Bpf], &[Bpf]), String> {
    let shape = program.len() > 3
        && program[0].code == BPF_LD_W_ABS
        && program[0].k == 4 // seccomp_data.arch
        && program[1].code == BPF_JEQ_K
        && (program[1].jt, program[1].jf) == (1, 0)
        && program[2].code == BPF_RET_K
        && program[2].k == 0x8000_0000; // SECCOMP_RET_KILL_PROCESS
    if !shape {
        return Err("seccompiler's architecture check has an unexpected shape".into());
    }
    Ok(program.split_at(3))
}

/// What the search tree decides for a range of syscall numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    /// No rule: the filter's mismatch action.
    Mismatch,
    /// A rule on the number alone: the match action.
    Matched,
    /// Rules on the arguments: on to seccompiler's chains.
    Arguments,
    /// An action of its own.
    Return(u32),
    /// The match action when any bit of `mask` is set in the low word of
    /// argument `arg`, else the mismatch action.
    AnyFlag { arg: u8, mask: u32 },
}

/// The two actions a leaf can return.
struct Exits {
    matched: u32,
    mismatch: u32,
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JA: u16 = 0x05;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;

fn load_nr() -> Bpf {
    Bpf {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: 0, // seccomp_data.nr
    }
}

/// Every syscall number, 0 to `u32::MAX`, as ranges of equal decision:
/// each entry is where a range starts and what it gets, up to the next.
fn number_ranges(leaves: &BTreeMap<u32, Leaf>) -> Vec<(u32, Leaf)> {
    let mut ranges: Vec<(u32, Leaf)> = vec![(0, Leaf::Mismatch)];
    let mut push = |start: u32, leaf: Leaf| {
        let last = ranges.len() - 1;
        if ranges[last].0 == start {
            ranges[last].1 = leaf;
            if last > 0 && ranges[last - 1].1 == leaf {
                ranges.pop();
            }
        } else if ranges[last].1 != leaf {
            ranges.push((start, leaf));
        }
    };
    for (&nr, &leaf) in leaves {
        push(nr, leaf);
        if let Some(next) = nr.checked_add(1) {
            push(next, Leaf::Mismatch);
        }
    }
    ranges
}

/// Where a jump of [`compact_tree`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    /// An instruction of the tree.
    At(usize),
    /// The shared `ret` of this action, after the tree.
    Ret(u32),
    /// seccompiler's chains, after the returns.
    Chains,
}

/// An instruction of [`compact_tree`], its jumps not yet resolved.
enum Emitted {
    /// No jump.
    Plain(Bpf),
    /// A conditional jump: where it goes when true, and when false.
    Branch(Bpf, To, To),
    /// An unconditional jump.
    Jump(To),
}

/// The balanced search of [`search_tree`], but a comparison whose side is
/// decided jumps straight to a `ret` shared by every leaf of that action,
/// after the tree (or to the chains after those): the tree's instructions
/// are its comparisons, without one return more per range, and the kernel
/// converts and JIT-compiles each instruction at every program's start
/// (about 0.18 us each on the project's test VM). The same comparisons run
/// in the same order, so a number takes as many steps as before. `None`
/// when a jump would not fit its 8 bits (a tree over 250-odd ranges):
/// [`search_tree`] then lays it out.
fn compact_tree(ranges: &[(u32, Leaf)], exits: &Exits) -> Option<Vec<Bpf>> {
    let mut code = Vec::new();
    let root = emit(ranges, exits, &mut code);
    if root != To::At(0) {
        // One outcome for every number: nothing was emitted.
        code.push(Emitted::Jump(root));
    }
    let mut returns: Vec<u32> = Vec::new();
    for item in &code {
        let targets = match item {
            Emitted::Branch(_, t, f) => [*t, *f],
            Emitted::Jump(t) => [*t, *t],
            Emitted::Plain(_) => continue,
        };
        for target in targets {
            if let To::Ret(action) = target {
                if !returns.contains(&action) {
                    returns.push(action);
                }
            }
        }
    }
    let end = code.len();
    let index = |to: To| match to {
        To::At(at) => Some(at),
        To::Ret(action) => returns.iter().position(|r| *r == action).map(|i| end + i),
        To::Chains => Some(end + returns.len()),
    };
    let mut tree = Vec::with_capacity(end + returns.len());
    for (at, item) in code.into_iter().enumerate() {
        // Every target comes after its jump: the tree is emitted parent
        // first, the returns and the chains after it.
        let offset = |to: To| index(to)?.checked_sub(at + 1);
        tree.push(match item {
            Emitted::Plain(insn) => insn,
            Emitted::Branch(insn, t, f) => Bpf {
                jt: u8::try_from(offset(t)?).ok()?,
                jf: u8::try_from(offset(f)?).ok()?,
                ..insn
            },
            Emitted::Jump(t) => Bpf {
                code: BPF_JA,
                jt: 0,
                jf: 0,
                k: u32::try_from(offset(t)?).ok()?,
            },
        });
    }
    tree.extend(returns.into_iter().map(|k| Bpf {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k,
    }));
    Some(tree)
}

/// Emits the search over `ranges` into `code`, parent before children,
/// and says where a jump to it goes: its first instruction, or a leaf's
/// outcome, which needs no instruction of its own.
fn emit(ranges: &[(u32, Leaf)], exits: &Exits, code: &mut Vec<Emitted>) -> To {
    if let [(_, leaf)] = ranges {
        return match *leaf {
            Leaf::Mismatch => To::Ret(exits.mismatch),
            Leaf::Matched => To::Ret(exits.matched),
            Leaf::Return(action) => To::Ret(action),
            Leaf::Arguments => To::Chains,
            Leaf::AnyFlag { arg, mask } => {
                let at = code.len();
                code.push(Emitted::Plain(load_low_word(arg)));
                let test = Bpf {
                    code: BPF_JSET_K,
                    jt: 0,
                    jf: 0,
                    k: mask,
                };
                code.push(Emitted::Branch(
                    test,
                    To::Ret(exits.matched),
                    To::Ret(exits.mismatch),
                ));
                To::At(at)
            }
        };
    }
    let mid = ranges.len() / 2;
    let at = code.len();
    code.push(Emitted::Jump(To::Chains)); // the comparison, once both sides are known
    let below = emit(&ranges[..mid], exits, code);
    let above = emit(&ranges[mid..], exits, code);
    // if nr >= the upper half's first number: the upper half.
    let compare = Bpf {
        code: BPF_JGE_K,
        jt: 0,
        jf: 0,
        k: ranges[mid].0,
    };
    code[at] = Emitted::Branch(compare, above, below);
    To::At(at)
}

/// `A = ` the low word of `args[arg]` (`seccomp_data.args` starts at 16,
/// 8 bytes each).
fn load_low_word(arg: u8) -> Bpf {
    Bpf {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: 16 + 8 * u32::from(arg) + if cfg!(target_endian = "big") { 4 } else { 0 },
    }
}

/// A balanced binary search over `ranges` (the number already loaded):
/// its instructions, and where it jumps to the chains (`k` left to
/// patch). Classic BPF jumps only forward and a conditional jump at most
/// 255 instructions, so a longer left side is skipped with a `ja`.
fn search_tree(ranges: &[(u32, Leaf)], exits: &Exits) -> (Vec<Bpf>, Vec<usize>) {
    let ret = |k| Bpf {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k| Bpf {
        code: BPF_JA,
        jt: 0,
        jf: 0,
        k,
    };
    if let [(_, leaf)] = ranges {
        return match leaf {
            Leaf::Mismatch => (vec![ret(exits.mismatch)], vec![]),
            Leaf::Matched => (vec![ret(exits.matched)], vec![]),
            Leaf::Arguments => (vec![jump(0)], vec![0]),
            Leaf::Return(action) => (vec![ret(*action)], vec![]),
            Leaf::AnyFlag { arg, mask } => (
                vec![
                    load_low_word(*arg),
                    Bpf {
                        code: BPF_JSET_K,
                        jt: 0,
                        jf: 1,
                        k: *mask,
                    },
                    ret(exits.matched),
                    ret(exits.mismatch),
                ],
                vec![],
            ),
        };
    }
    let mid = ranges.len() / 2;
    let (left, left_jumps) = search_tree(&ranges[..mid], exits);
    let (right, right_jumps) = search_tree(&ranges[mid..], exits);
    // if nr >= the right side's first number: the right side.
    let mut insns = match u8::try_from(left.len()) {
        Ok(over_left) => vec![Bpf {
            code: BPF_JGE_K,
            jt: over_left,
            jf: 0,
            k: ranges[mid].0,
        }],
        Err(_) => vec![
            Bpf {
                code: BPF_JGE_K,
                jt: 0,
                jf: 1,
                k: ranges[mid].0,
            },
            // Longer than u32::MAX: refused below as over 4096 anyway.
            jump(u32::try_from(left.len()).unwrap_or(u32::MAX)),
        ],
    };
    let head = insns.len();
    let jumps = left_jumps
        .into_iter()
        .map(|at| at + head)
        .chain(right_jumps.into_iter().map(|at| at + head + left.len()))
        .collect();
    insns.extend(left);
    insns.extend(right);
    (insns, jumps)
}

/// After seccompiler's architecture check (3 instructions), kill any
/// syscall number with the x32 bit set (`__X32_SYSCALL_BIT`): x32 shares
/// AUDIT_ARCH_X86_64 but has its own table, so rules on x86_64 numbers
/// would not see it.
fn reject_x32(insns: &mut Vec<Bpf>) {
    if std::env::consts::ARCH != "x86_64" || insns.len() < 3 {
        return;
    }
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let check = [
        // A = seccomp_data.nr
        Bpf {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        },
        // if A >= X32 bit: next (kill) else skip it
        Bpf {
            code: 0x35,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        Bpf {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0x8000_0000,
        }, // SECCOMP_RET_KILL_PROCESS
    ];
    insns.splice(3..3, check);
}

/// The default deny-list as seccompiler rules.
fn default_rules(unix_sockets: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, nr, _)| (*nr, vec![])).collect();
    // clone with any namespace flag (arg 0 on x86_64 and aarch64).
    rules.insert(
        libc::SYS_clone,
        NS_FLAGS
            .iter()
            .chain(std::iter::once(&0x80u64))
            .map(|f| rule(vec![cond(0, Len::Qword, Op::MaskedEq(*f), *f)?]))
            .collect::<Result<_, _>>()?,
    );
    // TIOCSTI / TIOCLINUX, comparing the low 32 bits only, so a request
    // with high bits set cannot slip past (CVE-2019-10063 in flatpak).
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Len::Dword, Op::Eq, TIOCSTI)?])?,
            rule(vec![cond(1, Len::Dword, Op::Eq, TIOCLINUX)?])?,
        ],
    );
    // prlimit64 on another process: the same uid may otherwise change the
    // rlimits of init or of any process of the sandbox (prlimit(2) needs no
    // capability then). Its own (pid 0) stays: that is setrlimit(2).
    rules.insert(libc::SYS_prlimit64, vec![prlimit_other_process()?]);
    // Socket families outside the list; netlink only for route queries.
    let mut not_allowed = Vec::new();
    for fam in ALLOWED_FAMILIES {
        not_allowed.push(cond(0, Len::Dword, Op::Ne, fam)?);
    }
    let mut socket_rules = vec![
        rule(not_allowed)?,
        rule(vec![
            cond(0, Len::Dword, Op::Eq, libc::AF_NETLINK as u64)?,
            cond(2, Len::Dword, Op::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?,
    ];
    // AF_UNIX unless the profile allows it: a read-only bind does not stop
    // connect(2) to a socket file inside it (an agent's, a bus's).
    if !unix_sockets {
        socket_rules.push(rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::AF_UNIX as u64,
        )?])?);
    }
    rules.insert(libc::SYS_socket, socket_rules);
    Ok(rules)
}

/// `prlimit64` whose pid (arg 0) is not 0, the calling process.
fn prlimit_other_process() -> Result<SeccompRule, String> {
    rule(vec![cond(0, Len::Dword, Op::Ne, 0)?])
}

/// The strict allowlist as seccompiler rules (what matches is allowed).
fn strict_rules(unix_sockets: bool) -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        STRICT_ALLOWED.iter().map(|(_, nr)| (*nr, vec![])).collect();
    // prlimit64 on the calling process only (see `default_rules`).
    rules.insert(
        libc::SYS_prlimit64,
        vec![rule(vec![cond(0, Len::Dword, Op::Eq, 0)?])?],
    );
    rules.insert(
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            Len::Qword,
            Op::MaskedEq(u64::from(NS_MASK)),
            0,
        )?])?],
    );
    rules.insert(
        libc::SYS_ioctl,
        vec![rule(vec![
            cond(1, Len::Dword, Op::Ne, TIOCSTI)?,
            cond(1, Len::Dword, Op::Ne, TIOCLINUX)?,
        ])?],
    );
    if unix_sockets {
        rules.insert(
            libc::SYS_socket,
            vec![rule(vec![cond(
                0,
                Len::Dword,
                Op::Eq,
                libc::AF_UNIX as u64,
            )?])?],
        );
    } else {
        // No socket(2) at all; socketpair(2) stays in the allowlist.
        rules.remove(&libc::SYS_socket);
    }
    Ok(rules)
}

/// What init (PID 1) may still do once the program runs: wait for and
/// signal the processes of its namespace, take signals synchronously,
/// report to corral over the control socket, allocate, and exit.
pub const INIT_ALLOWED: &[(&str, i64)] = &[
    ("wait4", libc::SYS_wait4),
    ("waitid", libc::SYS_waitid),
    ("kill", libc::SYS_kill),
    ("rt_sigtimedwait", libc::SYS_rt_sigtimedwait),
    ("rt_sigprocmask", libc::SYS_rt_sigprocmask),
    ("rt_sigreturn", libc::SYS_rt_sigreturn),
    ("restart_syscall", libc::SYS_restart_syscall),
    ("write", libc::SYS_write),
    ("sendmsg", libc::SYS_sendmsg),
    ("close", libc::SYS_close),
    ("brk", libc::SYS_brk),
    ("mmap", libc::SYS_mmap),
    ("munmap", libc::SYS_munmap),
    ("mremap", libc::SYS_mremap),
    ("madvise", libc::SYS_madvise),
    ("getpid", libc::SYS_getpid),
    ("exit", libc::SYS_exit),
    ("exit_group", libc::SYS_exit_group),
];

/// SysV IPC, shared with the host when there is no IPC namespace.
const SYSV_IPC: &[(&str, i64)] = &[
    ("shmget", libc::SYS_shmget),
    ("shmat", libc::SYS_shmat),
    ("shmctl", libc::SYS_shmctl),
    ("shmdt", libc::SYS_shmdt),
    ("msgget", libc::SYS_msgget),
    ("msgsnd", libc::SYS_msgsnd),
    ("msgrcv", libc::SYS_msgrcv),
    ("msgctl", libc::SYS_msgctl),
    ("semget", libc::SYS_semget),
    ("semop", libc::SYS_semop),
    ("semtimedop", libc::SYS_semtimedop),
    ("semctl", libc::SYS_semctl),
];
