//! Config parsing: every error names the key and the line.

use std::path::Path;

use super::*;
use crate::profile::{LandlockMode, SeccompProfile};
use crate::size::ByteSize;

fn err(text: &str) -> ConfigError {
    Config::parse(text, Some(Path::new("corral.toml"))).unwrap_err()
}

#[test]
fn builtins_are_there() {
    let c = Config::default();
    let code = c.profile("code").unwrap();
    assert_eq!(code.commands.allow, ["python3", "node", "sh", "bash"]);
    assert!(c
        .profile("nope")
        .unwrap_err()
        .to_string()
        .contains("known: build, code, install, mcp-node, mcp-python"));
    for name in ["mcp-python", "mcp-node"] {
        let p = c.profile(name).unwrap();
        assert_eq!(p.limits.timeout_secs, None, "{name}: servers run for days");
        assert_eq!(
            p.limits.output_kill_bytes, None,
            "{name}: no lifetime ceiling"
        );
        assert!(
            p.limits.cpu_millicores.is_some(),
            "{name}: bounded by CPU instead"
        );
        assert!(p.commands.restrict_exec, "{name}");
        assert_eq!(p.network.mode, crate::network::NetworkMode::None, "{name}");
    }
    let install = c.profile("install").unwrap();
    assert_eq!(install.network.mode, crate::network::NetworkMode::Allow);
    assert!(install
        .network
        .allow_domains
        .iter()
        .any(|d| d.pattern == "registry.npmjs.org"));
    assert_eq!(
        c.profile("build").unwrap().network.mode,
        crate::network::NetworkMode::None
    );
}

#[test]
fn a_runtime_tree_is_bound_and_first_on_the_path() {
    let c = Config::parse(
        "[profile.srv]\nextends = \"mcp-python\"\n[profile.srv.filesystem]\nruntime = \"/opt/venv/\"\n",
        None,
    )
    .unwrap();
    let p = c.profile("srv").unwrap();
    assert_eq!(
        p.filesystem.runtime.as_ref().map(|r| r.as_str()),
        Some("/opt/venv")
    );
    assert!(p
        .filesystem
        .read_only
        .iter()
        .any(|m| m.source.as_str() == "/opt/venv" && m.dest.as_str() == "/opt/venv"));
    assert_eq!(p.commands.search_path[0].as_str(), "/opt/venv/bin");
    assert!(p.env.set["PATH"].starts_with("/opt/venv/bin:"));
    assert_eq!(p.env.set["VIRTUAL_ENV"], "/opt/venv");
    let e = err("[profile.a.filesystem]\nruntime = \"relative\"\n");
    assert_eq!(e.key, "profile.a.filesystem.runtime");
}

#[test]
fn extends_and_overrides() {
    let c = Config::parse(
        r#"
[profile.a]
extends = "code"
hostname = "alpha"
[profile.a.commands]
allow = ["python3"]
deny_args = ["*pip*"]
[profile.b]
extends = "a"
[profile.b.limits]
memory = "256MiB"
pids = 64
output = "64KiB"
[profile.b.filesystem]
tmp_size = "16MiB"
read_only = ["/opt/data:/data"]
"#,
        None,
    )
    .unwrap();
    let b = c.profile("b").unwrap();
    assert_eq!(b.hostname, "alpha");
    assert_eq!(b.commands.allow, ["python3"]);
    assert_eq!(b.filesystem.tmp_size, ByteSize(16 << 20));
    assert_eq!(b.filesystem.read_only[0].dest.as_str(), "/data");
    assert_eq!(b.name, "b");
    assert_eq!(b.limits.memory_bytes, Some(ByteSize(256 << 20)));
    assert_eq!(b.limits.pids, Some(64));
    assert_eq!(b.limits.output_bytes, ByteSize(64 << 10));
    assert_eq!(b.limits.open_files, 1024, "inherited default");
    let e = err("[profile.a.limits]\noutput = \"1MiB\"\noutput_kill = \"64KiB\"\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(3), "profile.a.limits.output_kill")
    );
    let e = err("[profile.a.limits]\npids = 0\n");
    assert_eq!(e.key, "profile.a.limits.pids");
}

#[test]
fn unknown_key_names_key_and_line() {
    let e = err("[profile.a]\nextends = \"code\"\n\n[profile.a.filesystem]\nread_olny = []\n");
    let msg = e.to_string();
    assert_eq!(e.line, Some(5), "{msg}");
    assert!(msg.contains("read_olny"), "{msg}");
    assert!(msg.starts_with("corral.toml: line 5: "), "{msg}");
}

#[test]
fn bad_values_name_key_and_line() {
    let e = err("[profile.a]\n[profile.a.filesystem]\ntmp_size = \"12 parsecs\"\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(3), "profile.a.filesystem.tmp_size")
    );
    let e = err("[profile.a.filesystem]\nread_write = [\n  \"/ok\",\n  \"rel/path\",\n]\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(4), "profile.a.filesystem.read_write")
    );
    assert!(e.message.contains("relative"));
    let e = err("[profile.a.filesystem]\ndeny = [\"/usr/../etc\"]\n");
    assert!(e.message.contains(".."));
    let e = err("[profile.a]\nextends = \"missing\"\n");
    assert_eq!(e.key, "profile.a.extends");
    let e = err("[profile.a]\nhostname = \"bad host\"\n");
    assert_eq!(e.line, Some(2));
    let e = err("[profile.a.commands]\nallow = [\"/bin/sh\"]\n");
    assert_eq!(e.key, "profile.a.commands.allow");
    let e = err("[profile.a.identity]\nuid = 0\n");
    assert_eq!(e.key, "profile.a.identity.uid");
}

#[test]
fn conflicts_are_errors() {
    let e = err("[profile.a.filesystem]\nread_only = [\"/a:/x\"]\nread_write = [\"/b:/x\"]\n");
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("also mounted"));
    let e = err("[profile.a.filesystem]\nread_only = [\"/a\"]\ndeny = [\"/a\"]\n");
    assert!(e.message.contains("both mounted and denied"));
    let e = err("[profile.a.filesystem]\nread_only = [\"/host/proc:/proc/x\"]\n");
    assert!(e.message.contains("/proc"));
    let e = err("[profile.a.env]\nset = { LD_PRELOAD = \"/x.so\" }\n");
    assert!(e.message.contains("always blocked"), "{e}");
    assert_eq!(e.line, Some(2));
    let e = err("[profile.a.env]\npass = [\"OK\", \"NODE_OPTIONS\"]\n");
    assert!(e.message.contains("always blocked"));
}

#[test]
fn conflicts_with_inherited_rules_are_errors() {
    let e = err("[profile.a.filesystem]\nread_only = [\"/a:/x\"]\n[profile.b]\nextends = \"a\"\n[profile.b.filesystem]\nread_write = [\"/b:/x\"]\n");
    assert!(e.message.contains("mounted twice"), "{e}");
    let e = err("[profile.a.env]\nset = { TOKEN = \"x\" }\n[profile.b]\nextends = \"a\"\n[profile.b.env]\nblock = [\"TOK*\"]\n");
    assert!(e.message.contains("TOKEN"), "{e}");
    let e = err("[profile.a.filesystem]\nsystem = [\"/usr\", \"/tmp\"]\n");
    assert_eq!(e.key, "profile.a.filesystem.system");
}

#[test]
fn merged_limits_are_checked() {
    let e = err("[profile.a.limits]\noutput = \"128MiB\"\n");
    assert_eq!(e.key, "profile.a.limits.output_kill", "{e}");
    let e = err("[profile.a.limits]\ncpu_millicores = 5\n");
    assert_eq!(e.key, "profile.a.limits.cpu_millicores");
}

#[test]
fn every_limit_is_bounded_at_both_ends_naming_key_and_range() {
    for limit in crate::RunLimit::ALL {
        let key = limit.key();
        // TOML integers stop at i64::MAX: a larger size is written as a
        // string, which sizes accept.
        for (value, end) in [
            (limit.minimum() - 1, "too small"),
            (limit.maximum() + 1, "too large"),
        ] {
            let written = if i64::try_from(value).is_ok() {
                value.to_string()
            } else {
                format!("\"{value}\"")
            };
            let text = format!("[profile.a]\n[profile.a.limits]\n{key} = {written}\n");
            let e = err(&text);
            assert_eq!(
                (e.line, e.key.as_str()),
                (Some(3), format!("profile.a.limits.{key}").as_str()),
                "{e}"
            );
            assert!(e.message.contains(end), "{e}");
            assert!(e.message.contains(&limit.maximum().to_string()), "{e}");
        }
    }
}

#[test]
fn limits_at_their_bounds_are_accepted() {
    let c = Config::parse(
        "[profile.a]\nextends = \"code\"\n[profile.a.limits]\npids = 3\ntimeout_secs = 2073600\nmemory = 9223372036854775807\noutput = 64\ncpu_millicores = 10\nopen_files = 1048576\n",
        None,
    )
    .unwrap();
    let l = &c.profile("a").unwrap().limits;
    assert_eq!(l.pids, Some(3));
    assert_eq!(l.timeout_secs, Some(2_073_600));
    assert_eq!(l.memory_bytes, Some(ByteSize(i64::MAX as u64)));
    assert_eq!(l.output_bytes, ByteSize(64));
    assert_eq!(l.open_files, 1 << 20);
}

#[test]
fn pids_below_three_is_refused_with_the_minimum() {
    for n in [0, 1, 2] {
        let e = err(&format!("[profile.a.limits]\npids = {n}\n"));
        assert_eq!((e.line, e.key.as_str()), (Some(2), "profile.a.limits.pids"));
        assert!(
            e.message
                .starts_with(&format!("{n} is too small: use 3 to ")),
            "{e}"
        );
    }
}

#[test]
fn other_sizes_are_bounded_too() {
    let e = err("[profile.a.filesystem]\ntmp_size = \"9223372036854775808\"\n");
    assert_eq!(e.key, "profile.a.filesystem.tmp_size");
    assert!(e.message.contains("too large"), "{e}");
    let e = err("[server]\nmax_request_bytes = 100\n");
    assert!(e.message.contains("at least 4KiB"), "{e}");
}

#[test]
fn network_section() {
    let c = Config::parse(
        "[profile.n]\nextends = \"code\"\n[profile.n.network]\nmode = \"allow\"\nallow_domains = [\"pypi.org\", \"*.pythonhosted.org:443\"]\nallow_cidrs = [\"127.0.0.1/32\"]\nhosts = { \"pypi.test\" = \"127.0.0.1\" }\n",
        None,
    )
    .unwrap();
    let n = &c.profile("n").unwrap().network;
    assert_eq!(n.mode, crate::network::NetworkMode::Allow);
    assert_eq!(n.allow_domains[1].ports, [443]);
    assert_eq!(n.hosts["pypi.test"].to_string(), "127.0.0.1");
    let e = err("[profile.n.network]\nmode = \"open\"\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "profile.n.network.mode")
    );
    let e = err("[profile.n.network]\nallow_domains = [\"ok.org\",\n  \"1.2.3.4\"]\n");
    assert_eq!(e.line, Some(3));
    let e = err("[profile.n.network]\nallow_cidrs = [\"10.0.0.1/8\"]\n");
    assert!(e.message.contains("host bits"));
    let e = err("[profile.n.network]\nhosts = { \"a.test\" = \"nope\" }\n");
    assert_eq!(e.key, "profile.n.network.hosts.a.test");
    let e = err("[profile.n.network]\ndeny_domains = [\"bad.test:8080\"]\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "profile.n.network.deny_domains")
    );
    assert!(e.message.contains("every port"), "{}", e.message);
}

#[test]
fn server_section() {
    let hash = "a".repeat(64);
    let c = Config::parse(
        &format!("[server]\nlisten = \"127.0.0.1:9000\"\nmax_concurrent = 2\ncode_mode = true\n[[server.tenant]]\nname = \"acme\"\ntoken_sha256 = \"{hash}\"\nprofiles = [\"code\"]\n"),
        None,
    )
    .unwrap();
    assert_eq!(c.server.listen.port(), 9000);
    assert_eq!(
        c.server.tenants[0].max_concurrent, 2,
        "inherits the global cap"
    );
    assert!(c.server.code_mode);
    let e = err("[server]\nlisten = \"nowhere\"\n");
    assert_eq!((e.line, e.key.as_str()), (Some(2), "server.listen"));
    let e = err("[[server.tenant]]\nname = \"a\"\ntoken_sha256 = \"plaintext-token\"\nprofiles = [\"code\"]\n");
    assert_eq!(e.key, "server.tenant.token_sha256");
    let e = err(&format!(
        "[[server.tenant]]\nname = \"a\"\ntoken_sha256 = \"{hash}\"\nprofiles = [\"nope\"]\n"
    ));
    assert!(e.message.contains("unknown profile"), "{e}");
    let e = err("[server]\nbogus = 1\n");
    assert!(e.message.contains("bogus"), "{e}");
}

#[test]
fn audit_outputs_are_digests_unless_full_is_asked_for() {
    use crate::server::AuditOutputs;
    let c = Config::parse("", None).unwrap();
    assert_eq!(
        (c.server.audit_outputs, c.server.audit_output_max_bytes),
        (AuditOutputs::Digest, 64 << 10)
    );
    let c = Config::parse(
        "[server]\naudit_outputs = \"full\"\naudit_output_max_bytes = \"4KiB\"\n",
        None,
    )
    .unwrap();
    assert_eq!(
        (c.server.audit_outputs, c.server.audit_output_max_bytes),
        (AuditOutputs::Full, 4096)
    );
    let e = err("[server]\naudit_outputs = \"everything\"\n");
    assert_eq!((e.line, e.key.as_str()), (Some(2), "server.audit_outputs"));
    assert!(e.message.contains("`digest`"), "{e}");
}

#[test]
fn the_mcp_session_queue_is_bounded() {
    assert_eq!(Config::parse("", None).unwrap().server.mcp_session_queue, 4);
    let c = Config::parse("[server]\nmcp_session_queue = 0\n", None).unwrap();
    assert_eq!(c.server.mcp_session_queue, 0);
    let e = err("[server]\nmcp_session_queue = 65\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "server.mcp_session_queue")
    );
    assert!(e.message.contains("0 to 64"), "{e}");
}

#[test]
fn server_paths_must_be_absolute() {
    for field in ["audit_db", "audit_jsonl", "work_dir"] {
        for bad in ["relative/x", "x", ""] {
            let e = err(&format!(
                "[server]\nlisten = \"127.0.0.1:1\"\n{field} = \"{bad}\"\n"
            ));
            assert_eq!(
                (e.line, e.key.as_str()),
                (Some(3), format!("server.{field}").as_str()),
                "{e}"
            );
            assert!(e.message.contains("absolute"), "{e}");
        }
        let c = Config::parse(&format!("[server]\n{field} = \"/srv/x\"\n"), None).unwrap();
        let s = &c.server;
        let got = match field {
            "audit_db" => s.audit_db.clone(),
            "audit_jsonl" => s.audit_jsonl.clone().unwrap(),
            _ => s.work_dir.clone(),
        };
        assert_eq!(got, Path::new("/srv/x"));
    }
}

#[test]
fn security_section() {
    let c = Config::parse("[profile.s]\nextends = \"code\"\n[profile.s.security]\nseccomp = \"strict\"\nlandlock = \"best-effort\"\ntcp_connect = [443]\n", None).unwrap();
    let s = &c.profile("s").unwrap().security;
    assert_eq!(s.seccomp, SeccompProfile::Strict);
    assert_eq!(s.landlock, LandlockMode::BestEffort);
    assert_eq!(s.tcp_connect, [443]);
    let e = err("[profile.s.security]\nseccomp = \"off\"\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "profile.s.security.seccomp")
    );
    let e = err("[profile.s.security]\ntcp_bind = [80, 70000]\n");
    assert_eq!(e.line, Some(2));
}

#[test]
fn hostnames_are_checked() {
    assert_eq!(validate_hostname("sandbox-1.local"), Ok(()));
    for bad in ["", "-x", "bad host", "a_b", &"a".repeat(64)] {
        let e = validate_hostname(bad).unwrap_err();
        assert_eq!(e.hostname, bad);
        assert!(e.to_string().contains("1 to 63"), "{e}");
    }
    let e = err("[profile.a]\nhostname = \"-x\"\n");
    assert_eq!((e.line, e.key.as_str()), (Some(2), "profile.a.hostname"));
    assert!(e.message.contains("`-x` is invalid"), "{e}");
}

#[test]
fn extends_cycle_is_an_error() {
    let e = err("[profile.a]\nextends = \"b\"\n[profile.b]\nextends = \"a\"\n");
    assert!(e.message.contains("cycle"), "{e}");
}

#[test]
fn protect_lists_replace_the_inherited_one_and_can_be_emptied() {
    let c = Config::parse(
        "[profile.a]\nextends = \"code\"\n[profile.a.filesystem]\nprotect = [\".git/hooks/\", \"~/.bashrc\", \"secrets.env\"]\n\
         [profile.off]\nextends = \"code\"\n[profile.off.filesystem]\nprotect = []\n",
        None,
    )
    .unwrap();
    let a = c.profile("a").unwrap();
    let names: Vec<String> = a.filesystem.protect.iter().map(|e| e.to_string()).collect();
    assert_eq!(names, [".git/hooks", "~/.bashrc", "secrets.env"]);
    assert!(c.profile("off").unwrap().filesystem.protect.is_empty());
    assert!(c
        .profile("code")
        .unwrap()
        .filesystem
        .protect
        .iter()
        .any(|e| e.path() == ".git/hooks"));
    let e = err("[profile.a.filesystem]\nprotect = [\n  \".mcp.json\",\n  \"../escape\",\n]\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(4), "profile.a.filesystem.protect")
    );
    assert!(e.message.contains("relative path"), "{}", e.message);
}

#[test]
fn browser_origins_and_hosts_are_checked_when_read() {
    let c = Config::parse(
        "[server]\nallowed_origins = [\"https://App.example.com/\", \"http://127.0.0.1:3000\"]\n\
         allowed_hosts = [\"corral.internal\", \"corral.internal:8443\", \"[::1]:9\"]\n",
        None,
    )
    .unwrap();
    let s = c.server;
    assert_eq!(
        s.allowed_origins,
        ["https://app.example.com", "http://127.0.0.1:3000"]
    );
    assert_eq!(s.allowed_hosts.len(), 3);
    for bad in [
        "*",
        "app.example.com",
        "https://a.example/path",
        "ftp://x",
        "https://",
    ] {
        let e = err(&format!("[server]\nallowed_origins = [\"{bad}\"]\n"));
        assert_eq!(e.key, "server.allowed_origins", "{bad}");
    }
    for bad in ["http://x", "a/b", "x:0", "x:99999", ""] {
        let e = err(&format!("[server]\nallowed_hosts = [\"{bad}\"]\n"));
        assert_eq!(e.key, "server.allowed_hosts", "{bad}");
    }
}

#[test]
fn timeout_and_output_kill_can_be_switched_off_also_when_inherited() {
    let c = Config::parse(
        "[profile.a]\nextends = \"code\"\n[profile.a.limits]\ntimeout_secs = \"none\"\noutput_kill = \"none\"\n",
        None,
    )
    .unwrap();
    let l = &c.profile("a").unwrap().limits;
    assert_eq!(l.timeout_secs, None);
    assert_eq!(l.output_kill_bytes, None);
    assert_eq!(l.check(), Ok(()));
    // The rest is still inherited, and `code` itself keeps its values.
    assert_eq!(l.memory_bytes, Some(ByteSize(1 << 30)));
    let code = &c.profile("code").unwrap().limits;
    assert_eq!(code.timeout_secs, Some(300));
    assert_eq!(code.output_kill_bytes, Some(ByteSize(64 << 20)));
    // A profile extending one without limits can set them again.
    let c = Config::parse(
        "[profile.a]\nextends = \"code\"\n[profile.a.limits]\ntimeout_secs = \"none\"\noutput_kill = \"none\"\n[profile.b]\nextends = \"a\"\n[profile.b.limits]\ntimeout_secs = 7\noutput_kill = \"2MiB\"\n",
        None,
    )
    .unwrap();
    let l = &c.profile("b").unwrap().limits;
    assert_eq!(l.timeout_secs, Some(7));
    assert_eq!(l.output_kill_bytes, Some(ByteSize(2 << 20)));
}

#[test]
fn a_word_other_than_none_is_refused_naming_the_choices() {
    let e = err("[profile.a.limits]\ntimeout_secs = \"off\"\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(2), "profile.a.limits.timeout_secs")
    );
    assert!(e.message.contains("`off` is not a value"), "{e}");
    assert!(e.message.contains("\"none\" for no limit"), "{e}");
    let e = err("[profile.a.limits]\noutput_kill = \"off\"\n");
    assert_eq!(e.key, "profile.a.limits.output_kill");
    // Limits that cannot be off take no "none".
    let e = err("[profile.a.limits]\npids = \"none\"\n");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("expected a whole number"), "{e}");
    let e = err("[profile.a.limits]\nmemory = \"none\"\n");
    assert_eq!(e.key.as_str(), "profile.a.limits.memory", "{e}");
}

/// Configs that exercise every way a profile reaches a built-in one: by
/// name, by overriding it, by extending it (itself, another, through a
/// chain, through an override), and from `[server]`; and configs that are
/// refused, also for a profile other than the one a run asks for.
fn wanted_cases() -> Vec<String> {
    let token = "a".repeat(64);
    vec![
        String::new(),
        "[profile.bench]\nextends = \"code\"\n[profile.bench.commands]\nallow = [\"true\"]\n".into(),
        "[profile.code]\nhostname = \"mine\"\n".into(),
        "[profile.code]\nextends = \"code\"\nhostname = \"self\"\n".into(),
        "[profile.code]\nextends = \"build\"\n".into(),
        "[profile.a]\nextends = \"code\"\n[profile.code]\nhostname = \"over\"\n".into(),
        "[profile.z]\nextends = \"y\"\n[profile.y]\nextends = \"install\"\nhostname = \"y\"\n".into(),
        "[profile.a]\nextends = \"mcp-node\"\n[profile.b]\nextends = \"mcp-node\"\nhostname = \"b\"\n".into(),
        "[profile.fresh]\nhostname = \"fresh\"\n".into(),
        format!(
            "[[server.tenant]]\nname = \"t\"\ntoken_sha256 = \"{token}\"\nprofiles = [\"install\", \"code\"]\n\
             [[server.mcp_server]]\nname = \"s\"\nruntime = \"node\"\ndir = \"/srv/s\"\nentry = \"i.js\"\n\
             profile = \"mcp-node\"\ntenants = [\"t\"]\n"
        ),
        "[deploy]\nmax_tree_bytes = \"300MiB\"\n".into(),
        // Refused: an unknown base, a cycle, a bad profile next to a good
        // one, a tenant naming no profile.
        "[profile.a]\nextends = \"nope\"\n".into(),
        "[profile.a]\nextends = \"b\"\n[profile.b]\nextends = \"a\"\n".into(),
        "[profile.a]\nextends = \"code\"\n[profile.b]\nhostname = \"bad host\"\n".into(),
        format!(
            "[[server.tenant]]\nname = \"t\"\ntoken_sha256 = \"{token}\"\nprofiles = [\"nope\"]\n"
        ),
        "[[server.mcp_server]]\nname = \"s\"\nruntime = \"node\"\ndir = \"/srv/s\"\nentry = \"i.js\"\n\
         profile = \"nope\"\n"
            .into(),
    ]
}

#[test]
fn building_only_the_wanted_profiles_resolves_them_as_building_all_does() {
    let file = Some(Path::new("corral.toml"));
    let mut refused = 0;
    for text in wanted_cases() {
        let full = Config::parse(&text, file);
        let mut names: Vec<String> = match &full {
            Ok(c) => c.profiles.keys().cloned().collect(),
            Err(_) => vec![],
        };
        names.extend(["code", "build", "nope"].map(String::from));
        for name in &names {
            let lean = Config::parse_wanted(&text, file, &[name.as_str()]);
            let (full, lean) = match (&full, lean) {
                (Ok(f), Ok(l)) => (f, l),
                (Err(f), Err(l)) => {
                    assert_eq!(f, &l, "{text}: the same error for {name}");
                    refused += 1;
                    continue;
                }
                (f, l) => panic!("{text}: wanting {name}: all gives {f:?}, lean gives {l:?}"),
            };
            assert_eq!(
                full.profile(name).map_err(|e| e.to_string()),
                lean.profile(name).map_err(|e| e.to_string()),
                "{text}: profile {name}"
            );
            for (n, p) in &lean.profiles {
                assert_eq!(
                    Some(p),
                    full.profiles.get(n),
                    "{text}: {n} as when all are built"
                );
            }
            for n in full.profiles.keys() {
                assert_eq!(full.has_profile(n), lean.has_profile(n), "{text}: {n}");
            }
            assert!(!lean.has_profile("nope"));
            assert_eq!(full.server, lean.server, "{text}");
            assert_eq!(full.deploy, lean.deploy, "{text}");
        }
    }
    assert_eq!(
        refused,
        5 * 3,
        "the five refused cases, and only they, were refused"
    );
}

#[test]
fn only_the_wanted_built_in_profiles_are_built() {
    let c = Config::load_wanted(None, &["code"]).unwrap();
    assert_eq!(c.profiles.keys().collect::<Vec<_>>(), ["code"]);
    assert_eq!(c.profiles["code"], crate::builtin::code());
    let e = c.profile("build").unwrap_err().to_string();
    assert!(
        e.contains("unknown profile `build`"),
        "a lean config is for the wanted profiles only: {e}"
    );
    let all = Config::default();
    for name in crate::builtin::NAMES {
        let c = Config::load_wanted(None, &[name]).unwrap();
        assert_eq!(c.profile(name).unwrap(), all.profile(name).unwrap());
        assert_eq!(
            c.profile("nope").unwrap_err(),
            all.profile("nope").unwrap_err(),
            "the unknown-profile error lists every profile, built or not"
        );
    }
    // A file profile extending a built-in one: only the file's profile is
    // kept; the built-in base was built to derive it.
    let text = "[profile.bench]\nextends = \"code\"\n";
    let c = Config::parse_wanted(text, None, &["bench"]).unwrap();
    assert_eq!(c.profiles.keys().collect::<Vec<_>>(), ["bench"]);
    assert_eq!(
        c.profile("bench").unwrap().commands.allow,
        ["python3", "node", "sh", "bash"]
    );
    // Overriding a built-in profile replaces it in both ways of loading.
    let text = "[profile.code]\nhostname = \"mine\"\n";
    for c in [
        Config::parse(text, None).unwrap(),
        Config::parse_wanted(text, None, &["code"]).unwrap(),
    ] {
        assert_eq!(c.profile("code").unwrap().hostname, "mine");
    }
    let dir = std::env::temp_dir().join(format!("corral-wanted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(&path, "[profile.x]\nextends = \"install\"\n").unwrap();
    let lean = Config::load_wanted(Some(&path), &["x"]);
    let full = Config::load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        lean.unwrap().profile("x").unwrap(),
        full.unwrap().profile("x").unwrap()
    );
    let missing = dir.join("gone.toml");
    assert_eq!(
        Config::load_wanted(Some(&missing), &["x"]).unwrap_err(),
        Config::load(&missing).unwrap_err()
    );
}

#[test]
fn what_each_way_of_reaching_a_built_in_profile_resolves_to() {
    let b = crate::builtin::by_name;
    for wanted in [None, Some(["a", "code", "z", "fresh"].as_slice())] {
        let parse = |text: &str| match wanted {
            None => Config::parse(text, None).unwrap(),
            Some(names) => Config::parse_wanted(text, None, names).unwrap(),
        };
        // Extending a built-in profile that the file overrides gets the
        // file's version.
        let c = parse("[profile.a]\nextends = \"code\"\n[profile.code]\nhostname = \"over\"\n");
        assert_eq!(c.profile("a").unwrap().hostname, "over");
        assert_eq!(c.profile("code").unwrap().hostname, "over");
        // Extending itself or naming itself starts from the built-in one.
        for text in [
            "[profile.code]\nextends = \"code\"\nhostname = \"h\"\n",
            "[profile.code]\nhostname = \"h\"\n",
        ] {
            let mut want = b("code").unwrap();
            want.hostname = "h".into();
            assert_eq!(parse(text).profile("code").unwrap(), &want, "{text}");
        }
        // Extending another built-in profile takes all of it but the name.
        let mut want = b("build").unwrap();
        want.name = "code".into();
        let c = parse("[profile.code]\nextends = \"build\"\n");
        assert_eq!(c.profile("code").unwrap(), &want);
        // Through a chain of file profiles.
        let c = parse(
            "[profile.z]\nextends = \"y\"\n[profile.y]\nextends = \"install\"\nhostname = \"y\"\n",
        );
        let mut want = b("install").unwrap();
        want.name = "z".into();
        want.hostname = "y".into();
        assert_eq!(c.profile("z").unwrap(), &want);
        // A new name without `extends` starts from the bare base.
        let c = parse("[profile.fresh]\nhostname = \"f\"\n");
        let mut want = crate::builtin::base("fresh");
        want.hostname = "f".into();
        assert_eq!(c.profile("fresh").unwrap(), &want);
    }
}

#[test]
fn reserved_destinations_are_the_root_proc_dev_tmp_below_them_and_workspace() {
    use crate::path::SandboxPath;
    for (p, reserved) in [
        ("/", true),
        ("/proc", true),
        ("/proc/self", true),
        ("/procfs", false),
        ("/dev", true),
        ("/dev/shm", true),
        ("/devices", false),
        ("/tmp", true),
        ("/tmp/x/y", true),
        ("/tmpx", false),
        ("/var/tmp", false),
        ("/workspace", true),
        ("/workspace/x", false),
        ("/usr", false),
    ] {
        let path = SandboxPath::new(p).unwrap();
        assert_eq!(reserved_destination(&path).is_some(), reserved, "{p}");
        let below_reserved = ["/proc", "/dev", "/tmp"]
            .iter()
            .any(|r| path.starts_with(&SandboxPath::new(r).unwrap()));
        if !path.is_root() && p != "/workspace" {
            assert_eq!(
                below_reserved, reserved,
                "{p}: as SandboxPath::starts_with says"
            );
        }
    }
}
