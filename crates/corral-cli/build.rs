//! Links the `corral` binary with packed relative relocations (DT_RELR,
//! `-z pack-relative-relocs`) when the build host can run such a binary.
//!
//! Why: corral is a position-independent executable with about 19,000
//! `R_X86_64_RELATIVE` relocations, which the dynamic loader applies one
//! by one on every start (about a quarter of the instructions `corral
//! run` executes before it forks). DT_RELR stores them as a bitmap that
//! the loader applies in a fraction of the work, without giving up ASLR.
//!
//! Why only sometimes: a binary linked this way needs the symbol version
//! `GLIBC_ABI_DT_RELR`, i.e. glibc 2.36 or later, and does not start on an
//! older one (Ubuntu 22.04 has 2.35: "version `GLIBC_ABI_DT_RELR' not
//! found"). So the flag is added only when
//!
//! - the build is native (target = host) for Linux with glibc, so the
//!   host's C library is the one the binary is linked against,
//! - the host's glibc (`getconf GNU_LIBC_VERSION`) is 2.36 or later, and
//! - a probe program linked with the flag (and `--fatal-warnings`, since
//!   an older GNU ld only warns about an unknown `-z` option) builds and
//!   runs.
//!
//! Anything else (no `getconf`, an unknown answer, a probe that fails)
//! leaves the flag off: the binary is then as portable as before, only
//! slower to start. To build a binary for older systems on a new host,
//! set `CORRAL_NO_RELR=1`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The link argument that packs the relative relocations.
const RELR: &str = "-Wl,-z,pack-relative-relocs";

/// The first glibc whose loader applies DT_RELR.
const GLIBC_WITH_RELR: (u32, u32) = (2, 36);

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CORRAL_NO_RELR");
    // The decision is recorded in the build script's `output` file (under
    // target/*/build/corral-*/); not as a cargo warning, which would show
    // on every build on an older host.
    match relr_refused() {
        None => {
            println!("cargo:rustc-link-arg-bins={RELR}");
            println!("corral: linked with DT_RELR");
        }
        Some(reason) => println!("corral: linked without DT_RELR: {reason}"),
    }
}

/// Why the binary must not use DT_RELR, or `None` when it can.
fn relr_refused() -> Option<String> {
    if env::var_os("CORRAL_NO_RELR").is_some_and(|v| !v.is_empty() && v != "0") {
        return Some("CORRAL_NO_RELR is set".into());
    }
    let var = |name: &str| env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" {
        return Some("the target is not Linux with glibc".into());
    }
    if var("TARGET") != var("HOST") {
        return Some("cross-compiling: the host's glibc says nothing of the target's".into());
    }
    let version = match glibc_version() {
        Some(v) => v,
        None => {
            return Some("cannot tell the host's glibc version (getconf GNU_LIBC_VERSION)".into())
        }
    };
    if version < GLIBC_WITH_RELR {
        return Some(format!(
            "the host's glibc is {}.{}; DT_RELR needs {}.{}",
            version.0, version.1, GLIBC_WITH_RELR.0, GLIBC_WITH_RELR.1
        ));
    }
    let out = PathBuf::from(var("OUT_DIR"));
    probe(&out).err()
}

/// The host's glibc version, from `getconf GNU_LIBC_VERSION` ("glibc 2.36").
fn glibc_version() -> Option<(u32, u32)> {
    let out = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim().strip_prefix("glibc ")?;
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Builds a small program with the flag, with the same rustc and flags as
/// this build, and runs it.
fn probe(out: &Path) -> Result<(), String> {
    let src = out.join("relr_probe.rs");
    let bin = out.join("relr_probe");
    // A few pointers in static data make relative relocations to pack.
    let text = "static WORDS: [&str; 3] = [\"a\", \"b\", \"c\"];\n\
                fn main() { std::process::exit(if WORDS.concat() == \"abc\" { 0 } else { 1 }) }\n";
    std::fs::write(&src, text).map_err(|e| format!("cannot write the probe: {e}"))?;
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    // The build's own flags (a chosen linker, say), one per \x1f.
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    let built = cmd
        .arg("--edition=2021")
        .arg("-o")
        .arg(&bin)
        .arg(format!("-Clink-arg={RELR}"))
        .arg("-Clink-arg=-Wl,--fatal-warnings")
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run rustc for the probe: {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "the linker refuses {RELR}: {}",
            String::from_utf8_lossy(&built.stderr).trim()
        ));
    }
    let ran = Command::new(&bin)
        .output()
        .map_err(|e| format!("the probe linked with {RELR} does not start: {e}"))?;
    if !ran.status.success() {
        return Err(format!(
            "the probe linked with {RELR} does not run here: {}",
            String::from_utf8_lossy(&ran.stderr).trim()
        ));
    }
    Ok(())
}
