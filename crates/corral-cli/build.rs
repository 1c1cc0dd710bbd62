//! Links the unwinder statically (`libgcc_eh.a`) where the toolchain has
//! it, so `corral` does not load `libgcc_s.so` at every start.
//!
//! Rust's standard library asks for `-lgcc_s` on linux-gnu targets. Each
//! start of a dynamically linked `corral` then maps `libgcc_s.so` and runs
//! its constructor, `__cpu_indicator_init`, whose CPUID instructions trap
//! to the hypervisor in a virtual machine: about 0.1 ms of CPU per
//! `corral run` on the project's test VM (docs/PERFORMANCE.md, issue 17),
//! for nothing corral uses. A library the binary's own crate links comes
//! before the standard library's on the link line, so a static `gcc_eh`
//! here provides the unwinder (`_Unwind_*`, used for backtraces and, in
//! debug builds, `catch_unwind`) and the linker's `--as-needed` then
//! leaves `libgcc_s` out; the static archive brings no CPU-detection
//! constructor of its own.
//!
//! Only for a native, dynamically linked linux-gnu build whose C compiler
//! finds `libgcc_eh.a` (`cc -print-file-name=libgcc_eh.a` answers an
//! absolute path). The project's own build is static (`.cargo/config.toml`)
//! and has no `libgcc_s` anyway; this covers builds that override its
//! flags (`RUSTFLAGS` replaces them). Anywhere else nothing changes and the
//! standard library's `-lgcc_s` stays.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let target = env::var("TARGET").unwrap_or_default();
    let static_crt = env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|features| features.split(',').any(|f| f == "crt-static"));
    if env::var("HOST").ok().as_deref() != Some(target.as_str())
        || !target.ends_with("-linux-gnu")
        || static_crt
    {
        return;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let answer = String::from_utf8_lossy(&out.stdout);
    let path = Path::new(answer.trim());
    if out.status.success() && path.is_absolute() && path.is_file() {
        println!("cargo:rustc-link-lib=static:-bundle=gcc_eh");
    }
}
