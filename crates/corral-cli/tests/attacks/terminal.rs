//! The invoking terminal: no input pushed into it (TIOCSTI, TIOCLINUX),
//! no escape sequences from hostile policy strings echoed to it raw.

use crate::common::*;
use crate::support::*;

use std::io::{ErrorKind, Read};
use std::process::Output;

/// A pseudo-terminal pair on the host: (master, slave).
fn open_pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: posix_openpt takes only flags.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(master >= 0, "posix_openpt");
    // SAFETY: `master` is a valid, owned descriptor from posix_openpt.
    let master = unsafe { std::fs::File::from_raw_fd(master) };
    use std::os::fd::AsRawFd;
    // SAFETY: grantpt/unlockpt take a descriptor we own.
    let ok = unsafe {
        libc::grantpt(master.as_raw_fd()) == 0 && libc::unlockpt(master.as_raw_fd()) == 0
    };
    assert!(ok, "grantpt/unlockpt");
    let mut buf = [0 as libc::c_char; 128];
    // SAFETY: the buffer is valid for its length; ptsname_r NUL-terminates.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    assert_eq!(rc, 0, "ptsname_r");
    // SAFETY: ptsname_r wrote a NUL-terminated string into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&name)
        .expect("open pty slave");
    (master, slave)
}

#[test]
fn attack_tiocsti_into_the_invoking_terminal_is_refused() {
    if !x86_64("attack_tiocsti_into_the_invoking_terminal_is_refused") {
        return;
    }
    // corral runs from a terminal (a pty here): the program pushes
    // "id\n" into that terminal's input queue, which the invoking shell
    // would read after corral exits (CVE-2017-5226).
    let (_master, slave) = open_pty();
    let reader = slave.try_clone().expect("dup slave");
    let body = r#"say('stdin is a tty', os.isatty(0))
say('TIOCSTI', [sc(16, 0, 0x5412, bytes([c])) for c in b'id\n'])
r, w = os.pipe()
say('TIOCSTI on a pipe', sc(16, r, 0x5412, b'x'))
"#;
    let out = corral_run()
        .args([
            "--timeout",
            "30",
            "--",
            "python3",
            "-c",
            &format!("{PRELUDE}{body}"),
        ])
        .stdin(slave)
        .output()
        .expect("spawn corral");
    // Baseline for the pipe: ENOTTY.
    assert_eq!(
        text(&out.stdout),
        "stdin is a tty True\nTIOCSTI ['EPERM', 'EPERM', 'EPERM']\nTIOCSTI on a pipe EPERM\n",
        "{}",
        text(&out.stderr)
    );
    // Nothing waits in the terminal's input queue.
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETFL on a descriptor we own.
    unsafe {
        libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
    }
    let mut buf = [0u8; 64];
    match (&reader).read(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("input was injected into the terminal: {other:?}"),
    }
}

#[test]
fn attack_tiocsti_with_high_bits_set_is_refused() {
    if !x86_64("attack_tiocsti_with_high_bits_set_is_refused") {
        return;
    }
    // The kernel truncates the request to 32 bits; a filter comparing all
    // 64 would miss these (CVE-2019-10063). Baseline on /dev/null: ENOTTY.
    expect(
        r#"for req in (0x5412, 0xffffffff00005412, 0x0000000100005412, 0x8000000000005412):
    say(hex(req), sc(16, 0, req, b'x'))
"#,
        "0x5412 EPERM\n0xffffffff00005412 EPERM\n0x100005412 EPERM\n0x8000000000005412 EPERM\n",
    );
}

#[test]
fn attack_tioclinux_is_refused() {
    if !x86_64("attack_tioclinux_is_refused") {
        return;
    }
    // TIOCL_SETSEL / TIOCL_PASTESEL: the console's paste injects input too.
    // Baseline on /dev/null: ENOTTY.
    expect(
        r#"say('TIOCLINUX PASTESEL', sc(16, 0, 0x541c, bytes([3])))
say('TIOCLINUX SETSEL', sc(16, 0, 0x541c, bytes([2]) + bytes(12)))
say('TIOCLINUX high bits', sc(16, 0, 0xffffffff0000541c, bytes([3])))
"#,
        "TIOCLINUX PASTESEL EPERM\nTIOCLINUX SETSEL EPERM\nTIOCLINUX high bits EPERM\n",
    );
}

#[test]
fn attack_terminal_escapes_in_policy_strings_are_not_echoed_raw() {
    let hostile = "\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let toml_str = "\\u001b]0;pwned\\u0007\\u001b[2J";
    let clean = |what: &str, out: &Output| {
        assert_eq!(out.status.code(), Some(125), "{what}");
        for b in out.stderr.iter().chain(out.stdout.iter()) {
            assert!(
                *b == b'\n' || *b >= 0x20,
                "{what}: control byte {b:#04x} echoed raw: {:?}",
                text(&out.stderr)
            );
        }
    };
    for body in [
        format!("[profile.a]\nhostname = \"{toml_str}\"\n"),
        format!("[profile.a]\nextends = \"{toml_str}\"\n"),
        format!("[profile.a.env]\npass = [\"{toml_str}=\"]\n"),
        format!("[profile.a.filesystem]\ndeny = [\"/x/../{toml_str}\"]\n"),
        format!("[profile.a]\n\"{toml_str}\" = 1\n"),
    ] {
        let (_d, cfg) = config(&body);
        let out = corral().arg("check").arg(&cfg).output().expect("check");
        clean(&body, &out);
    }
    let out = run(&["--profile", hostile], &["sh", "-c", "true"]);
    clean("--profile", &out);
    let out = run(
        &["--ro", &format!("/x/../{hostile}")],
        &["sh", "-c", "true"],
    );
    clean("--ro", &out);
}
