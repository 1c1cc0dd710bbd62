//! The public attack suite: hostile programs (python3, sh, and small C
//! programs compiled at test time) run through `corral run`, each asserting
//! that the attack failed and why: the errno, the exit status or signal, or
//! the exact observable. docs/SECURITY.md maps every threat to the layers
//! that stop it and to the tests here.
//!
//! Where the kernel would refuse an attack by itself too (the sandbox has
//! no capabilities), the arguments are chosen so that without the layer
//! under test the answer would differ: success, or another errno (EFAULT,
//! EINVAL, EBADF, ENOTTY, ENOSYS). The comment on each call gives that
//! baseline, as measured on an unconfined process of the same user.
//!
//! Raw syscalls use x86_64 numbers; those tests skip, loudly, elsewhere.
//! Related attacks proven in the other files are referenced, not repeated:
//! fork and memory bombs, output floods, daemons and timeouts (limits.rs,
//! lifecycle.rs), `kill -1`, fd 9 and the pid-1 argv wipe (isolation.rs),
//! planted symlinks under a bind destination (filesystem.rs).
//!
//! One module per attack class:
//! - `secrets`: corral's environment, /proc of init and of host pids,
//!   inherited descriptors;
//! - `filesystem`: host files, writes outside the workspace, link and
//!   rename races, device nodes, /sys and /proc/sys, denied paths,
//!   read-only binds;
//! - `namespaces`: hostname and SysV IPC isolation; new namespaces,
//!   setns, mounts and pivot_root refused;
//! - `processes`: signals, ptrace, other processes' memory;
//! - `network`: host sockets, routes, socket families, Landlock TCP ports;
//! - `syscalls`: the rest of the seccomp deny-list, other syscall ABIs;
//! - `privileges`: capabilities, set-ID binaries, no_new_privs, chroot;
//! - `resources`: hard rlimits, thread bombs;
//! - `terminal`: input injection into, and escapes echoed to, the terminal;
//! - `injection`: hostile strings in policies, argv, env and file names;
//! - `protect`: git hooks and config, shell rc files, editor and agent
//!   configuration in writable binds;
//! - `peers_srt`: the checks of sandbox-runtime's Linux suite that apply
//!   to corral (symlinked and renamed deny paths, unix datagrams, the
//!   proxy's tunnel, Host header, SOCKS5 and wildcard decisions).
//!
//! `support` holds the helpers they share; `common` those of every test
//! binary.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod filesystem;
mod injection;
mod namespaces;
mod network;
mod peers_srt;
mod privileges;
mod processes;
mod protect;
mod resources;
mod secrets;
mod syscalls;
mod terminal;
