//! The CLI contract: exit codes, `--json`, refusals, `check`, `explain`,
//! `doctor`.

mod common;
use common::*;

#[test]
fn runs_python_and_prints_42() {
    let out = run(&[], &["python3", "-c", "print(42)"]);
    assert_eq!(text(&out.stdout), "42\n");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn exit_status_is_the_commands_own_or_128_plus_signal() {
    assert_eq!(sh("exit 3").0, 3);
    assert_eq!(sh("kill -TERM $$").0, 128 + 15);
    let (v, out) = run_json(&[], &["sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(137));
    assert_eq!(v["exit_code"], 137);
    assert_eq!(v["signal"], 9);
}

#[test]
fn json_result_has_the_documented_fields() {
    let (v, out) = run_json(
        &[],
        &[
            "python3",
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)",
        ],
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(v["exit_code"], 4);
    assert_eq!(v["signal"], serde_json::Value::Null);
    assert_eq!(v["timed_out"], false);
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert_eq!(v["stdout_bytes"], 4);
    assert_eq!(v["stderr_bytes"], 4);
    assert_eq!(v["stdout_truncated"], false);
    assert!(v["wall_ms"].as_u64().is_some());
    assert_eq!(v["error"], serde_json::Value::Null);
    assert_eq!(v["enforced"]["no_new_privs"], true);
    assert_eq!(v["enforced"]["uid"], sandbox_uid());
    let ns: Vec<&str> = v["enforced"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(ns, ["user", "mount", "pid", "ipc", "uts", "net", "cgroup"]);
}

#[test]
fn commands_outside_the_allowlist_exit_125_with_an_event() {
    let out = run(&[], &["perl", "-e", "print 1"]);
    assert_eq!(out.status.code(), Some(125));
    let ev = events(&out.stderr);
    assert_eq!(ev.len(), 1, "{}", text(&out.stderr));
    assert_eq!(ev[0]["code"], "command.not_allowed");
    assert!(text(&out.stderr).contains("not allowed by profile `code`"));
}

#[test]
fn absolute_paths_are_rejected_unless_the_profile_allows_them() {
    let out = run(&[], &["/bin/sh", "-c", "echo pwned"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(!text(&out.stdout).contains("pwned"));
    assert_eq!(events(&out.stderr)[0]["code"], "command.path_rejected");
    let (_d, cfg) = config(
        "[profile.paths]\nextends = \"code\"\n[profile.paths.commands]\nallow_paths = true\n",
    );
    let cfg = cfg.to_str().unwrap();
    let out = run(
        &["--config", cfg, "--profile", "paths"],
        &["/bin/sh", "-c", "echo fine"],
    );
    assert_eq!(text(&out.stdout), "fine\n", "{}", text(&out.stderr));
}

#[test]
fn argument_deny_patterns_exit_125_naming_the_rule() {
    let (_d, cfg) = config("[profile.nopip]\nextends = \"code\"\n[profile.nopip.commands]\ndeny_args = [\"* -m pip *\"]\n");
    let cfg = cfg.to_str().unwrap();
    let out = run(
        &["--config", cfg, "--profile", "nopip"],
        &["python3", "-m", "pip", "install", "x"],
    );
    assert_eq!(out.status.code(), Some(125));
    let ev = events(&out.stderr);
    assert_eq!(ev[0]["code"], "command.args_denied");
    assert_eq!(ev[0]["fields"]["rule"], "* -m pip *");
    let out = run(
        &["--config", cfg, "--profile", "nopip"],
        &["python3", "-c", "print('ok')"],
    );
    assert_eq!(text(&out.stdout), "ok\n");
}

#[test]
fn not_found_is_127_and_not_executable_is_126() {
    let data = tempfile::tempdir().unwrap();
    let script = data.path().join("script");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    // Readable but not executable.
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (_d, cfg) = config("[profile.p]\nextends = \"code\"\n[profile.p.commands]\nallow_paths = true\nallow = [\"sh\", \"corral-no-such-command\"]\n");
    let cfg = cfg.to_str().unwrap();
    let ro = format!("{}:/data", data.path().display());
    let out = run(
        &["--config", cfg, "--profile", "p", "--ro", &ro],
        &["/data/script"],
    );
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    let out = run(
        &["--config", cfg, "--profile", "p", "--ro", &ro],
        &["/data/missing"],
    );
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let out = run(
        &["--config", cfg, "--profile", "p"],
        &["corral-no-such-command"],
    );
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(events(&out.stderr)[0]["code"], "command.not_found");
}

#[test]
fn hostile_arguments_reach_the_program_verbatim_without_a_shell() {
    let args = [
        "$(id)",
        "; rm -rf /",
        "`touch /tmp/x`",
        "a\nb",
        "--",
        "*",
        "'\"",
    ];
    let mut argv = vec![
        "python3",
        "-c",
        "import sys, json; print(json.dumps(sys.argv[1:]))",
    ];
    argv.extend_from_slice(&args);
    let out = run(&[], &argv);
    let got: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, args);
}

#[test]
fn check_validates_and_names_key_and_line() {
    let (_d, good) = config("[profile.a]\nextends = \"code\"\nhostname = \"alpha\"\n");
    let out = corral().arg("check").arg(&good).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok"));
    let (_d, bad) =
        config("[profile.a]\nextends = \"code\"\n\n[profile.a.limits]\ntimeout_sec = 5\n");
    let out = corral().arg("check").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 5") && err.contains("timeout_sec"),
        "{err}"
    );
    // Neither, or both at once, is a usage error.
    let neither = corral().arg("check").output().unwrap();
    assert_eq!(neither.status.code(), Some(125));
    let both = corral()
        .arg("check")
        .arg(&good)
        .arg("--config")
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(125), "{}", text(&both.stderr));
    // `--config FILE`, as run, explain and serve take it, is the same.
    for (file, code) in [(&good, 0), (&bad, 125)] {
        let out = corral()
            .args(["check", "--config"])
            .arg(file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{}", text(&out.stderr));
    }
    // A run with a bad config is refused the same way.
    let out = run(&["--config", bad.to_str().unwrap()], &["sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125));
}

#[test]
fn unknown_profile_is_refused() {
    let out = run(&["--profile", "nope"], &["sh", "-c", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("unknown profile `nope`"));
}

/// `corral explain` marks a bind this host lacks, as `corral check` warns
/// of it: a reviewer sees the profile would not run here.
#[test]
fn explain_marks_a_bind_this_host_lacks() {
    let (_d, cfg) = config(
        "[profile.far]\nextends = \"code\"\n[profile.far.filesystem]\nread_only = [\"/nonexistent-corral-test/data:/data\", \"/usr/share:/share\"]\n",
    );
    let out = corral()
        .args(["explain", "far", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "read-only bind of /nonexistent-corral-test/data (runs refused here: mount.invalid)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("read-only bind of /usr/share\n"),
        "an existing source is not marked: {stdout}"
    );
    assert!(
        text(&out.stderr).contains(
            "warning: profile `far`: filesystem.read_only `/nonexistent-corral-test/data`"
        ),
        "{}",
        text(&out.stderr)
    );
    let out = corral()
        .args(["explain", "far", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["warnings"][0]["path"], "/nonexistent-corral-test/data",
        "{v}"
    );
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(1), "{v}");
}

#[test]
fn explain_lists_mounts_commands_and_layers() {
    let out = corral().arg("explain").output().unwrap();
    assert!(out.status.success());
    let s = text(&out.stdout);
    for needle in [
        "profile code",
        "/usr",
        "read-only bind",
        "/workspace",
        "python3",
        "LD_*",
        "namespaces",
        "always stripped",
        "queued signals:    1024",
    ] {
        assert!(s.contains(needle), "explain lacks {needle:?}:\n{s}");
    }
    assert!(!s.contains("/etc/shadow"));
    assert!(s.contains("mode none: own network namespace"), "{s}");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/example.toml");
    let out = corral()
        .args(["explain", "--config", example, "pip"])
        .output()
        .unwrap();
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    for needle in [
        "mode allow",
        "*.pypi.org:443",
        "upload.pypi.org (every port; deny wins)",
        "10.20.0.0/24",
        "mirror.internal=10.20.0.5",
        "at most 16 at once, closed after 30s idle",
    ] {
        assert!(s.contains(needle), "explain pip lacks {needle:?}:\n{s}");
    }
    let out = corral().args(["explain", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["profile"]["name"], "code");
}

#[test]
fn doctor_reports_a_working_sandbox() {
    let out = corral().arg("doctor").output().unwrap();
    let s = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{s}");
    assert!(
        s.contains("full sandbox start") && s.contains("works"),
        "{s}"
    );
    assert!(s.contains("landlock"), "{s}");
    // What each start's cgroup move costs here, and the remedy if any.
    assert!(s.contains("cgroup move per sandbox start"), "{s}");
}

#[test]
fn runs_node_and_bash_too() {
    let out = run(&[], &["node", "-e", "console.log(6 * 7)"]);
    assert_eq!(text(&out.stdout), "42\n", "node: {}", text(&out.stderr));
    let out = run(&[], &["bash", "-c", "echo $((6 * 7)) ${BASH_VERSINFO[0]}"]);
    assert!(
        text(&out.stdout).starts_with("42 "),
        "bash: {}",
        text(&out.stderr)
    );
}

#[test]
fn check_names_the_dotted_key_and_the_type_in_plain_words() {
    let (_d, cfg) =
        config("[profile.x]\nextends = \"code\"\n[profile.x.limits]\npids = \"many\"\n");
    let out = corral().arg("check").arg(&cfg).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("line 4: profile.x.limits.pids: expected a whole number (0 or more), found the string \"many\""),
        "{err}"
    );
    assert!(!err.contains("u64"), "{err}");
    let out = corral()
        .args(["check", "--json"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["error"]["code"], "config.invalid");
    assert_eq!(v["error"]["key"], "profile.x.limits.pids");
    assert_eq!(v["error"]["line"], 4);
    assert!(v.get("exit_code").is_none(), "not a run result: {v}");
}

#[test]
fn check_and_doctor_json_print_their_own_objects() {
    let (_d, cfg) = config("[profile.x]\nextends = \"code\"\n");
    let out = corral()
        .args(["check", "--json"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        v["profiles"].as_array().unwrap().contains(&"x".into()),
        "{v}"
    );
    assert_eq!(v["mcp_servers"], serde_json::json!([]), "{v}");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    assert!(v.get("exit_code").is_none(), "{v}");
    // A bind source this host lacks leaves the file valid (it may be meant
    // for another machine) and is named, as the run would refuse it.
    let (_d, elsewhere) = config(
        "[profile.far]\nextends = \"code\"\n[profile.far.filesystem]\nread_only = [\"/nonexistent-corral-test/data\"]\n",
    );
    let out = corral()
        .args(["check", "--json"])
        .arg(&elsewhere)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        (
            &v["warnings"][0]["profile"],
            &v["warnings"][0]["key"],
            &v["warnings"][0]["path"]
        ),
        (
            &"far".into(),
            &"filesystem.read_only".into(),
            &"/nonexistent-corral-test/data".into()
        ),
        "{v}"
    );
    let out = corral().arg("check").arg(&elsewhere).output().unwrap();
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains(
            "warning: profile `far`: filesystem.read_only `/nonexistent-corral-test/data`: it does not exist on this host; runs of the profile are refused here (mount.invalid)"
        ),
        "{}",
        text(&out.stderr)
    );
    // A runtime tree is named once, under its own key (it is one of the
    // read-only binds too); a bind through a symlink is named with the
    // code its runs get.
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("data-link");
    std::os::unix::fs::symlink(links.path(), &link).unwrap();
    let (_d, more) = config(&format!(
        "[profile.tree]\nextends = \"code\"\n[profile.tree.filesystem]\nruntime = \"/nonexistent-corral-test/venv\"\n\
         [profile.linked]\nextends = \"code\"\n[profile.linked.filesystem]\nread_only = [\"{}:/data\"]\n",
        link.display()
    ));
    let out = corral()
        .args(["check", "--json"])
        .arg(&more)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let named: Vec<(&str, &str, &str)> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["profile"].as_str().unwrap(),
                w["key"].as_str().unwrap(),
                w["code"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            ("linked", "filesystem.read_only", "mount.symlink"),
            ("tree", "filesystem.runtime", "mount.invalid")
        ],
        "{v}"
    );
    let run_out = run(
        &["--config", elsewhere.to_str().unwrap(), "--profile", "far"],
        &["sh", "-c", "true"],
    );
    assert_eq!(run_out.status.code(), Some(125), "as the warning says");
    assert!(
        text(&run_out.stderr).contains("/nonexistent-corral-test/data does not exist"),
        "{}",
        text(&run_out.stderr)
    );
    // The supervised MCP servers are listed by name, in config order.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/example.toml");
    let out = corral()
        .args(["check", "--json", example])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mcp_servers"], serde_json::json!(["time"]), "{v}");
    let out = corral().args(["check", example]).output().unwrap();
    assert!(
        text(&out.stdout).ends_with("; 1 MCP server: time)\n"),
        "{}",
        text(&out.stdout)
    );

    let out = corral().args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("exit_code").is_none(), "{v}");
    let findings = v["findings"].as_array().unwrap();
    assert!(
        findings
            .iter()
            .any(|f| f["feature"] == "full sandbox start" && f["ok"].is_boolean()),
        "{v}"
    );
    assert_eq!(v["ok"].as_bool(), Some(out.status.success()), "{v}");

    // A usage error of check or doctor with --json is an error object.
    for args in [
        &["check", "--json", "--bogus"][..],
        &["doctor", "--json", "--bogus"],
    ] {
        let out = corral().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(125));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error"]["code"], "request.invalid", "{v}");
        assert!(v.get("exit_code").is_none(), "{v}");
    }
}

#[test]
fn hostname_and_die_with_parent_flags_are_checked() {
    let out = run(&["--hostname", "mcp-acme"], &["sh", "-c", "hostname"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "mcp-acme\n");
    let out = run(&["--hostname", "bad host;id"], &["sh", "-c", "hostname"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("--hostname"),
        "{}",
        text(&out.stderr)
    );
    // A parent that is not ours: the run refuses instead of outliving it.
    let out = corral_run()
        .env("CORRAL_PARENT_PID", "1")
        .args(["--die-with-parent", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("parent is already gone"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("ran"));
}

/// `--die-with-parent` holds once the sandbox runs: when corral's parent
/// dies, corral goes, and its sandbox with it. As root corral changes its
/// own effective uid around the clone of init, which clears a
/// parent-death signal (prctl(2)); it must arm it again.
#[test]
fn die_with_parent_holds_once_the_sandbox_runs() {
    let token = format!("corral-die-with-parent-{}", std::process::id());
    let script = format!("sleep 30; true # {token}");
    // bash starts corral in the background and waits: the parent to kill.
    let mut parent = corral_run_via_bash("\"$@\" & wait", &[])
        .args(["--die-with-parent", "--", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("bash");
    wait_until(10, "the sandboxed shell", || process_running("sh", &token));
    parent.kill().unwrap();
    parent.wait().unwrap();
    wait_until(5, "corral and its sandbox to follow their parent", || {
        !process_running("", &token)
    });
}
