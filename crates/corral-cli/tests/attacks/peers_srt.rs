//! Checks from Anthropic's sandbox-runtime Linux suite
//! (`test/sandbox/*.test.ts`) that apply to corral's model, restated with
//! corral's mechanisms: `filesystem.deny` in a profile, writable workdirs,
//! `security.unix_sockets`, and network mode `allow` with real servers on
//! the host's loopback reached through corral's proxy by names mapped to
//! 127.0.0.1 (`--add-host`, `--allow-cidr 127.0.0.1/32`). No traffic
//! leaves the loopback. Checks of theirs corral already had are listed in
//! docs/SECURITY.md ("Peer suites ported"), not repeated here.

use crate::common::*;
use crate::support::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn write(path: &Path, contents: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir -p");
    }
    std::fs::write(path, contents).expect("write");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{e}>"))
}

/// A profile `p` extending `code` with `filesystem.deny = deny`.
fn deny_profile(deny: &[&str]) -> (tempfile::TempDir, String) {
    let list: Vec<String> = deny.iter().map(|d| format!("\"{d}\"")).collect();
    let (dir, cfg) = config(&format!(
        "[profile.p]\nextends = \"code\"\n[profile.p.filesystem]\ndeny = [{}]\n",
        list.join(", ")
    ));
    (dir, cfg.display().to_string())
}

// ---------------------------------------------------------------------
// Filesystem
// ---------------------------------------------------------------------

// Ports symlinked-deny-paths.test.ts, symlink-deny-path.test.ts and
// credential-deny.test.ts (a denied entry that is, or crosses, a
// symlink): the deny must never be dropped.
#[test]
fn attack_a_deny_path_that_crosses_a_symlink_refuses_the_run() {
    let work = workdir();
    let w = work.path();
    write(
        &w.join("dotfiles/claude/commands/cmd.md"),
        "DOTFILE-SECRET\n",
    );
    write(&w.join("dotfiles/netrc"), "NETRC-SECRET\n");
    std::fs::create_dir_all(w.join("proj")).expect("mkdir");
    // Relative targets: they resolve the same inside and outside.
    std::os::unix::fs::symlink("../dotfiles/claude", w.join("proj/.claude")).expect("symlink");
    std::os::unix::fs::symlink("dotfiles/netrc", w.join("netrc-link")).expect("symlink");
    own(w);
    let workdir = w.display().to_string();
    for (denied, secret) in [
        // A directory below a symlinked parent (a dotfile manager's layout).
        ("/workspace/proj/.claude/commands", "DOTFILE-SECRET"),
        // The entry itself is a symlink to the credential.
        ("/workspace/netrc-link", "NETRC-SECRET"),
    ] {
        let (_cfg_dir, cfg) = deny_profile(&[denied]);
        let out = run(
            &["--config", &cfg, "--profile", "p", "--workdir", &workdir],
            &[
                "sh",
                "-c",
                "cat proj/.claude/commands/cmd.md netrc-link dotfiles/netrc dotfiles/claude/commands/cmd.md",
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        // Without the refusal the program runs and prints the secret
        // through the link (the stand-in would sit on nothing).
        assert_eq!(out.status.code(), Some(125), "{denied}: {stdout} {stderr}");
        assert!(!stdout.contains(secret), "{denied}: {stdout}");
        assert!(
            stderr.contains(&format!("opening denied path {denied}")),
            "{denied}: the refusal names the path: {stderr}"
        );
    }
    assert_eq!(
        read(&w.join("dotfiles/claude/commands/cmd.md")),
        "DOTFILE-SECRET\n"
    );
}

// Ports credential-deny.test.ts (a denied file and a denied directory,
// with a readable neighbour), inside a writable workdir where the
// sandbox owns the files: only the stand-ins refuse.
#[test]
fn attack_denied_credentials_inside_a_writable_workdir_stay_hidden_and_intact() {
    let work = workdir();
    let w = work.path();
    write(&w.join("creds/netrc"), "machine x password FILE-SECRET\n");
    write(&w.join("creds/aws/credentials"), "DIR-SECRET\n");
    write(&w.join("creds/control.txt"), "control-ok\n");
    own(w);
    let (_cfg_dir, cfg) = deny_profile(&["/workspace/creds/netrc", "/workspace/creds/aws"]);
    let workdir = w.display().to_string();
    let (code, out, err) = attack(
        &["--config", &cfg, "--profile", "p", "--workdir", &workdir],
        r#"say('read file', try_(lambda: open('creds/netrc').read()))
say('read dir entry', try_(lambda: open('creds/aws/credentials').read()))
say('list dir', try_(lambda: os.listdir('creds/aws')))
say('overwrite file', try_(lambda: open('creds/netrc', 'w').write('x')))
say('plant in dir', try_(lambda: open('creds/aws/credentials2', 'w').write('x')))
say('remove file', try_(lambda: os.unlink('creds/netrc')))
say('rename dir', try_(lambda: os.rename('creds/aws', 'creds/aws2')))
say('control', open('creds/control.txt').read().strip())
"#,
    );
    assert_eq!(code, 0, "{err}");
    // Baseline without the stand-ins: every line `ok` (the sandbox owns
    // the files).
    assert_eq!(
        out,
        "read file EACCES\nread dir entry EACCES\nlist dir EACCES\n\
         overwrite file EROFS\nplant in dir EACCES\nremove file EBUSY\n\
         rename dir EBUSY\ncontrol control-ok\n"
    );
    assert_eq!(
        read(&w.join("creds/netrc")),
        "machine x password FILE-SECRET\n"
    );
    assert_eq!(read(&w.join("creds/aws/credentials")), "DIR-SECRET\n");
    assert_eq!(names(&w.join("creds/aws")), ["credentials"]);
}

/// A workdir holding `config/secrets.json` (denied) for the rename attacks.
fn workdir_with_denied_secret() -> (tempfile::TempDir, tempfile::TempDir, String, String) {
    let work = workdir();
    write(
        &work.path().join("config/secrets.json"),
        "{\"k\":\"REAL\"}\n",
    );
    own(work.path());
    let (cfg_dir, cfg) = deny_profile(&["/workspace/config/secrets.json"]);
    let wd = work.path().display().to_string();
    (work, cfg_dir, wd, cfg)
}

const RENAME_PARENT_ASIDE: &str = r#"say('rename parent', try_(lambda: os.rename('config', 'config-moved')))
say('read moved', try_(lambda: open('config-moved/secrets.json').read()))
def recreate():
    os.makedirs('config', exist_ok=True)
    with open('config/secrets.json', 'w') as f:
        f.write('attacker\n')
say('recreate', try_(recreate))
say('read new', try_(lambda: say('content', open('config/secrets.json').read().strip())))
"#;

// Ports linux-ancestor-pin.test.ts ("pins ancestors of denyRead file
// masks"): every directory between a writable bind and a denied path is a
// mount point, so the sandbox cannot move the denied file's parent aside
// and create a new file at the denied host path. Before the pins (found
// by this port), the rename succeeded: the stand-in moved along and kept
// the secret hidden, but the host path then held the sandbox's file.
#[test]
fn attack_the_parent_of_a_denied_file_cannot_be_renamed_to_replace_it_on_the_host() {
    let (work, _cfg_dir, wd, cfg) = workdir_with_denied_secret();
    let (code, out, err) = attack(
        &["--config", &cfg, "--profile", "p", "--workdir", &wd],
        RENAME_PARENT_ASIDE,
    );
    assert_eq!(code, 0, "{err}");
    // Unpinned: `rename parent ok`, `read moved EACCES` (the stand-in
    // moved), `recreate ok`, `content attacker`.
    assert_eq!(
        out,
        "rename parent EBUSY\nread moved ENOENT\nrecreate EROFS\nread new EACCES\n"
    );
    assert_eq!(
        read(&work.path().join("config/secrets.json")),
        "{\"k\":\"REAL\"}\n"
    );
    assert!(!work.path().join("config-moved").exists(), "{out}");
}

// ---------------------------------------------------------------------
// Unix sockets
// ---------------------------------------------------------------------

/// A host unix datagram socket in a readable directory; what it received.
struct HostDatagramSocket {
    dir: tempfile::TempDir,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl HostDatagramSocket {
    fn start() -> HostDatagramSocket {
        use std::os::unix::fs::PermissionsExt;
        let dir = readable_dir();
        let path = dir.path().join("log.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind log.sock");
        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o777)).expect("chmod");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let received = Arc::new(Mutex::new(Vec::new()));
        let rec = received.clone();
        // Bounded: gives up after 60 s.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let mut buf = [0u8; 256];
            while std::time::Instant::now() < deadline {
                if let Ok(n) = sock.recv(&mut buf) {
                    rec.lock().expect("lock").push(buf[..n].to_vec());
                }
            }
        });
        HostDatagramSocket { dir, received }
    }

    fn received(&self) -> usize {
        std::thread::sleep(Duration::from_millis(300));
        self.received.lock().expect("lock").len()
    }
}

const SEND_DATAGRAMS: &str = r#"for name, t in (('dgram', socket.SOCK_DGRAM), ('seqpacket', socket.SOCK_SEQPACKET), ('raw', socket.SOCK_RAW)):
    def send(t=t):
        s = socket.socket(socket.AF_UNIX, t)
        s.sendto(b'planted', '/data/log.sock')
    say(name, try_(send))
say('socketpair dgram', try_(lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)))
"#;

// Ports unix-socket-allowlist.test.ts ("refuses datagram unix sockets,
// including the SOCK_RAW spelling") and seccomp-filter.test.ts (SOCK_DGRAM
// blocked): a host datagram socket behind a bind (a syslog, a journal)
// gets nothing, whatever the socket type is spelled.
#[test]
fn attack_a_host_datagram_socket_behind_a_bind_gets_nothing() {
    let log = HostDatagramSocket::start();
    let bind = format!("{}:/data", log.dir.path().display());
    let (code, out, err) = attack(&["--ro", &bind], SEND_DATAGRAMS);
    assert_eq!(code, 0, "{err}");
    // Unconfined: `ok` for dgram and raw (the kernel maps SOCK_RAW to
    // SOCK_DGRAM for AF_UNIX); seqpacket gets ENOTCONN (a dgram peer).
    assert_eq!(
        out,
        "dgram EPERM\nseqpacket EPERM\nraw EPERM\nsocketpair dgram ok\n"
    );
    assert_eq!(log.received(), 0, "the host socket received a datagram");
}

// The control for the test above: with `security.unix_sockets = true` the
// same program reaches the host socket, so the refusal is the filter's.
#[test]
fn unix_datagrams_reach_a_bound_socket_only_with_the_opt_in() {
    let log = HostDatagramSocket::start();
    let bind = format!("{}:/data", log.dir.path().display());
    let (_dir, cfg) =
        config("[profile.u]\nextends = \"code\"\n[profile.u.security]\nunix_sockets = true\n");
    let cfg = cfg.display().to_string();
    let (code, out, err) = attack(
        &["--config", &cfg, "--profile", "u", "--ro", &bind],
        SEND_DATAGRAMS,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "dgram ok\nseqpacket ENOTCONN\nraw ok\nsocketpair dgram ok\n"
    );
    assert_eq!(log.received(), 2);
}

// ---------------------------------------------------------------------
// Network (mode `allow`): servers on the host's loopback only
// ---------------------------------------------------------------------

/// A TCP server on 127.0.0.1 that handles each connection with `serve`
/// on its own thread and counts them. Bounded: the accept loop stops
/// after 90 s.
struct LoopbackServer {
    port: u16,
    accepted: Arc<Mutex<usize>>,
}

impl LoopbackServer {
    fn start(serve: fn(TcpStream)) -> LoopbackServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let accepted = Arc::new(Mutex::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(90);
            while std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        *count.lock().expect("lock") += 1;
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                        std::thread::spawn(move || serve(stream));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        LoopbackServer { port, accepted }
    }

    fn accepted(&self) -> usize {
        std::thread::sleep(Duration::from_millis(100));
        *self.accepted.lock().expect("lock")
    }
}

/// Flags for mode `allow` with `rules` allowed and every name in `names`
/// mapped to 127.0.0.1.
fn net_flags(rules: &[String], names: &[&str]) -> Vec<String> {
    let mut flags = vec![
        "--net".to_string(),
        "allow".into(),
        "--allow-cidr".into(),
        "127.0.0.1/32".into(),
    ];
    for r in rules {
        flags.extend(["--allow-domain".into(), r.clone()]);
    }
    for n in names {
        flags.extend(["--add-host".into(), format!("{n}=127.0.0.1")]);
    }
    flags
}

fn attack_net(flags: &[String], body: &str) -> (i32, String, String) {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    attack(&flags, body)
}

/// Speaks first like an SSH server, then reads until EOF and answers with
/// the byte count and a checksum of what it read.
fn banner_then_checksum(mut s: TcpStream) {
    if s.write_all(b"SSH-2.0-loopback-upstream\r\n").is_err() {
        return;
    }
    let mut all = Vec::new();
    if s.read_to_end(&mut all).is_err() {
        return;
    }
    let _ = s.write_all(format!("{} {:016x}\n", all.len(), fnv1a(&all)).as_bytes());
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

/// Deterministic, incompressible-looking bytes (xorshift64).
fn payload(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e3779b97f4a7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

// Ports connect-tunnel-integrity.test.ts (a multi-megabyte upload arrives
// byte-intact) and connect-non-tls.test.ts (a CONNECT carrying a protocol
// that is not TLS and whose server speaks first, SSH-like, is relayed).
#[test]
fn a_large_non_tls_stream_crosses_the_connect_tunnel_intact() {
    let up = LoopbackServer::start(banner_then_checksum);
    let data = readable_dir();
    let body = payload(8 << 20);
    std::fs::write(data.path().join("body"), &body).expect("write body");
    let bind = format!("{}:/data", data.path().display());
    let mut flags = net_flags(&[format!("tunnel.test:{}", up.port)], &["tunnel.test"]);
    flags.extend(["--ro".into(), bind]);
    let script = format!(
        r#"s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
s.sendall(b'CONNECT tunnel.test:{port} HTTP/1.1\r\nHost: tunnel.test:{port}\r\n\r\n')
f = s.makefile('rb')
say(f.readline().decode().strip())
while f.readline() not in (b'\r\n', b''):
    pass
say(f.readline().decode().strip())
s.sendall(b'SSH-2.0-client\r\n')
s.sendall(open('/data/body', 'rb').read())
s.shutdown(socket.SHUT_WR)
say(f.readline().decode().strip())
"#,
        port = up.port
    );
    let (code, out, err) = attack_net(&flags, &script);
    assert_eq!(code, 0, "{err}");
    let mut sent = b"SSH-2.0-client\r\n".to_vec();
    sent.extend_from_slice(&body);
    let expected = format!(
        "HTTP/1.1 200 Connection established\nSSH-2.0-loopback-upstream\n{} {:016x}\n",
        sent.len(),
        fnv1a(&sent)
    );
    assert_eq!(out.to_lowercase(), expected.to_lowercase(), "{err}");
    assert_eq!(up.accepted(), 1);
}

/// Answers one HTTP request with the request line and `Host` it received.
fn echo_request(s: TcpStream) {
    let mut reader = BufReader::new(match s.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut host = String::new();
    loop {
        let mut h = String::new();
        match reader.read_line(&mut h) {
            Ok(0) | Err(_) => return,
            Ok(_) if h == "\r\n" => break,
            Ok(_) => {
                if h.to_ascii_lowercase().starts_with("host:") {
                    host = h[5..].trim().to_string();
                }
            }
        }
    }
    let body = format!("{} | host={host}\n", line.trim());
    let mut s = s;
    let _ = s.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

/// Sends `request` raw to the HTTP proxy and prints the status line and,
/// on 200, the body.
const RAW_PROXY_REQUEST: &str = r#"def ask(req):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
    s.sendall(req)
    data = b''
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    head, _, body = data.partition(b'\r\n\r\n')
    status = head.split(b'\r\n')[0].decode()
    return status.split(' ')[1] + (' ' + body.decode().strip() if status.split(' ')[1] == '200' else '')
"#;

// Ports host-header-proxy.test.ts ("absolute-form target ... Host stays
// authoritative" is their rule for their Host-routed proxy; corral's is
// the reverse: the checked URL is authoritative) and
// canonical-host-routing.test.ts (the allowlist and the wire see one
// canonical spelling): a forged Host header never reaches the upstream,
// a case-changed spelling of the allowed name is forwarded canonically,
// and an origin-form request (nothing but a Host header to route by) is
// refused without dialling.
#[test]
fn the_upstream_sees_the_checked_host_never_the_clients_host_header() {
    let up = LoopbackServer::start(echo_request);
    let p = up.port;
    let flags = net_flags(&[format!("api.test:{p}")], &["api.test", "evil.test"]);
    let script = format!(
        r#"{RAW_PROXY_REQUEST}
say('forged host', ask(b'GET http://api.test:{p}/v1?q=1 HTTP/1.1\r\nHost: evil.test:{p}\r\nConnection: close\r\n\r\n'))
say('case', ask(b'GET http://API.Test:{p}/x HTTP/1.1\r\nHost: API.Test:{p}\r\nConnection: close\r\n\r\n'))
say('origin form', ask(b'GET /x HTTP/1.1\r\nHost: api.test:{p}\r\nConnection: close\r\n\r\n'))
say('evil by url', ask(b'GET http://evil.test:{p}/x HTTP/1.1\r\nHost: api.test:{p}\r\nConnection: close\r\n\r\n'))
"#
    );
    let (code, out, err) = attack_net(&flags, &script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "forged host 200 GET /v1?q=1 HTTP/1.1 | host=api.test:{p}\n\
             case 200 GET /x HTTP/1.1 | host=api.test:{p}\n\
             origin form 400\n\
             evil by url 403\n"
        ),
        "{err}"
    );
    assert_eq!(
        up.accepted(),
        2,
        "only the two allowed requests were dialled"
    );
}

/// Sends a SOCKS5 CONNECT for `host:port` (no authentication) and prints
/// the reply code; on success, one line from the upstream.
const SOCKS5_CONNECT: &str = r#"def socks(host, port):
    s = socket.create_connection(('127.0.0.1', 1080), timeout=20)
    s.sendall(b'\x05\x01\x00')
    if s.recv(2) != b'\x05\x00':
        return 'no method'
    h = host.encode()
    s.sendall(b'\x05\x01\x00\x03' + bytes([len(h)]) + h + struct.pack('>H', port))
    reply = b''
    while len(reply) < 10:
        d = s.recv(10 - len(reply))
        if not d:
            break
        reply += d
    if len(reply) < 2:
        return 'closed'
    out = 'rep=%d' % reply[1]
    if reply[1] == 0:
        out += ' ' + s.makefile('rb').readline().decode().strip()
    return out
"#;

// Ports socks-unauthenticated-probe.test.ts ("non-22 target: plain SOCKS
// refusal, no tunnel") and socks-token-dest.test.ts (the SOCKS side
// decides on the destination like the HTTP side): a refused name, a
// refused port (22 included) get REP=2 ("not allowed
// by ruleset") and nothing is dialled; the allowed name gets a tunnel.
#[test]
fn socks5_refuses_names_and_ports_outside_the_policy() {
    let up = LoopbackServer::start(banner_then_checksum);
    let p = up.port;
    let flags = net_flags(&[format!("ok.test:{p}")], &["ok.test", "other.test"]);
    let script = format!(
        r#"{SOCKS5_CONNECT}
say('other name', socks('other.test', {p}))
say('port 22', socks('ok.test', 22))
say('other port', socks('ok.test', {other}))
say('allowed', socks('ok.test', {p}))
"#,
        other = p.wrapping_add(1).max(1024)
    );
    let (code, out, err) = attack_net(&flags, &script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "other name rep=2\nport 22 rep=2\nother port rep=2\nallowed rep=0 SSH-2.0-loopback-upstream\n",
        "{err}"
    );
    assert_eq!(up.accepted(), 1, "only the allowed request was dialled");
}

// Ports domain-pattern.test.ts (what a `*.` pattern matches) and
// proxy-env-vars.test.ts (".local names are not excluded from the proxy"):
// `*.svc.test` allows names below it, not the apex, not a look-alike
// suffix, not the allowed name as a prefix of another domain; a `.local`
// name goes through the proxy like any other.
#[test]
fn a_wildcard_rule_matches_only_names_below_it() {
    let up = LoopbackServer::start(echo_request);
    let p = up.port;
    let names = [
        "api.svc.test",
        "a.b.svc.test",
        "svc.test",
        "evilsvc.test",
        "svc.test.evil.test",
        "printer.local",
    ];
    let flags = net_flags(
        &[format!("*.svc.test:{p}"), format!("printer.local:{p}")],
        &names,
    );
    let mut script = String::from("set -u\n");
    for n in names {
        script.push_str(&format!(
            "printf '%s ' {n}; curl -s -o /dev/null -w '%{{http_code}}\\n' http://{n}:{p}/\n"
        ));
    }
    let out = run(
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
        &["sh", "-c", &script],
    );
    assert_eq!(
        text(&out.stdout),
        "api.svc.test 200\na.b.svc.test 200\nsvc.test 403\nevilsvc.test 403\n\
         svc.test.evil.test 403\nprinter.local 200\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(up.accepted(), 3);
}

/// Sends `CONNECT target` raw to the HTTP proxy; prints the status code
/// (or `closed`), then hangs up.
const RAW_CONNECT: &str = r#"def connect(target):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
    s.sendall(b'CONNECT ' + target + b' HTTP/1.1\r\nHost: ' + target.replace(b'\r\n', b'') + b'\r\n\r\n')
    line = s.makefile('rb').readline()
    s.close()
    return line.split(b' ')[1].decode() if line else 'closed'
"#;

// Ports network-filter.test.ts (deny wins over a wildcard allow in every
// spelling; hosts with NUL, an IPv6 zone id, or over 253 characters are
// refused before any rule could match them by suffix; case and a trailing
// dot are canonicalized) and canonical-host-routing.test.ts (the name
// dialled is the one the rules judged). Every target but the first two is
// refused and nothing but the first two is dialled.
#[test]
fn hostile_spellings_never_pass_the_proxy_under_a_wildcard_rule() {
    let up = LoopbackServer::start(banner_then_checksum);
    let p = up.port;
    let (_dir, cfg) = config(&format!(
        "[profile.n]\nextends = \"code\"\n[profile.n.network]\nmode = \"allow\"\n\
         allow_domains = [\"*.svc.test:{p}\"]\ndeny_domains = [\"internal.svc.test\"]\n\
         allow_cidrs = [\"127.0.0.1/32\"]\n\
         [profile.n.network.hosts]\n\"api.svc.test\" = \"127.0.0.1\"\n\"internal.svc.test\" = \"127.0.0.1\"\n"
    ));
    let cfg = cfg.display().to_string();
    let long = format!("{}svc.test", "x.".repeat(125));
    let script = format!(
        r#"{RAW_CONNECT}
for t in [b'api.svc.test:{p}', b'API.Svc.TEST:{p}', b'internal.svc.test:{p}',
          b'INTERNAL.Svc.test:{p}', b'internal.svc.test.:{p}', b'evil.test\x00.api.svc.test:{p}',
          b'[::ffff:127.0.0.1%25x.api.svc.test]:{p}', b'::ffff:127.0.0.1%x.api.svc.test:{p}',
          b'{long}:{p}', b'svc.test:{p}', b'api.svc.test:{other}']:
    say(connect(t))
"#,
        other = p.wrapping_add(1).max(1024)
    );
    let (code, out, err) = attack(&["--config", &cfg, "--profile", "n"], &script);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, "200\n200\n403\n403\n403\n400\n400\n400\n400\n403\n403\n",
        "{err}"
    );
    assert_eq!(up.accepted(), 2, "only the allowed name was dialled");
}
