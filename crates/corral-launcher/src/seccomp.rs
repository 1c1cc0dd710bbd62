//! The syscall layer: seccomp filters compiled in the parent, installed by
//! the program's process as its very last step before `execve`.
//!
//! Rules are data: every entry names its syscall, what happens, and why.
//! `corral explain` prints them. The filters are built with `seccompiler`
//! (a pure-Rust BPF compiler); its prologue kills a process whose syscall
//! comes from another architecture (i386 via `int 0x80` on x86_64), and
//! corral adds a check that kills x32-ABI syscalls, which share the x86_64
//! architecture value but not its syscall table.
//!
//! One filter is installed (deny-list or allowlist, failing with EPERM),
//! which also answers `clone3` with ENOSYS, so libc falls back to `clone`,
//! whose flags a filter can inspect (clone3 passes them in memory, out of
//! seccomp's reach).

use corral_helper::{CompiledFilters, Insn};
use corral_policy::SeccompProfile;
use serde::Serialize;

mod rules;

#[cfg(test)]
use rules::build_linear;
pub use rules::INIT_ALLOWED;
use rules::{Program, DENIED, STRICT_ALLOWED};

// `PREBUILT`: every program of `Program::ALL`, built by build.rs from
// `rules.rs`, or none when the build could not (a cross build).
include!(concat!(env!("OUT_DIR"), "/seccomp_programs.rs"));

/// Why a filter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("building the seccomp filter: {0}")]
pub struct SeccompError(String);

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Fails with EPERM.
    Eperm,
    /// Fails with ENOSYS.
    Enosys,
    /// Allowed.
    Allow,
    /// Kills the process.
    Kill,
}

/// One reviewed rule.
#[derive(Debug, Clone, Serialize)]
pub struct RuleDoc {
    /// Syscall name.
    pub syscall: &'static str,
    /// When the rule applies, if not always.
    pub when: &'static str,
    /// What happens.
    pub action: RuleAction,
    /// Why.
    pub reason: &'static str,
}

/// `program` as installed: the prebuilt one, or built now when the
/// build could not prebuild it.
fn program(program: Program) -> Result<Vec<Insn>, SeccompError> {
    match PREBUILT.get(program.index()) {
        Some(prebuilt) => Ok(prebuilt
            .iter()
            .map(|&(code, jt, jf, k)| Insn { code, jt, jf, k })
            .collect()),
        None => build(program),
    }
}

/// `program` built now with seccompiler.
fn build(program: Program) -> Result<Vec<Insn>, SeccompError> {
    let insns = rules::build(program).map_err(SeccompError)?;
    Ok(insns
        .into_iter()
        .map(|b| Insn {
            code: b.code,
            jt: b.jt,
            jf: b.jf,
            k: b.k,
        })
        .collect())
}

/// Compiles the filters for `profile`.
/// `unix_sockets` lets the program create `AF_UNIX` sockets; refused
/// otherwise (`socketpair(2)` stays allowed in both profiles).
pub fn compile(
    profile: SeccompProfile,
    unix_sockets: bool,
) -> Result<CompiledFilters, SeccompError> {
    let main = program(Program::Main {
        strict: match profile {
            SeccompProfile::Default => false,
            SeccompProfile::Strict => true,
        },
        unix_sockets,
    })?;
    Ok(CompiledFilters {
        programs: vec![main],
    })
}

/// The filter init installs as its last step (see [`INIT_ALLOWED`]):
/// anything else fails with EPERM. It depends on nothing of the run, and
/// every plan carries it (start-up latency is a target): prebuilt.
pub fn compile_init() -> Result<CompiledFilters, SeccompError> {
    Ok(CompiledFilters {
        programs: vec![program(Program::Init)?],
    })
}

/// Adds `commands.restrict_exec`'s filter (no memfd) to
/// `filters` when `restrict_exec` is set; before the main filter, which
/// must stay last (see [`compile_reduced`]).
pub fn restrict_exec(
    mut filters: CompiledFilters,
    restrict_exec: bool,
) -> Result<CompiledFilters, SeccompError> {
    if restrict_exec {
        filters.programs.insert(0, program(Program::RestrictExec)?);
    }
    Ok(filters)
}

/// Filters for reduced mode (no namespaces): the profile's filter plus one
/// refusing socket(2) altogether (there is no network namespace to contain
/// any family), SysV IPC (no IPC namespace), and scheduling calls aimed at
/// another process (no pid namespace: the same uid reaches other
/// sandboxes, or the user's own processes).
pub fn compile_reduced(
    profile: SeccompProfile,
    unix_sockets: bool,
) -> Result<CompiledFilters, SeccompError> {
    let mut filters = compile(profile, unix_sockets)?;
    // Before the main filter, which must stay last: under the strict
    // allowlist even seccomp(2) itself is refused, so no filter could
    // follow it.
    filters.programs.insert(0, program(Program::Reduced)?);
    Ok(filters)
}

/// The reviewed rules of `profile`, for `corral explain`; `unix_sockets`
/// as the profile's `security.unix_sockets`.
pub fn describe(profile: SeccompProfile, unix_sockets: bool) -> Vec<RuleDoc> {
    let mut docs = Vec::new();
    match profile {
        SeccompProfile::Default => {
            docs.extend(DENIED.iter().map(|(name, _, why)| RuleDoc {
                syscall: name,
                when: "always",
                action: RuleAction::Eperm,
                reason: why,
            }));
            docs.push(RuleDoc {
                syscall: "clone",
                when: "any CLONE_NEW* flag",
                action: RuleAction::Eperm,
                reason: "new namespaces",
            });
            docs.push(RuleDoc {
                syscall: "prlimit64",
                when: "pid other than 0 (another process)",
                action: RuleAction::Eperm,
                reason: "change the rlimits of init or another process of the same uid",
            });
            docs.push(RuleDoc {
                syscall: "ioctl",
                when: "TIOCSTI or TIOCLINUX (low 32 bits)",
                action: RuleAction::Eperm,
                reason: "inject keystrokes into a terminal (CVE-2017-5226)",
            });
            docs.push(RuleDoc {
                syscall: "socket",
                when: "family not unix/inet/inet6/netlink, or netlink other than route",
                action: RuleAction::Eperm,
                reason: "packet sockets, vsock (host bridge), bluetooth, AF_ALG and other attack surface",
            });
            if !unix_sockets {
                docs.push(RuleDoc {
                    syscall: "socket",
                    when: "AF_UNIX (security.unix_sockets = false)",
                    action: RuleAction::Eperm,
                    reason: "connect to a host socket file inside a bind (agents, buses); socketpair stays",
                });
            }
        }
        SeccompProfile::Strict => {
            docs.extend(
                STRICT_ALLOWED
                    .iter()
                    .filter(|(n, _)| {
                        !matches!(*n, "clone" | "ioctl" | "socket" | "clone3" | "prlimit64")
                    })
                    .map(|(name, _)| RuleDoc {
                        syscall: name,
                        when: "always",
                        action: RuleAction::Allow,
                        reason: "needed by ordinary programs",
                    }),
            );
            docs.push(RuleDoc {
                syscall: "clone",
                when: "no CLONE_NEW* flag",
                action: RuleAction::Allow,
                reason: "threads and processes, no namespaces",
            });
            docs.push(RuleDoc {
                syscall: "ioctl",
                when: "not TIOCSTI/TIOCLINUX",
                action: RuleAction::Allow,
                reason: "terminals and files",
            });
            docs.push(RuleDoc {
                syscall: "prlimit64",
                when: "pid 0 (the calling process) only",
                action: RuleAction::Allow,
                reason: "its own rlimits, never init's or another process's",
            });
            if unix_sockets {
                docs.push(RuleDoc {
                    syscall: "socket",
                    when: "AF_UNIX only (security.unix_sockets = true)",
                    action: RuleAction::Allow,
                    reason: "local IPC",
                });
            }
            docs.push(RuleDoc {
                syscall: "(everything else)",
                when: "always",
                action: RuleAction::Eperm,
                reason: "not needed by snippets",
            });
        }
    }
    docs.push(RuleDoc {
        syscall: "clone3",
        when: "always",
        action: RuleAction::Enosys,
        reason: "its flags are out of seccomp's reach; libc falls back to clone",
    });
    docs.push(RuleDoc {
        syscall: "(x32 or i386 ABI)",
        when: "always",
        action: RuleAction::Kill,
        reason: "another architecture's syscall table",
    });
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_profiles_compile_with_the_x32_guard() {
        for p in [SeccompProfile::Default, SeccompProfile::Strict] {
            let f = compile(p, false).unwrap();
            assert_eq!(f.programs.len(), 1, "one filter, clone3's answer in it");
            for prog in &f.programs {
                assert_eq!(
                    prog[4].k, 0x4000_0000,
                    "x32 check right after the arch check"
                );
                assert_eq!(prog[5].k, 0x8000_0000, "kill process");
            }
            assert_eq!(f.to_bpf()[0].len(), f.programs[0].len());
        }
    }

    /// `struct seccomp_data` as the kernel lays it out for a filter.
    struct SeccompData {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    impl SeccompData {
        /// The 32-bit word at `offset`, as `BPF_LD | BPF_W | BPF_ABS` reads it.
        fn word(&self, offset: u32) -> u32 {
            match offset {
                0 => self.nr,
                4 => self.arch,
                8 | 12 => 0, // instruction_pointer
                16..=63 if offset.is_multiple_of(4) => {
                    let arg = self.args[(offset as usize - 16) / 8];
                    let half = if offset.is_multiple_of(8) {
                        arg
                    } else {
                        arg >> 32
                    };
                    (half & 0xffff_ffff) as u32
                }
                _ => panic!("load outside seccomp_data at {offset}"),
            }
        }
    }

    /// Runs a classic BPF program over `data` the way the kernel's
    /// seccomp does, for the instructions corral's programs use; panics
    /// on any other, on a jump out of the program and on a fall off its end.
    fn run(program: &[rules::Bpf], data: &SeccompData) -> u32 {
        run_counting(program, data).0
    }

    /// How many instructions `program` runs to decide `data`, unless it
    /// looks at an argument first (the kernel's action cache stops there).
    fn steps(program: &[rules::Bpf], data: &SeccompData) -> usize {
        run_counting(program, data).1
    }

    /// Whether `program` loads an argument of `data` on its way.
    fn reads_arguments(program: &[rules::Bpf], data: &SeccompData) -> bool {
        run_counting(program, data).2
    }

    /// The decision, the instructions run up to the first load of an
    /// argument (or to the end), and whether an argument was loaded.
    fn run_counting(program: &[rules::Bpf], data: &SeccompData) -> (u32, usize, bool) {
        let (mut a, mut pc, mut n, mut arguments) = (0u32, 0usize, 0usize, false);
        loop {
            if !arguments {
                n += 1;
            }
            let i = program.get(pc).expect("jumped or fell out of the program");
            pc += 1;
            let branch = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
            match i.code {
                0x20 => {
                    arguments |= i.k >= 16;
                    a = data.word(i.k)
                }
                0x54 => a &= i.k,
                0x05 => pc += i.k as usize,
                0x15 => pc += branch(a == i.k),
                0x25 => pc += branch(a > i.k),
                0x35 => pc += branch(a >= i.k),
                0x45 => pc += branch(a & i.k != 0),
                0x06 => return (i.k, n, arguments),
                code => panic!("instruction {code:#x} not modelled"),
            }
        }
    }

    /// The values worth trying for each of the six arguments of
    /// `program`: every constant compared with that argument after it is
    /// loaded, its neighbours, 0 and the extremes, each in either half of
    /// the 64-bit argument and with the other half 0 or all ones.
    fn argument_edges(program: &[rules::Bpf]) -> [Vec<u64>; 6] {
        let mut words: [Vec<u32>; 6] = Default::default();
        let mut loaded = None;
        for i in program {
            match i.code {
                0x20 => loaded = (i.k >= 16).then(|| (i.k as usize - 16) / 8),
                0x15 | 0x25 | 0x35 | 0x45 | 0x54 => {
                    if let Some(arg) = loaded {
                        words[arg].extend([i.k, i.k.wrapping_add(1), i.k.wrapping_sub(1)]);
                    }
                }
                _ => {}
            }
        }
        words.map(|mut w| {
            w.extend([0, 1, u32::MAX]);
            let mut values: Vec<u64> = w
                .iter()
                .flat_map(|&w| {
                    let w = u64::from(w);
                    [
                        w,
                        w | 0xffff_ffff_0000_0000,
                        w << 32,
                        (w << 32) | 0xffff_ffff,
                    ]
                })
                .collect();
            values.sort_unstable();
            values.dedup();
            values
        })
    }

    #[test]
    fn clone_is_decided_by_one_test_of_its_flags() {
        const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
        const ALLOW: u32 = 0x7fff_0000;
        let native = build_linear(Program::Init).unwrap()[1].k;
        let namespaces: [u64; 8] = [
            0x0002_0000, // CLONE_NEWNS
            0x1000_0000, // CLONE_NEWUSER
            0x2000_0000, // CLONE_NEWPID
            0x4000_0000, // CLONE_NEWNET
            0x0800_0000, // CLONE_NEWIPC
            0x0400_0000, // CLONE_NEWUTS
            0x0200_0000, // CLONE_NEWCGROUP
            0x80,        // CLONE_NEWTIME
        ];
        // What glibc's pthread_create (CLONE_VM | FS | FILES | SIGHAND |
        // THREAD | SYSVSEM | SETTLS | PARENT_SETTID | CHILD_CLEARTID) and
        // fork (CLONE_CHILD_SETTID | CHILD_CLEARTID | SIGCHLD) pass.
        let thread: u64 = 0x003d_0f00;
        let fork: u64 = 0x0120_0011;
        for unix_sockets in [false, true] {
            let p = Program::Main {
                strict: false,
                unix_sockets,
            };
            let tree = rules::build(p).unwrap();
            let linear = build_linear(p).unwrap();
            // One JSET where seccompiler tests each flag in both words.
            assert_eq!(tree.iter().filter(|i| i.code == 0x45).count(), 1);
            assert!(
                tree.len() + 60 < linear.len(),
                "{} instructions against seccompiler's {}",
                tree.len(),
                linear.len()
            );
            let decide = |flags: u64| {
                let mut data = SeccompData {
                    nr: u32::try_from(libc::SYS_clone).unwrap(),
                    arch: native,
                    args: [0; 6],
                };
                data.args[0] = flags;
                run(&tree, &data)
            };
            for flag in namespaces {
                assert_eq!(decide(flag), EPERM, "{flag:#x}");
                assert_eq!(decide(flag | fork), EPERM, "{flag:#x} with fork's");
                assert_eq!(decide(flag | 0xffff_ffff_0000_0000), EPERM, "{flag:#x}");
            }
            assert_eq!(decide(thread), ALLOW);
            assert_eq!(decide(fork), ALLOW);
            // The kernel reads the low word only (kernel/fork.c).
            assert_eq!(decide(0xffff_ffff_0000_0000 | fork), ALLOW);
        }
    }

    #[test]
    fn the_search_tree_decides_every_syscall_as_the_linear_program_does() {
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        let native = build_linear(Program::Init).unwrap()[1].k;
        // clone3's answer was a filter of its own, installed before the
        // main one, which had to allow clone3 for ENOSYS to be what a
        // program sees (on equal actions the last filter's data wins).
        // The main programs now answer ENOSYS themselves: the same
        // decision as long as no main rule names clone3.
        let clone3 = rules::CLONE3_ENOSYS.0;
        assert!(STRICT_ALLOWED.iter().any(|(_, nr)| *nr == clone3));
        assert!(!DENIED.iter().any(|(_, nr, _)| *nr == clone3));
        let layouts = Program::ALL.iter().flat_map(|&p| {
            let (compact, spread) = (rules::build(p).unwrap(), rules::build_spread(p).unwrap());
            // The compact layout is the one installed: it must not have
            // fallen back to the spread one.
            assert!(
                compact.len() < spread.len(),
                "{p:?}: {} instructions compact, {} spread",
                compact.len(),
                spread.len()
            );
            [(p, compact), (p, spread)]
        });
        for (p, tree) in layouts {
            let linear = build_linear(p).unwrap();
            assert!(tree.len() <= 4096, "{p:?}: within BPF_MAXINSNS");
            let mut numbers: Vec<u32> = (0..1024).collect();
            numbers.extend(
                linear
                    .iter()
                    .flat_map(|i| [i.k, i.k.wrapping_add(1), i.k.wrapping_sub(1)]),
            );
            numbers.push(u32::MAX);
            numbers.sort_unstable();
            numbers.dedup();
            numbers.extend((0..1024).map(|nr| nr | 0x4000_0000)); // x32
            let values = argument_edges(&linear);
            let mut argument_rules = 0;
            for &nr in &numbers {
                for arch in [native, AUDIT_ARCH_I386] {
                    let mut data = SeccompData {
                        nr,
                        arch,
                        args: [0; 6],
                    };
                    let mut first = run(&linear, &data);
                    // What the main programs answer on their own (the
                    // linear program has one action for every match).
                    let clone3 = i64::from(nr) == rules::CLONE3_ENOSYS.0 && arch == native;
                    if clone3 && matches!(p, Program::Main { .. }) {
                        first = rules::CLONE3_ENOSYS.1;
                    }
                    assert_eq!(run(&tree, &data), first, "{p:?}: nr {nr:#x} arch {arch:#x}");
                    // A number whose rules look at its arguments: the edges
                    // of every pair of the first three (no rule combines
                    // more than two).
                    if arch != native || !reads_arguments(&linear, &data) {
                        continue;
                    }
                    argument_rules += 1;
                    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                        for &x in &values[i] {
                            for &y in &values[j] {
                                data.args = [0; 6];
                                (data.args[i], data.args[j]) = (x, y);
                                assert_eq!(
                                    run(&tree, &data),
                                    run(&linear, &data),
                                    "{p:?}: nr {nr} args {:x?}",
                                    data.args
                                );
                            }
                        }
                    }
                }
            }
            if matches!(p, Program::Main { .. }) {
                assert!(
                    argument_rules >= 3,
                    "{p:?}: clone, ioctl, prlimit64 look at arguments"
                );
            }
            // The point of the tree: a number of no argument rule is
            // decided in a few steps (the linear program walked up to
            // several hundred).
            let longest = (0..512)
                .map(|nr| SeccompData {
                    nr,
                    arch: native,
                    args: [0; 6],
                })
                .filter(|data| !reads_arguments(&linear, data))
                .map(|data| (steps(&tree, &data), steps(&linear, &data)))
                .fold((0, 0), |(t, l), (a, b)| (t.max(a), l.max(b)));
            assert!(longest.0 <= 16, "{p:?}: the tree takes {longest:?} steps");
            if matches!(p, Program::Main { .. }) {
                assert!(
                    longest.1 > 100,
                    "{p:?}: the linear program took {}",
                    longest.1
                );
            }
        }
    }

    #[test]
    fn reduced_mode_refuses_scheduling_another_process_but_not_itself() {
        let reduced = rules::build(Program::Reduced).unwrap();
        let native = reduced[1].k;
        let decide = |nr: i64, args: [u64; 3]| {
            let data = SeccompData {
                nr: u32::try_from(nr).unwrap(),
                arch: native,
                args: [args[0], args[1], args[2], 0, 0, 0],
            };
            run(&reduced, &data)
        };
        const ALLOW: u32 = 0x7fff_0000;
        const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
        // (pid 0: the caller) and another process's pid, first argument.
        for nr in [
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_setparam,
            libc::SYS_sched_setattr,
        ] {
            assert_eq!(decide(nr, [0, 8, 0]), ALLOW, "{nr} on itself");
            assert_eq!(decide(nr, [1, 8, 0]), EPERM, "{nr} on init");
            assert_eq!(decide(nr, [4242, 8, 0]), EPERM, "{nr} on another");
        }
        // (which, who, value): PRIO_PROCESS 0, PRIO_PGRP 1, PRIO_USER 2;
        // IOPRIO_WHO_PROCESS 1, _PGRP 2, _USER 3.
        for (nr, user) in [(libc::SYS_setpriority, 2), (libc::SYS_ioprio_set, 3)] {
            assert_eq!(decide(nr, [user - 2, 0, 5]), ALLOW, "{nr}: itself");
            assert_eq!(decide(nr, [user - 1, 0, 5]), ALLOW, "{nr}: its group");
            assert_eq!(decide(nr, [user - 2, 1, 5]), EPERM, "{nr}: init");
            assert_eq!(decide(nr, [user - 1, 7, 5]), EPERM, "{nr}: a group");
            assert_eq!(decide(nr, [user, 0, 5]), EPERM, "{nr}: its whole uid");
            assert_eq!(decide(nr, [user, 65534, 5]), EPERM, "{nr}: a uid");
        }
        assert_eq!(decide(libc::SYS_getpriority, [0, 1, 0]), ALLOW);
    }

    #[test]
    fn restrict_exec_refuses_every_memfd() {
        let program = rules::build(Program::RestrictExec).unwrap();
        let native = program[1].k;
        let decide = |nr: i64, flags: u64| {
            let data = SeccompData {
                nr: u32::try_from(nr).unwrap(),
                arch: native,
                args: [0x1000, flags, 0, 0, 0, 0],
            };
            run(&program, &data)
        };
        const ALLOW: u32 = 0x7fff_0000;
        const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
        // MFD_CLOEXEC 1, MFD_ALLOW_SEALING 2, MFD_NOEXEC_SEAL 8, MFD_EXEC
        // 0x10: a sealed one can still be mapped as code by the loader.
        for flags in [0, 1, 2, 8, 9, 0x10, 0xffff_ffff] {
            assert_eq!(
                decide(libc::SYS_memfd_create, flags),
                EPERM,
                "flags {flags:#x}"
            );
        }
        assert_eq!(decide(libc::SYS_memfd_secret, 0), EPERM);
        assert_eq!(decide(libc::SYS_mmap, 0), ALLOW);
        let mut filters = compile(SeccompProfile::Default, false).unwrap();
        let main = filters.programs.clone();
        filters = super::restrict_exec(filters, false).unwrap();
        assert_eq!(
            filters.programs, main,
            "nothing added without restrict_exec"
        );
        filters = super::restrict_exec(filters, true).unwrap();
        assert_eq!(filters.programs.len(), 2);
        assert_eq!(
            filters.programs.last(),
            main.last(),
            "the main filter stays last"
        );
    }

    #[test]
    fn the_prebuilt_programs_are_what_seccompiler_builds_now() {
        assert_eq!(
            PREBUILT.len(),
            Program::ALL.len(),
            "a native build prebuilds every program"
        );
        for (i, p) in Program::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i, "{p:?} sits at its index");
            let built = build(p).unwrap();
            assert!(built.len() > 6, "{p:?}: arch check, x32 guard and rules");
            assert_eq!(program(p).unwrap(), built, "{p:?}");
        }
        // The filters of each kind of run are made of them, in order.
        let main = |strict, unix_sockets| {
            build(Program::Main {
                strict,
                unix_sockets,
            })
            .unwrap()
        };
        for (profile, strict) in [
            (SeccompProfile::Default, false),
            (SeccompProfile::Strict, true),
        ] {
            for unix in [false, true] {
                let f = compile(profile, unix).unwrap();
                assert_eq!(f.programs, [main(strict, unix)]);
                let r = compile_reduced(profile, unix).unwrap();
                let reduced = build(Program::Reduced).unwrap();
                assert_eq!(r.programs, [reduced, main(strict, unix)]);
            }
        }
        assert_eq!(
            compile_init().unwrap().programs,
            [build(Program::Init).unwrap()]
        );
        // The four main programs differ from each other.
        let mains: Vec<_> = Program::ALL[..4]
            .iter()
            .map(|p| build(*p).unwrap())
            .collect();
        for (i, a) in mains.iter().enumerate() {
            assert!(
                mains[i + 1..].iter().all(|b| a != b),
                "main program {i} is unique"
            );
        }
    }

    #[test]
    fn every_denied_rule_carries_a_reason_and_names_are_unique() {
        let mut names: Vec<&str> = DENIED.iter().map(|(n, _, _)| *n).collect();
        assert!(DENIED.iter().all(|(_, _, why)| !why.is_empty()));
        let before = names.len();
        names.sort();
        names.dedup();
        assert_eq!(before, names.len());
        for needed in [
            "ptrace",
            "mount",
            "unshare",
            "setns",
            "keyctl",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "open_by_handle_at",
            "pivot_root",
            "move_mount",
            "open_tree_attr",
            "quotactl_fd",
        ] {
            assert!(names.contains(&needed), "{needed} must be denied");
        }
        // The strict list never allows what the default list denies.
        for (name, nr, _) in DENIED {
            assert!(
                !STRICT_ALLOWED.iter().any(|(_, n)| n == nr),
                "strict allows {name}"
            );
        }
        assert!(describe(SeccompProfile::Default, false)
            .iter()
            .any(|d| d.syscall == "clone3" && d.action == RuleAction::Enosys));
    }
}
