//! Injection: hostile strings in policy values, arguments, environment
//! names and values, file names and bind paths.

use crate::common::*;
use crate::support::*;

use std::process::Command;

#[test]
fn attack_hostname_with_shell_metacharacters_is_rejected_by_check() {
    for bad in [
        "a;rm -rf /",
        "$(id)",
        "`id`",
        "a b",
        "a\\nb",
        "-rf",
        "x|tee /etc/passwd",
        "../../etc",
    ] {
        let (_d, cfg) = config(&format!(
            "[profile.h]\nextends = \"code\"\nhostname = \"{bad}\"\n"
        ));
        let out = corral().arg("check").arg(&cfg).output().expect("check");
        assert_eq!(out.status.code(), Some(125), "accepted hostname {bad:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("line 3") && err.contains("profile.h.hostname"),
            "{err}"
        );
        // A run with it is refused before anything starts.
        let out = run(
            &["--config", cfg.to_str().expect("utf-8"), "--profile", "h"],
            &["sh", "-c", "echo ran"],
        );
        assert_eq!(out.status.code(), Some(125));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn attack_env_names_with_equals_or_nul_are_rejected() {
    for (body, key) in [
        ("pass = [\"A=B\"]", "profile.e.env.pass"),
        ("pass = [\"A\\u0000B\"]", "profile.e.env.pass"),
        ("pass = [\"\"]", "profile.e.env.pass"),
        ("set = { \"A=B\" = \"x\" }", "profile.e.env.set"),
        ("set = { \"PATH\\u0000X\" = \"x\" }", "profile.e.env.set"),
        (
            "set = { A = \"x\\u0000LD_PRELOAD=/evil.so\" }",
            "profile.e.env.set.A",
        ),
    ] {
        let (_d, cfg) = config(&format!(
            "[profile.e]\nextends = \"code\"\n[profile.e.env]\n{body}\n"
        ));
        let out = corral().arg("check").arg(&cfg).output().expect("check");
        assert_eq!(out.status.code(), Some(125), "accepted {body}");
        let err = text(&out.stderr);
        assert!(err.contains("line 4") && err.contains(key), "{body}: {err}");
    }
    for flags in [
        ["--env", "A=B"],
        ["--env", ""],
        ["--set-env", "=x"],
        ["--set-env", "NOEQUALS"],
    ] {
        let out = run(&flags, &["sh", "-c", "echo ran"]);
        assert_eq!(out.status.code(), Some(125), "{flags:?}");
        assert!(out.stdout.is_empty(), "{flags:?}");
    }
}

#[test]
fn attack_argv_that_cannot_reach_execve_intact_is_refused_with_125() {
    // A NUL cannot cross execve into corral at all; bytes that are not
    // UTF-8 can, and must either reach the program verbatim or be refused
    // before anything runs, never be mangled.
    use std::os::unix::ffi::OsStrExt;
    let raw = std::ffi::OsStr::from_bytes(b"\xff\xfe$(id)");
    let out = corral_run()
        .args([
            "--",
            "python3",
            "-c",
            "import sys, os; sys.stdout.buffer.write(os.fsencode(sys.argv[1]))",
        ])
        .arg(raw)
        .output()
        .expect("spawn");
    match out.status.code() {
        Some(125) => assert!(out.stdout.is_empty()),
        Some(0) => assert_eq!(out.stdout, raw.as_bytes()),
        other => panic!("{other:?}: {}", text(&out.stderr)),
    }
    // The same through the command name itself.
    let out = corral_run()
        .arg("--")
        .arg(std::ffi::OsStr::from_bytes(b"python3\xff"))
        .arg("-c")
        .arg("print('ran')")
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
}

#[test]
fn attack_hostile_file_names_pass_through_verbatim() {
    let hostile = [
        "new\nline",
        "quote'\"",
        "$(touch pwned)",
        "`id`",
        "-rf",
        "back\\slash",
        " spaced ",
        "tab\tname",
        "\u{1b}[31mred",
        "*",
        "日本語",
    ];
    // The workdir's own host path is hostile too.
    let parent = readable_dir();
    let wd = parent.path().join("work dir 'q\" $(id) \n end");
    std::fs::create_dir(&wd).expect("mkdir");
    for n in hostile {
        std::fs::write(wd.join(n), n).expect("write");
    }
    if is_root() {
        let st = Command::new("chown")
            .args(["-R", "4242:4242"])
            .arg(&wd)
            .status()
            .expect("chown");
        assert!(st.success());
    }
    // Files only: the protected entries' placeholders are directories.
    let script = "import os, json\n\
        names = sorted(n for n in os.listdir('.') if not os.path.isdir(n))\n\
        for n in names:\n\
        \x20   open(n + '.out', 'w').write(open(n).read())\n\
        print(json.dumps([os.getcwd(), names]))\n";
    let out = run(
        &["--workdir", wd.to_str().expect("utf-8")],
        &["python3", "-c", script],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let mut want: Vec<&str> = hostile.to_vec();
    want.sort();
    assert_eq!(v[0], "/workspace");
    assert_eq!(v[1], serde_json::json!(want));
    for n in hostile {
        assert_eq!(
            std::fs::read_to_string(wd.join(format!("{n}.out"))).expect("copy on host"),
            n
        );
    }
    assert!(!wd.join("pwned").exists());
    assert_eq!(names(&wd).len(), 2 * hostile.len());
}

#[test]
fn attack_dotdot_and_nul_in_bind_paths_are_rejected() {
    for spec in [
        "/etc/../etc/shadow:/data",
        "/usr:/workspace/../etc",
        "/usr:/data/../../proc",
        "/usr/./bin:/data",
        "/usr:relative",
        "/usr:/a:/b",
    ] {
        let out = run(&["--ro", spec], &["sh", "-c", "echo ran"]);
        assert_eq!(out.status.code(), Some(125), "accepted --ro {spec}");
        assert!(out.stdout.is_empty());
        let out = run(&["--rw", spec], &["sh", "-c", "echo ran"]);
        assert_eq!(out.status.code(), Some(125), "accepted --rw {spec}");
    }
    for body in [
        "read_only = [\"/etc/../etc/shadow:/data\"]",
        "read_write = [\"/tmp:/workspace/..\"]",
        "deny = [\"/usr/share/doc\\u0000\"]",
        "deny = [\"/usr/../etc\"]",
        "system = [\"/usr\", \"/etc/../root\"]",
    ] {
        let (_d, cfg) = config(&format!(
            "[profile.p]\nextends = \"code\"\n[profile.p.filesystem]\n{body}\n"
        ));
        let out = corral().arg("check").arg(&cfg).output().expect("check");
        assert_eq!(out.status.code(), Some(125), "accepted {body}");
        assert!(
            text(&out.stderr).contains("line 4"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn attack_hostile_env_values_reach_the_program_verbatim_and_uninterpreted() {
    let value = "$(touch /workspace/pwned); `id` \"'\n${HOME} \\ %s %n";
    let out = run(
        &["--set-env", &format!("HOSTILE={value}")],
        &[
            "python3",
            "-c",
            "import os, sys; sys.stdout.write(os.environ['HOSTILE']); sys.stdout.write('|' + str(os.path.exists('/workspace/pwned')))",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        format!("{value}|False"),
        "{}",
        text(&out.stderr)
    );
}
