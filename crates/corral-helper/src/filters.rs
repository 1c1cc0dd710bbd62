//! Compiled seccomp filters as the plan carries them. The launcher builds
//! them from corral's reviewed rules (with `seccompiler`); the program's
//! process installs them as its very last step before `execve`.

use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

/// One BPF instruction, serialisable so the plan can carry compiled
/// filters: as `[code, jt, jf, k]`, a third of the JSON an object with
/// named fields takes (the `code` profile's programs are ~300
/// instructions, in every plan a service sends its fork server; issue 17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u16, u8, u8, u32)", into = "(u16, u8, u8, u32)")]
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

impl From<(u16, u8, u8, u32)> for Insn {
    fn from((code, jt, jf, k): (u16, u8, u8, u32)) -> Insn {
        Insn { code, jt, jf, k }
    }
}

impl From<Insn> for (u16, u8, u8, u32) {
    fn from(i: Insn) -> (u16, u8, u8, u32) {
        (i.code, i.jt, i.jf, i.k)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_travels_as_four_numbers_and_comes_back_whole() {
        let i = Insn {
            code: 0x15,
            jt: 1,
            jf: 0,
            k: 0xc000_003e,
        };
        let json = serde_json::to_string(&i).unwrap();
        assert_eq!(json, "[21,1,0,3221225534]");
        assert_eq!(serde_json::from_str::<Insn>(&json).unwrap(), i);
        // Out of range, or not four numbers: refused.
        assert!(serde_json::from_str::<Insn>("[21,256,0,1]").is_err());
        assert!(serde_json::from_str::<Insn>("[21,1,0]").is_err());
    }
}
