//! Compiled seccomp filters as the plan carries them. The launcher builds
//! them from corral's reviewed rules (with `seccompiler`); the program's
//! process installs them as its very last step before `execve`.

use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

/// One BPF instruction, serialisable so the plan can carry compiled filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Insn {
    /// Operation (`BPF_LD | BPF_W | BPF_ABS` ...).
    pub code: u16,
    /// Jump offset when the test is true.
    pub jt: u8,
    /// Jump offset when the test is false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

/// Compiled filters, installed in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompiledFilters {
    /// Each program.
    pub programs: Vec<Vec<Insn>>,
}

impl CompiledFilters {
    /// The programs as seccompiler wants them (done before the fork of the
    /// program's process, so installing allocates nothing).
    pub fn to_bpf(&self) -> Vec<BpfProgram> {
        self.programs
            .iter()
            .map(|p| {
                p.iter()
                    .map(|i| seccompiler::sock_filter {
                        code: i.code,
                        jt: i.jt,
                        jf: i.jf,
                        k: i.k,
                    })
                    .collect()
            })
            .collect()
    }
}
