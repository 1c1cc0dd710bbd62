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
//! Two filters are installed: the main one (deny-list or allowlist,
//! failing with EPERM) and one that answers `clone3` with ENOSYS, so libc
//! falls back to `clone`, whose flags a filter can inspect (clone3 passes
//! them in memory, out of seccomp's reach).

use corral_helper::{CompiledFilters, Insn};
use corral_policy::SeccompProfile;
use serde::Serialize;

mod rules;

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
    let clone3 = program(Program::Clone3)?;
    // The main filter goes in last: under the strict allowlist even
    // seccomp(2) itself is refused, so no filter could follow it.
    Ok(CompiledFilters {
        programs: vec![clone3, main],
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

/// Filters for reduced mode (no namespaces): the profile's filter plus one
/// refusing socket(2) altogether (there is no network namespace to contain
/// any family) and SysV IPC (no IPC namespace).
pub fn compile_reduced(
    profile: SeccompProfile,
    unix_sockets: bool,
) -> Result<CompiledFilters, SeccompError> {
    let mut filters = compile(profile, unix_sockets)?;
    // Before the main filter, which must stay last (see `compile`).
    let at = filters.programs.len() - 1;
    filters.programs.insert(at, program(Program::Reduced)?);
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
            assert_eq!(f.programs.len(), 2);
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
        let clone3 = build(Program::Clone3).unwrap();
        for (profile, strict) in [
            (SeccompProfile::Default, false),
            (SeccompProfile::Strict, true),
        ] {
            for unix in [false, true] {
                let f = compile(profile, unix).unwrap();
                assert_eq!(f.programs, [clone3.clone(), main(strict, unix)]);
                let r = compile_reduced(profile, unix).unwrap();
                let reduced = build(Program::Reduced).unwrap();
                assert_eq!(r.programs, [clone3.clone(), reduced, main(strict, unix)]);
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
