//! Network egress: real clients inside the sandbox, real servers on
//! loopback and on test hosts in network namespaces this test creates.
//! No traffic goes anywhere else.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

/// A one-file HTTP server on 127.0.0.1 (python's http.server), killed on drop.
struct Upstream {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Serves `dir` on `bind` (inside netns `netns` when given).
fn serve(dir: tempfile::TempDir, bind: &str, port: u16, netns: Option<&str>) -> Upstream {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "/usr/bin/python3"]);
            c
        }
        None => Command::new("/usr/bin/python3"),
    };
    let mut child = cmd
        .args(["-u", "-m", "http.server", "--bind", bind, &port.to_string()])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // http.server prints "Serving HTTP on ..." once it listens.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("Serving HTTP"), "{line}");
    Upstream {
        child,
        port,
        _dir: dir,
    }
}

fn hello_server() -> Upstream {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hello from upstream\n").unwrap();
    serve(dir, "127.0.0.1", free_port(), None)
}

fn allow_flags(up: &Upstream) -> Vec<String> {
    vec![
        "--allow-domain".into(),
        format!("allowed.test:{}", up.port),
        "--add-host".into(),
        "allowed.test=127.0.0.1".into(),
        "--allow-cidr".into(),
        "127.0.0.1/32".into(),
    ]
}

fn run_net(flags: &[String], argv: &[&str]) -> (serde_json::Value, std::process::Output) {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    run_json(&flags, argv)
}

#[test]
fn curl_and_urllib_reach_an_allowed_domain_through_the_proxy() {
    let up = hello_server();
    let url = format!("http://allowed.test:{}/hello.txt", up.port);
    let (v, _) = run_net(&allow_flags(&up), &["sh", "-c", &format!("curl -sS {url}")]);
    assert_eq!(v["stdout"], "hello from upstream\n", "{v}");
    let py = format!(
        "import urllib.request\nprint(urllib.request.urlopen('{url}').read().decode(), end='')"
    );
    let (v, _) = run_net(&allow_flags(&up), &["python3", "-c", &py]);
    assert_eq!(v["stdout"], "hello from upstream\n", "{v}");
    assert_eq!(v["enforced"]["network"], "allow");
    let allowed: Vec<&serde_json::Value> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["code"] == "net.allowed")
        .collect();
    assert_eq!(allowed.len(), 1, "{v}");
    assert_eq!(allowed[0]["fields"]["domain"], "allowed.test");
    assert!(allowed[0]["fields"]["bytes_down"].as_u64().unwrap() > 0);
}

/// The proxy looks names up with the C library's `files` and `dns` only,
/// whatever the host's nsswitch.conf names: corral is a static glibc
/// program, and any other source would be loaded with `dlopen` (a second
/// C library in the process). Here, in a mount namespace of the test's
/// own, nsswitch.conf puts a source glibc does not have built in first
/// and /etc/hosts names the upstream. The name must still resolve
/// (through `files`), and strace must see no attempt to open an NSS
/// module: without the proxy's fixed sources glibc tries
/// `libnss_corralnone.so.2` on every lookup.
#[test]
fn the_proxy_resolves_through_files_and_dns_and_never_loads_an_nss_module() {
    require_tool("strace");
    require_tool("unshare");
    let up = hello_server();
    let dir = tempfile::tempdir().unwrap();
    let nsswitch = dir.path().join("nsswitch.conf");
    std::fs::write(
        &nsswitch,
        "hosts: corralnone [SUCCESS=return] mymachines files dns\n",
    )
    .unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.1 via-files.test\n").unwrap();
    let trace = dir.path().join("strace.log");
    let url = format!("http://via-files.test:{}/hello.txt", up.port);
    // As root, a mount namespace of its own is enough. As a user: root of
    // a user namespace for the mounts (mount(8) wants uid 0), then the
    // user itself again in one nested below it, so that corral runs
    // unprivileged, as the rest of this pass does.
    let script = "mount --bind \"$1\" /etc/nsswitch.conf && mount --bind \"$2\" /etc/hosts \
                  && shift 3 && exec \"$@\"";
    let mut cmd = Command::new("unshare");
    if is_root() {
        cmd.args(["--mount", "--", "sh", "-c", script]);
    } else {
        cmd.args([
            "--user",
            "--map-root-user",
            "--mount",
            "--",
            "sh",
            "-c",
            script,
        ]);
    }
    cmd.arg(&trace).arg(&nsswitch).arg(&hosts).arg("--");
    if !is_root() {
        let (uid, gid) = (
            text(&Command::new("id").arg("-u").output().unwrap().stdout),
            text(&Command::new("id").arg("-g").output().unwrap().stdout),
        );
        cmd.args(["unshare", "--user"])
            .arg(format!("--map-user={}", uid.trim()))
            .arg(format!("--map-group={}", gid.trim()))
            .arg("--");
    }
    cmd.args(["strace", "-f", "-qq", "-e", "trace=open,openat", "-o"])
        .arg(&trace);
    let out = then_corral_run(&mut cmd)
        .args(["--json", "--allow-domain"])
        .arg(format!("via-files.test:{}", up.port))
        .args(["--allow-cidr", "127.0.0.1/32", "--", "sh", "-c"])
        .arg(format!("curl -sS {url}"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    assert_eq!(v["stdout"], "hello from upstream\n", "{v}");
    let opened = std::fs::read_to_string(&trace).unwrap();
    assert!(
        opened.contains("/etc/hosts"),
        "strace saw no lookup at all: {opened}"
    );
    let modules: Vec<&str> = opened.lines().filter(|l| l.contains("libnss_")).collect();
    assert!(modules.is_empty(), "NSS modules opened: {modules:#?}");
}

#[test]
fn host_mode_shares_the_host_network_loudly_and_can_resolve() {
    let up = hello_server();
    let url = format!("http://127.0.0.1:{}/hello.txt", up.port);
    let flags = vec!["--net".to_string(), "host".to_string()];
    let (v, _) = run_net(
        &flags,
        &[
            "sh",
            "-c",
            &format!("curl -sS {url} && cat /etc/resolv.conf"),
        ],
    );
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    assert_eq!(
        v["stdout"].as_str().unwrap(),
        format!("hello from upstream\n{host_resolv}"),
        "{v}"
    );
    assert_eq!(v["enforced"]["network"], "host");
    assert!(
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["code"] == "net.host" && e["level"] == "warn"),
        "{v}"
    );
    // The other modes get no resolver configuration at all.
    let (v, _) = run_net(&[], &["sh", "-c", "test -e /etc/resolv.conf || echo none"]);
    assert_eq!(v["stdout"], "none\n", "{v}");
}

#[test]
fn a_denied_domain_gets_403_naming_the_rule() {
    let up = hello_server();
    let mut flags = allow_flags(&up);
    flags.extend(["--add-host".into(), "other.test=127.0.0.1".into()]);
    let script = format!("curl -sS -o /tmp/body -w '%{{http_code}}' http://other.test:{}/hello.txt; echo; cat /tmp/body", up.port);
    let (v, _) = run_net(&flags, &["sh", "-c", &script]);
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("403\n"), "{out}");
    assert!(
        out.contains("other.test") && out.contains("allowed.test"),
        "the body names the rule: {out}"
    );
    assert!(!out.contains("hello from upstream"));
    let denied = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["code"] == "net.denied")
        .unwrap();
    assert_eq!(denied["fields"]["domain"], "other.test", "{denied}");
}

#[test]
fn direct_sockets_and_dns_go_nowhere() {
    let up = hello_server();
    let script = format!(
        "import socket\n\
         for fam, addr in ((socket.AF_INET, ('127.0.0.1', {p})), (socket.AF_INET6, ('::1', {p}))):\n\
         \x20   s = socket.socket(fam)\n\
         \x20   s.settimeout(2)\n\
         \x20   try:\n\
         \x20       s.connect(addr)\n\
         \x20       print('CONNECTED', addr)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', e.errno)\n\
         try:\n\
         \x20   socket.getaddrinfo('allowed.test', 80)\n\
         \x20   print('RESOLVED')\n\
         except OSError as e:\n\
         \x20   print('no dns')\n",
        p = up.port
    );
    let (v, _) = run_net(&allow_flags(&up), &["python3", "-c", &script]);
    let out = v["stdout"].as_str().unwrap();
    assert_eq!(out.matches("refused").count(), 2, "{out}");
    assert!(
        out.contains("no dns") && !out.contains("CONNECTED"),
        "{out}"
    );
}

#[test]
fn loopback_names_literals_and_mapped_addresses_are_refused_without_a_cidr() {
    let up = hello_server();
    let p = up.port;
    // The name maps to loopback, but no CIDR allows 127.0.0.0/8.
    let flags: Vec<String> = vec![
        "--allow-domain".into(),
        format!("loop.test:{p}"),
        "--add-host".into(),
        "loop.test=127.0.0.1".into(),
        "--allow-domain".into(),
        format!("mapped.test:{p}"),
        "--add-host".into(),
        "mapped.test=::ffff:127.0.0.1".into(),
    ];
    // --noproxy '': IP literals must go through the proxy too (NO_PROXY
    // would send 127.0.0.1 straight to the sandbox's own loopback); -p
    // tunnels with CONNECT.
    let script = format!(
        "for u in http://loop.test:{p}/hello.txt http://mapped.test:{p}/hello.txt http://127.0.0.1:{p}/hello.txt 'http://[::ffff:127.0.0.1]:{p}/hello.txt'; do \
         curl -sS --noproxy '' -o /dev/null -w '%{{http_code}}\\n' \"$u\"; done; \
         curl -sS --noproxy '' -o /dev/null -w '%{{http_code}}\\n' -p http://127.0.0.1:{p}/hello.txt"
    );
    let (v, _) = run_net(&flags, &["sh", "-c", &script]);
    let codes: Vec<&str> = v["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(codes, ["403", "403", "403", "403", "000"], "{v}");
    let reasons: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["code"] == "net.denied")
        .map(|e| e["fields"]["reason"].as_str().unwrap().to_string())
        .collect();
    assert!(
        reasons.iter().any(|r| r == "net.denied.address"),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r == "net.denied.ip_literal"),
        "{reasons:?}"
    );
}

#[test]
fn pip_installs_from_a_local_index_through_the_proxy() {
    // A minimal wheel and a PEP 503 simple index, served on loopback.
    let dir = tempfile::tempdir().unwrap();
    let wheel = "corral_probe-1.0-py3-none-any.whl";
    let build = format!(
        "import zipfile, hashlib, base64\n\
         files = {{'corral_probe.py': b'ANSWER = 42\\n', 'corral_probe-1.0.dist-info/METADATA': b'Metadata-Version: 2.1\\nName: corral-probe\\nVersion: 1.0\\n', 'corral_probe-1.0.dist-info/WHEEL': b'Wheel-Version: 1.0\\nGenerator: corral-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}}\n\
         rec = []\n\
         with zipfile.ZipFile('{w}', 'w') as z:\n\
         \x20   for n, d in files.items():\n\
         \x20       z.writestr(n, d)\n\
         \x20       h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()\n\
         \x20       rec.append(f'{{n}},sha256={{h}},{{len(d)}}')\n\
         \x20   rec.append('corral_probe-1.0.dist-info/RECORD,,')\n\
         \x20   z.writestr('corral_probe-1.0.dist-info/RECORD', '\\n'.join(rec) + '\\n')\n",
        w = dir.path().join(wheel).display()
    );
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", &build])
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::create_dir_all(dir.path().join("simple/corral-probe")).unwrap();
    std::fs::rename(
        dir.path().join(wheel),
        dir.path().join("simple/corral-probe").join(wheel),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("simple/corral-probe/index.html"),
        format!("<a href=\"{wheel}\">{wheel}</a>\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("simple/index.html"),
        "<a href=\"corral-probe/\">corral-probe</a>\n",
    )
    .unwrap();
    let up = serve(dir, "127.0.0.1", free_port(), None);
    let flags: Vec<String> = vec![
        "--allow-domain".into(),
        format!("pypi.test:{}", up.port),
        "--add-host".into(),
        "pypi.test=127.0.0.1".into(),
        "--allow-cidr".into(),
        "127.0.0.1/32".into(),
        "--timeout".into(),
        "120".into(),
    ];
    let script = format!(
        "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --trusted-host pypi.test --index-url http://pypi.test:{}/simple --target /workspace/lib corral-probe && \
         PYTHONSAFEPATH=1 python3 -c 'import sys; sys.path.insert(0, \"/workspace/lib\"); import corral_probe; print(corral_probe.ANSWER)'",
        up.port
    );
    let (v, _) = run_net(&flags, &["sh", "-c", &script]);
    assert_eq!(v["stdout"], "42\n", "{v}");
}

/// A test host in a network namespace this test creates, reachable from the
/// host over a veth pair, with a private, a link-local (cloud metadata) and
/// a ULA address. Root only. Removed on drop.
struct TestHost {
    ns: String,
    host_if: String,
}

impl TestHost {
    fn create(tag: &str) -> TestHost {
        let ns = format!("corral-{tag}-{}", std::process::id() % 100000);
        let host_if = format!("cv{}{tag}", std::process::id() % 100000);
        let peer = format!("{host_if}p");
        let ip = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        ip(&["netns", "add", &ns]);
        let th = TestHost {
            ns: ns.clone(),
            host_if: host_if.clone(),
        };
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer, "netns", &ns,
        ]);
        ip(&["addr", "add", "10.213.0.1/24", "dev", &host_if]);
        ip(&["addr", "add", "fd13::1/64", "dev", &host_if, "nodad"]);
        ip(&["link", "set", &host_if, "up"]);
        for a in ["10.213.0.2/24", "169.254.169.254/16"] {
            ip(&["netns", "exec", &ns, "ip", "addr", "add", a, "dev", &peer]);
        }
        ip(&[
            "netns",
            "exec",
            &ns,
            "ip",
            "addr",
            "add",
            "fd13::2/64",
            "dev",
            &peer,
            "nodad",
        ]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        ip(&["route", "add", "169.254.169.254/32", "dev", &host_if]);
        th
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

#[test]
fn private_link_local_and_ula_addresses_need_an_explicit_cidr() {
    if !is_root() {
        eprintln!("unprivileged pass: test hosts in network namespaces need root; the root pass runs this");
        return;
    }
    let host = TestHost::create("n");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "internal\n").unwrap();
    let port = 18080;
    let _up = serve(dir, "::", port, Some(&host.ns));
    let names = [
        ("internal.test", "10.213.0.2", "10.213.0.0/24"),
        ("metadata.test", "169.254.169.254", "169.254.169.254/32"),
        ("ula.test", "fd13::2", "fd13::/64"),
    ];
    for (name, addr, cidr) in names {
        let mut flags: Vec<String> = vec![
            "--allow-domain".into(),
            format!("{name}:{port}"),
            "--add-host".into(),
            format!("{name}={addr}"),
        ];
        let fetch = format!("curl -sS -m 5 -o /tmp/b -w '%{{http_code}}' http://{name}:{port}/hello.txt; echo; cat /tmp/b");
        let (v, _) = run_net(&flags, &["sh", "-c", &fetch]);
        let out = v["stdout"].as_str().unwrap();
        assert!(
            out.starts_with("403"),
            "{name} → {addr} must be refused without a CIDR: {out}"
        );
        assert!(!out.contains("internal\n"), "{out}");
        flags.extend(["--allow-cidr".into(), cidr.into()]);
        let (v, _) = run_net(&flags, &["sh", "-c", &fetch]);
        assert!(
            v["stdout"].as_str().unwrap().starts_with("200\ninternal"),
            "{name} with {cidr}: {v}"
        );
    }
}

#[test]
fn a_cidr_port_list_admits_one_loopback_port_and_refuses_another() {
    let (a, b) = (hello_server(), hello_server());
    let flags = vec![
        "--allow-domain".to_string(),
        format!("svc.test:{},{}", a.port, b.port),
        "--add-host".into(),
        "svc.test=127.0.0.1".into(),
        "--allow-cidr".into(),
        format!("127.0.0.1/32:{}", a.port),
    ];
    // By name (the recipe in policy.md), and as an IP literal through the
    // proxy (curl's NO_PROXY would otherwise skip it for 127.0.0.1).
    let script = format!(
        "for u in http://svc.test:{a}/hello.txt http://svc.test:{b}/hello.txt; do \
           curl -sS -o /dev/null -w '%{{http_code}}\\n' $u; done; \
         for p in {a} {b}; do \
           curl -sS --noproxy '' -x \"$HTTP_PROXY\" -o /dev/null -w '%{{http_code}}\\n' http://127.0.0.1:$p/hello.txt; done",
        a = a.port,
        b = b.port
    );
    let (v, _) = run_net(&flags, &["sh", "-c", &script]);
    assert_eq!(v["stdout"], "200\n403\n200\n403\n", "{v}");
    let events = v["events"].as_array().unwrap();
    let port_of = |code: &str, reason: &str| -> Vec<u64> {
        events
            .iter()
            .filter(|e| e["code"] == code && e["fields"]["reason"] == reason)
            .map(|e| e["fields"]["port"].as_u64().unwrap())
            .collect()
    };
    let (pa, pb) = (u64::from(a.port), u64::from(b.port));
    assert_eq!(port_of("net.allowed", "net.allowed"), [pa, pa], "{v}");
    assert_eq!(port_of("net.denied", "net.denied.address"), [pb], "{v}");
    assert_eq!(port_of("net.denied", "net.denied.port"), [pb], "{v}");
}
