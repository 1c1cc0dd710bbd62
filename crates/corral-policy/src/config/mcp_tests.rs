//! `[[server.mcp_server]]`: defaults, every rule, and the key and line of
//! each error.

use std::path::{Path, PathBuf};

use super::*;
use crate::mcp_server::{
    LogLimits, McpRuntime, McpServer, ProcessMode, RestartPolicy, StartPolicy, ToolFilter,
};
use crate::size::ByteSize;

/// Two tenants, `acme` and `beta` (lines 1 to 9).
fn tenants() -> String {
    format!(
        "[[server.tenant]]\nname = \"acme\"\ntoken_sha256 = \"{}\"\nprofiles = [\"code\"]\n\n\
         [[server.tenant]]\nname = \"beta\"\ntoken_sha256 = \"{}\"\nprofiles = [\"code\"]\n",
        "a".repeat(64),
        "b".repeat(64)
    )
}

/// A minimal python3 server, then `extra` lines inside its table.
fn server(extra: &str) -> String {
    format!(
        "\n[[server.mcp_server]]\nname = \"weather\"\nruntime = \"python3\"\n\
         dir = \"/srv/mcp/weather\"\nentry = \"server.py\"\n{extra}"
    )
}

/// The same with the tenants before it and `tenants = ["acme"]`.
fn tenant_server(extra: &str) -> String {
    format!(
        "{}{}",
        tenants(),
        server(&format!("tenants = [\"acme\"]\n{extra}"))
    )
}

fn parse(text: &str) -> Vec<McpServer> {
    match Config::parse(text, None) {
        Ok(c) => c.server.mcp_servers,
        Err(e) => panic!("{e}\n--- config:\n{text}"),
    }
}

fn one(text: &str) -> McpServer {
    let mut list = parse(text);
    assert_eq!(list.len(), 1, "{list:?}");
    list.remove(0)
}

fn err(text: &str) -> ConfigError {
    match Config::parse(text, Some(Path::new("corral.toml"))) {
        Ok(c) => panic!("accepted: {:?}\n--- config:\n{text}", c.server.mcp_servers),
        Err(e) => e,
    }
}

/// The 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in {text}"));
    text[..at].matches('\n').count() + 1
}

/// Asserts that `text` fails on the line holding `needle`, with `key`, and
/// returns the message.
fn fails_at(text: &str, needle: &str, key: &str) -> String {
    let e = err(text);
    assert_eq!(
        (e.line, e.key.as_str()),
        (Some(line_of(text, needle)), key),
        "{e}\n--- config:\n{text}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "corral.toml: line {}: {key}: ",
            line_of(text, needle)
        )),
        "{e}"
    );
    e.message
}

#[test]
fn defaults_are_exactly_mcp_server_new() {
    let s = one(&server(""));
    let expected = McpServer::new(
        "weather",
        McpRuntime::Python3,
        PathBuf::from("/srv/mcp/weather"),
        "server.py",
    );
    assert_eq!(s, expected);
    // Spelled out, so that a change of `new` is noticed here too.
    assert!(s.tenants.is_empty());
    assert_eq!(s.profile, "mcp-python");
    assert_eq!(s.mode, ProcessMode::PerTenant);
    assert_eq!(s.start, StartPolicy::OnDemand);
    assert_eq!(s.tools, ToolFilter::All);
    assert_eq!(s.idle_stop_secs, Some(600));
    assert_eq!((s.startup_timeout_secs, s.request_timeout_secs), (30, 60));
    assert_eq!(
        (
            s.max_processes,
            s.max_processes_per_tenant,
            s.max_sessions,
            s.max_sessions_per_tenant
        ),
        (16, 4, 256, 64)
    );
    assert_eq!(s.max_message_bytes, ByteSize(16 << 20));
    assert_eq!(s.restart, RestartPolicy::default());
    assert_eq!(s.log, LogLimits::default());
    assert!(!s.audit_arguments);
    // No entry at all: no servers.
    assert!(Config::parse("[server]\n", None)
        .unwrap()
        .server
        .mcp_servers
        .is_empty());
}

#[test]
fn default_profile_follows_the_runtime() {
    for (runtime, entry, profile) in [
        ("python3", "server.py", "mcp-python"),
        ("node", "index.js", "mcp-node"),
        ("npx", "@modelcontextprotocol/server-memory", "mcp-node"),
        ("uvx", "mcp-server-time", "mcp-python"),
    ] {
        let s = one(&format!(
            "[[server.mcp_server]]\nname = \"s\"\nruntime = \"{runtime}\"\ndir = \"/srv/s\"\nentry = \"{entry}\"\n"
        ));
        assert_eq!(s.runtime.as_str(), runtime);
        assert_eq!(s.profile, profile, "{runtime}");
        assert_eq!(s.entry, entry);
    }
}

#[test]
fn every_key_is_read() {
    let text = format!(
        "[profile.weather]\nextends = \"mcp-python\"\n{}{}",
        tenants(),
        server(
            "tenants = [\"beta\", \"acme\"]\nargs = [\"--units\", \"metric\"]\nenv = [\"WEATHER_API_KEY\", \"REGION\"]\n\
             profile = \"weather\"\nmode = \"per-session\"\nstart = \"boot\"\nidle_stop_secs = 0\n\
             startup_timeout_secs = 5\nrequest_timeout_secs = 7\nmax_processes = 8\nmax_processes_per_tenant = 2\n\
             max_sessions = 100\nmax_sessions_per_tenant = 10\nmax_message_bytes = \"2MiB\"\naudit_arguments = true\n\
             [server.mcp_server.env_values]\nWEATHER_API_KEY = \"k-123\"\n\
             [server.mcp_server.tools]\nomit = [\"delete_city\"]\n\
             [server.mcp_server.restart]\nmax_restarts = 0\nwindow_secs = 10\nbackoff_initial_ms = 50\nbackoff_max_ms = 50\nstable_after_secs = 5\n\
             [server.mcp_server.log]\nlines_per_second = 1\nline_max_bytes = 64\nsummary_secs = 2\n"
        )
    );
    let s = one(&text);
    assert_eq!(s.tenants, ["beta", "acme"]);
    assert_eq!(s.args, ["--units", "metric"]);
    assert_eq!(s.env, ["WEATHER_API_KEY", "REGION"]);
    assert_eq!(s.env_values.len(), 1);
    assert_eq!(s.env_values["WEATHER_API_KEY"], "k-123");
    assert_eq!(s.profile, "weather");
    assert_eq!(s.mode, ProcessMode::PerSession);
    assert_eq!(s.start, StartPolicy::Boot);
    assert_eq!(s.idle_stop_secs, None, "0 means never");
    assert_eq!((s.startup_timeout_secs, s.request_timeout_secs), (5, 7));
    assert_eq!(
        (
            s.max_processes,
            s.max_processes_per_tenant,
            s.max_sessions,
            s.max_sessions_per_tenant
        ),
        (8, 2, 100, 10)
    );
    assert_eq!(s.max_message_bytes, ByteSize(2 << 20));
    assert!(s.audit_arguments);
    assert_eq!(s.tools, ToolFilter::Omit(vec!["delete_city".into()]));
    assert_eq!(
        s.restart,
        RestartPolicy {
            max_restarts: 0,
            window_secs: 10,
            backoff_initial_ms: 50,
            backoff_max_ms: 50,
            stable_after_secs: 5
        }
    );
    assert_eq!(
        s.log,
        LogLimits {
            lines_per_second: 1,
            line_max_bytes: 64,
            summary_secs: 2
        }
    );
    // Serialised (as `corral check` or an API might), the values stay out.
    let json = serde_json::to_string(&s).unwrap();
    assert!(!json.contains("k-123"), "{json}");
    assert!(json.contains("WEATHER_API_KEY"), "{json}");
}

#[test]
fn restart_and_log_keep_defaults_for_what_they_do_not_give() {
    let s = one(&server(
        "[server.mcp_server.restart]\nmax_restarts = 9\n[server.mcp_server.log]\nsummary_secs = 5\n",
    ));
    assert_eq!(
        s.restart,
        RestartPolicy {
            max_restarts: 9,
            ..RestartPolicy::default()
        }
    );
    assert_eq!(
        s.log,
        LogLimits {
            summary_secs: 5,
            ..LogLimits::default()
        }
    );
}

#[test]
fn servers_keep_config_order_and_may_come_before_the_tenants() {
    let text = format!(
        "[[server.mcp_server]]\nname = \"b\"\ntenants = [\"acme\"]\nruntime = \"node\"\ndir = \"/srv/b\"\nentry = \"i.js\"\n\
         [[server.mcp_server]]\nname = \"a\"\ntenants = [\"beta\"]\nruntime = \"node\"\ndir = \"/srv/a\"\nentry = \"i.js\"\n{}",
        tenants()
    );
    let names: Vec<String> = parse(&text).into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["b", "a"]);
}

#[test]
fn names_are_lower_case_url_segments_and_unique() {
    for good in ["weather", "w", "0x", "a_b-c", &"a".repeat(63)] {
        let text = server("").replace("\"weather\"", &format!("\"{good}\""));
        assert_eq!(one(&text).name, good);
    }
    for bad in [
        "",
        "Weather",
        "-x",
        "_x",
        "a.b",
        "a/b",
        "a b",
        "é",
        &"a".repeat(64),
    ] {
        let text = server("").replace("\"weather\"", &format!("\"{bad}\""));
        let m = fails_at(&text, "name =", "server.mcp_server.name");
        assert!(m.contains("lower-case letters"), "{m}");
    }
    let text = format!("{}{}", server(""), server(""));
    let second = text.rfind("name = ").unwrap();
    let e = err(&text);
    assert_eq!(e.key, "server.mcp_server.name");
    assert_eq!(
        e.line,
        Some(text[..second].matches('\n').count() + 1),
        "{e}"
    );
    assert!(e.message.contains("`weather` is defined twice"), "{e}");
}

#[test]
fn required_keys_and_unknown_keys_are_errors() {
    for key in ["name", "runtime", "dir"] {
        let text: String = server("")
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = err(&text);
        assert!(e.message.contains(&format!("missing field `{key}`")), "{e}");
        assert_eq!(e.line, Some(2), "{e}");
    }
    // `entry` is required by every runtime but "deployed", which must not
    // have one.
    let text: String = server("")
        .lines()
        .filter(|l| !l.starts_with("entry ="))
        .map(|l| format!("{l}\n"))
        .collect();
    let e = err(&text);
    assert!(
        e.message.contains("runtime python3 needs an `entry`"),
        "{e}"
    );
    assert_eq!(e.key, "server.mcp_server.entry", "{e}");
    let deployed = text.replace("\"python3\"", "\"deployed\"");
    let c = Config::parse(&deployed, None).unwrap();
    let s = &c.server.mcp_servers[0];
    assert_eq!(
        (s.runtime, s.entry.as_str(), s.profile.as_str()),
        (McpRuntime::Deployed, "", "")
    );
    let e = err(&server("").replace("\"python3\"", "\"deployed\""));
    assert!(e.message.contains("remove `entry`"), "{e}");
    let e = err(&server("source = \"/src/x\"\n"));
    assert!(
        e.message.contains("`source` is for runtime \"deployed\""),
        "{e}"
    );
    let e = err(&deployed.replace("dir =", "source = \"src\"\ndir ="));
    assert!(e.message.contains("not an absolute path"), "{e}");
    package_entries(&deployed);
    let text = server("bogus = 1\n");
    let e = err(&text);
    assert_eq!(e.line, Some(line_of(&text, "bogus")), "{e}");
    assert!(e.message.contains("unknown field `bogus`"), "{e}");
    for table in ["tools", "restart", "log"] {
        let text = server(&format!("[server.mcp_server.{table}]\nbogus = 1\n"));
        let e = err(&text);
        assert_eq!(e.line, Some(line_of(&text, "bogus")), "{e}");
        assert!(e.key.ends_with(&format!("{table}.bogus")), "{e}");
    }
}

#[test]
fn the_runtime_is_one_of_four() {
    for bad in ["bash", "python", "Node", "sh -c", ""] {
        let text = server("").replace("\"python3\"", &format!("\"{bad}\""));
        let m = fails_at(&text, "runtime =", "server.mcp_server.runtime");
        assert!(
            m.contains("\"python3\", \"node\", \"npx\", \"uvx\" or \"deployed\""),
            "{m}"
        );
    }
}

#[test]
fn dir_is_absolute_without_dot_dot_and_not_the_root() {
    for (bad, why) in [
        ("srv/mcp", "not an absolute path"),
        ("", "not an absolute path"),
        ("/srv/../etc", "`..`"),
        ("/srv/mcp/..", "`..`"),
        ("/", "is the root"),
        ("//", "is the root"),
        ("/srv/a\\tb", "control character"),
    ] {
        let text = server("").replace("\"/srv/mcp/weather\"", &format!("\"{bad}\""));
        let m = fails_at(&text, "dir =", "server.mcp_server.dir");
        assert!(m.contains(why), "{bad}: {m}");
    }
    let text = server("").replace("\"/srv/mcp/weather\"", "\"/srv//mcp/./weather/\"");
    assert_eq!(one(&text).dir, Path::new("/srv/mcp/weather"));
}

#[test]
fn an_absolute_entry_is_refused_for_python3_and_node() {
    for runtime in ["python3", "node"] {
        for bad in ["/bin/bash", "/srv/mcp/weather/server.py"] {
            let text = server("")
                .replace("\"python3\"", &format!("\"{runtime}\""))
                .replace("\"server.py\"", &format!("\"{bad}\""));
            let m = fails_at(&text, "entry =", "server.mcp_server.entry");
            assert!(m.contains("is an absolute path"), "{m}");
            assert!(m.contains("relative to dir"), "{m}");
        }
    }
}

#[test]
fn an_entry_cannot_climb_out_of_dir() {
    for bad in ["../other/server.py", "src/../../x.py", "..", "src/.."] {
        let text = server("").replace("\"server.py\"", &format!("\"{bad}\""));
        let m = fails_at(&text, "entry =", "server.mcp_server.entry");
        assert!(m.contains("`..`"), "{bad}: {m}");
    }
    for bad in ["", ".", "./", "src/"] {
        let text = server("").replace("\"server.py\"", &format!("\"{bad}\""));
        let m = fails_at(&text, "entry =", "server.mcp_server.entry");
        assert!(m.contains("names no file"), "{bad}: {m}");
    }
    for good in ["src/server.py", "./server.py", "app.mjs"] {
        let text = server("").replace("\"server.py\"", &format!("\"{good}\""));
        assert_eq!(one(&text).entry, good);
    }
}

#[test]
fn npx_entries_follow_npm_name_rules() {
    let npx = |entry: &str| {
        server("")
            .replace("\"python3\"", "\"npx\"")
            .replace("\"server.py\"", &format!("\"{entry}\""))
    };
    for good in [
        "pkg",
        "@scope/pkg",
        "@modelcontextprotocol/server-filesystem",
        "a-b.c_d",
        "0x",
        &"a".repeat(214),
    ] {
        assert_eq!(one(&npx(good)).entry, good);
    }
    for (bad, why) in [
        ("", "empty"),
        ("Pkg", "lower-case"),
        ("@Scope/pkg", "lower-case"),
        ("@scope", "`@scope/pkg`"),
        ("@/pkg", "empty"),
        ("@scope/", "empty"),
        (".hidden", "start with `.` or `_`"),
        ("_private", "start with `.` or `_`"),
        ("@scope/../x", "start with `.` or `_`"),
        ("..", "start with `.` or `_`"),
        ("a/b", "lower-case letters, digits"),
        ("/bin/bash", "lower-case letters, digits"),
        ("a b", "lower-case letters, digits"),
        ("pkg~1", "lower-case letters, digits"),
        (" pkg", "spaces"),
        ("node_modules", "reserved"),
        ("favicon.ico", "reserved"),
        (&"a".repeat(215), "214"),
    ] {
        let text = npx(bad);
        let m = fails_at(&text, "entry =", "server.mcp_server.entry");
        assert!(m.contains("is not an npm package name"), "{bad}: {m}");
        assert!(m.contains(why), "{bad}: {m}");
    }
}

#[test]
fn uvx_entries_are_console_script_names() {
    let uvx = |entry: &str| {
        server("")
            .replace("\"python3\"", "\"uvx\"")
            .replace("\"server.py\"", &format!("\"{entry}\""))
    };
    for good in ["mcp-server-time", "Tool_2.x", "a"] {
        assert_eq!(one(&uvx(good)).entry, good);
    }
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "/usr/bin/python3",
        "a b",
        "x;y",
    ] {
        let m = fails_at(&uvx(bad), "entry =", "server.mcp_server.entry");
        assert!(m.contains("is not a console script name"), "{bad}: {m}");
    }
}

#[test]
fn denied_arguments_name_the_stable_code_and_their_line() {
    for bad in [
        "$(id)",
        "../etc/passwd",
        "a;b",
        "`id`",
        "x|y",
        "--root=../x",
    ] {
        let text = server(&format!("args = [\n  \"--ok\",\n  {bad:?},\n]\n"));
        let m = fails_at(&text, &format!("{bad:?}"), "server.mcp_server.args");
        assert!(m.contains("command.args_denied"), "{m}");
        assert!(m.contains(&format!("{bad:?}")), "{m}");
    }
    let text = server("args = [\"a\\nb\"]\n");
    let m = fails_at(&text, "args =", "server.mcp_server.args");
    assert!(m.contains("control character"), "{m}");
}

#[test]
fn blocked_env_keys_are_refused_even_when_declared() {
    for (name, rule, why) in [
        ("LD_PRELOAD", "LD_*", "dynamic loader"),
        ("ld_preload", "LD_*", "dynamic loader"),
        ("NODE_OPTIONS", "NODE_OPTIONS", "--require"),
        ("PYTHONPATH", "PYTHONPATH", "module search path"),
        ("BASH_ENV", "BASH_ENV", "bash sources"),
        ("GLIBC_TUNABLES", "GLIBC_TUNABLES", "CVE-2023-4911"),
    ] {
        let text = server(&format!("env = [\n  \"OK\",\n  \"{name}\",\n]\n"));
        let m = fails_at(&text, &format!("\"{name}\""), "server.mcp_server.env");
        assert!(m.contains("env.blocked"), "{m}");
        assert!(m.contains(&format!("rule `{rule}`")), "{m}");
        assert!(m.contains(why), "{m}");
        assert!(m.contains("even when declared"), "{m}");
    }
}

#[test]
fn env_keys_the_runtime_sets_cannot_be_declared() {
    for name in ["PATH", "HOME", "TMPDIR", "SHELL", "ZDOTDIR", "PWD", "USER"] {
        let text = server(&format!("env = [\"{name}\"]\n"));
        let m = fails_at(&text, "env =", "server.mcp_server.env");
        assert!(m.contains("env.blocked"), "{m}");
        assert!(m.contains("the runtime sets it"), "{m}");
    }
}

#[test]
fn env_keys_are_well_formed_and_declared_once() {
    let text = server("env = [\"A\",\n  \"A\"]\n");
    let m = fails_at(&text, "  \"A\"]", "server.mcp_server.env");
    assert!(m.contains("declared twice"), "{m}");
    for bad in ["", "A=B"] {
        let text = server(&format!("env = [\"{bad}\"]\n"));
        let m = fails_at(&text, "env =", "server.mcp_server.env");
        assert!(m.contains("is invalid"), "{m}");
    }
}

#[test]
fn env_values_need_a_declared_key_and_are_never_printed() {
    let text = server(
        "env = [\"DECLARED\"]\n[server.mcp_server.env_values]\nDECLARED = \"fine\"\nOTHER = \"s3cr3t-value\"\n",
    );
    let m = fails_at(&text, "OTHER", "server.mcp_server.env_values");
    assert!(m.contains("`OTHER`"), "{m}");
    assert!(m.contains("declare it in env"), "{m}");
    assert!(!m.contains("s3cr3t"), "{m}");
    let text = server("env = [\"K\"]\n[server.mcp_server.env_values]\nK = \"s3cr3t\\u0000tail\"\n");
    let m = fails_at(&text, "K = ", "server.mcp_server.env_values");
    assert!(m.contains("NUL"), "{m}");
    assert!(!m.contains("s3cr3t"), "{m}");
    // A declared key without a value is fine: it comes from corral's own
    // environment at spawn.
    let s = one(&server("env = [\"K\"]\n"));
    assert_eq!(s.env, ["K"]);
    assert!(s.env_values.is_empty());
}

#[test]
fn tenants_are_required_when_the_server_has_tenants() {
    let text = format!("{}{}", tenants(), server(""));
    let m = fails_at(&text, "[[server.mcp_server]]", "server.mcp_server.tenants");
    assert!(m.contains("known: acme, beta"), "{m}");
    let text = format!("{}{}", tenants(), server("tenants = []\n"));
    let m = fails_at(&text, "tenants = []", "server.mcp_server.tenants");
    assert!(m.contains("list the tenants"), "{m}");
    assert_eq!(one(&tenant_server("")).tenants, ["acme"]);
}

#[test]
fn tenants_must_be_known_and_listed_once() {
    let text = format!(
        "{}{}",
        tenants(),
        server("tenants = [\"acme\",\n  \"nobody\"]\n")
    );
    let m = fails_at(&text, "\"nobody\"", "server.mcp_server.tenants");
    assert!(m.contains("unknown tenant `nobody`"), "{m}");
    let text = format!(
        "{}{}",
        tenants(),
        server("tenants = [\"acme\",\n  \"acme\"]\n")
    );
    let m = fails_at(&text, "  \"acme\"]", "server.mcp_server.tenants");
    assert!(m.contains("listed twice"), "{m}");
}

#[test]
fn a_server_without_tenants_lists_none() {
    let text = server("tenants = [\"acme\"]\n");
    let m = fails_at(&text, "tenants =", "server.mcp_server.tenants");
    assert!(m.contains("no [[server.tenant]]"), "{m}");
    assert!(one(&server("tenants = []\n")).tenants.is_empty());
}

#[test]
fn the_profile_must_exist() {
    let text = server("profile = \"nope\"\n");
    let m = fails_at(&text, "profile =", "server.mcp_server.profile");
    assert!(m.contains("unknown profile `nope`"), "{m}");
    assert!(m.contains("mcp-python"), "lists the known ones: {m}");
    assert_eq!(one(&server("profile = \"mcp-node\"\n")).profile, "mcp-node");
    let text = format!(
        "{}[profile.mine]\nextends = \"mcp-python\"\n",
        server("profile = \"mine\"\n")
    );
    assert_eq!(one(&text).profile, "mine");
}

#[test]
fn mode_and_start_take_their_words_only() {
    for (word, mode) in [
        ("shared", ProcessMode::Shared),
        ("per-tenant", ProcessMode::PerTenant),
        ("per-session", ProcessMode::PerSession),
    ] {
        assert_eq!(one(&server(&format!("mode = \"{word}\"\n"))).mode, mode);
    }
    let m = fails_at(
        &server("mode = \"per_tenant\"\n"),
        "mode =",
        "server.mcp_server.mode",
    );
    assert!(
        m.contains("\"shared\", \"per-tenant\" or \"per-session\""),
        "{m}"
    );
    for (word, start) in [
        ("on-demand", StartPolicy::OnDemand),
        ("boot", StartPolicy::Boot),
    ] {
        assert_eq!(one(&server(&format!("start = \"{word}\"\n"))).start, start);
    }
    let m = fails_at(
        &server("start = \"eager\"\n"),
        "start =",
        "server.mcp_server.start",
    );
    assert!(m.contains("\"on-demand\" or \"boot\""), "{m}");
}

#[test]
fn timeouts_and_caps_are_at_least_one() {
    for key in [
        "startup_timeout_secs",
        "request_timeout_secs",
        "max_processes",
        "max_processes_per_tenant",
        "max_sessions",
        "max_sessions_per_tenant",
    ] {
        let text = server(&format!("{key} = 0\n"));
        let m = fails_at(
            &text,
            &format!("{key} ="),
            &format!("server.mcp_server.{key}"),
        );
        assert!(m.contains("1"), "{m}");
    }
    for key in [
        "idle_stop_secs",
        "startup_timeout_secs",
        "request_timeout_secs",
    ] {
        let text = server(&format!("{key} = 31536001\n"));
        let m = fails_at(
            &text,
            &format!("{key} ="),
            &format!("server.mcp_server.{key}"),
        );
        assert!(m.contains("too large"), "{m}");
    }
    assert_eq!(
        one(&server("idle_stop_secs = 31536000\n")).idle_stop_secs,
        Some(31_536_000)
    );
    let e = err(&server("max_sessions = -1\n"));
    assert_eq!(e.line, Some(7), "{e}");
}

#[test]
fn max_message_bytes_is_a_size_from_1kib_to_1gib() {
    for (good, bytes) in [("\"1KiB\"", 1 << 10), ("\"1GiB\"", 1 << 30), ("4096", 4096)] {
        let s = one(&server(&format!("max_message_bytes = {good}\n")));
        assert_eq!(s.max_message_bytes, ByteSize(bytes));
    }
    for (bad, why) in [
        ("1023", "too small"),
        ("\"1025MiB\"", "too large"),
        ("\"lots\"", "invalid size"),
    ] {
        let text = server(&format!("max_message_bytes = {bad}\n"));
        let m = fails_at(
            &text,
            "max_message_bytes",
            "server.mcp_server.max_message_bytes",
        );
        assert!(m.contains(why), "{m}");
    }
}

#[test]
fn tools_pick_or_omit() {
    let s = one(&server(
        "[server.mcp_server.tools]\npick = [\"forecast\", \"now\"]\n",
    ));
    assert_eq!(
        s.tools,
        ToolFilter::Pick(vec!["forecast".into(), "now".into()])
    );
    assert!(s.tools.allows("now") && !s.tools.allows("delete_city"));
    let s = one(&server(
        "[server.mcp_server.tools]\nomit = [\"delete_city\"]\n",
    ));
    assert!(!s.tools.allows("delete_city") && s.tools.allows("now"));
    let s = one(&server("[server.mcp_server.tools]\n"));
    assert_eq!(s.tools, ToolFilter::All);
    let text = server("[server.mcp_server.tools]\npick = [\"a\"]\nomit = [\"b\"]\n");
    let m = fails_at(&text, "omit =", "server.mcp_server.tools");
    assert!(m.contains("not both"), "{m}");
    let text = server("[server.mcp_server.tools]\npick = []\n");
    let m = fails_at(&text, "pick =", "server.mcp_server.tools.pick");
    assert!(m.contains("clients would see none"), "{m}");
    for field in ["pick", "omit"] {
        let text = server(&format!(
            "[server.mcp_server.tools]\n{field} = [\"a\",\n  \"\"]\n"
        ));
        let m = fails_at(
            &text,
            "  \"\"]",
            &format!("server.mcp_server.tools.{field}"),
        );
        assert!(m.contains("empty"), "{m}");
        let text = server(&format!(
            "[server.mcp_server.tools]\n{field} = [\"a\",\n  \"a\"]\n"
        ));
        let m = fails_at(
            &text,
            "  \"a\"]",
            &format!("server.mcp_server.tools.{field}"),
        );
        assert!(m.contains("listed twice"), "{m}");
    }
}

#[test]
fn restart_rules() {
    for key in [
        "window_secs",
        "backoff_initial_ms",
        "backoff_max_ms",
        "stable_after_secs",
    ] {
        let text = server(&format!("[server.mcp_server.restart]\n{key} = 0\n"));
        let m = fails_at(
            &text,
            &format!("{key} ="),
            &format!("server.mcp_server.restart.{key}"),
        );
        assert!(m.contains("too small: use 1 to"), "{m}");
    }
    let text =
        server("[server.mcp_server.restart]\nbackoff_initial_ms = 500\nbackoff_max_ms = 499\n");
    let m = fails_at(
        &text,
        "backoff_max_ms =",
        "server.mcp_server.restart.backoff_max_ms",
    );
    assert!(m.contains("below backoff_initial_ms (500)"), "{m}");
    // Against the default maximum (30000), the first delay is at fault.
    let text = server("[server.mcp_server.restart]\nbackoff_initial_ms = 60000\n");
    let m = fails_at(
        &text,
        "backoff_initial_ms =",
        "server.mcp_server.restart.backoff_initial_ms",
    );
    assert!(m.contains("30000, the default"), "{m}");
    let e = err(&server("[server.mcp_server.restart]\nmax_restarts = -1\n"));
    assert_eq!(e.line, Some(8), "{e}");
    assert_eq!(
        one(&server("[server.mcp_server.restart]\nmax_restarts = 0\n"))
            .restart
            .max_restarts,
        0
    );
}

#[test]
fn log_rules() {
    let text = server("[server.mcp_server.log]\nlines_per_second = 0\n");
    fails_at(
        &text,
        "lines_per_second",
        "server.mcp_server.log.lines_per_second",
    );
    let text = server("[server.mcp_server.log]\nsummary_secs = 0\n");
    fails_at(&text, "summary_secs", "server.mcp_server.log.summary_secs");
    for (bad, why) in [
        ("63", "too small"),
        ("\"2MiB\"", "too large"),
        ("\"x\"", "invalid size"),
    ] {
        let text = server(&format!(
            "[server.mcp_server.log]\nline_max_bytes = {bad}\n"
        ));
        let m = fails_at(
            &text,
            "line_max_bytes",
            "server.mcp_server.log.line_max_bytes",
        );
        assert!(m.contains(why), "{m}");
    }
    for (good, bytes) in [("64", 64), ("\"1MiB\"", 1 << 20)] {
        let s = one(&server(&format!(
            "[server.mcp_server.log]\nline_max_bytes = {good}\n"
        )));
        assert_eq!(s.log.line_max_bytes, bytes);
    }
}

#[test]
fn the_example_file_parses_with_its_server() {
    let text = include_str!("../../../../docs/example.toml");
    let c = Config::parse(text, None).unwrap();
    let names: Vec<&str> = c
        .server
        .mcp_servers
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["time"]);
}

/// `package = "npm:NAME@X.Y.Z"` / `"pypi:NAME==X.Y"`: deployed servers
/// only, pinned, a valid name, never with `source`.
fn package_entries(deployed: &str) {
    let with = |line: &str| deployed.replace("dir =", &format!("{line}\ndir ="));
    let c = Config::parse(&with("package = \"npm:@acme/tool@1.2.3\""), None).unwrap();
    let p = c.server.mcp_servers[0].package.clone().unwrap();
    assert_eq!(
        (p.kind, p.name.as_str(), p.version.as_str()),
        (crate::PackageKind::Npm, "@acme/tool", "1.2.3")
    );
    let c = Config::parse(&with("package = \"pypi:weather-mcp==0.4\""), None).unwrap();
    assert_eq!(
        c.server.mcp_servers[0]
            .package
            .as_ref()
            .unwrap()
            .to_string(),
        "pypi:weather-mcp==0.4"
    );
    let e = err(&with("package = \"npm:tool@^1.2.3\""));
    assert_eq!(e.key, "server.mcp_server.package", "{e}");
    assert!(e.message.contains("not an exact version"), "{e}");
    let e = err(&with("package = \"pypi:$(id)==1.0\""));
    assert!(e.message.contains("not a Python package name"), "{e}");
    let e = err(&with("package = \"pypi:x==1.0\"\nsource = \"/src/x\""));
    assert!(e.message.contains("not both"), "{e}");
    let e = err(&server("package = \"pypi:x==1.0\"\n"));
    assert!(
        e.message.contains("`package` is for runtime \"deployed\""),
        "{e}"
    );
}
