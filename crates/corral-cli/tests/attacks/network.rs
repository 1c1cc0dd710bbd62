//! Network: the host's sockets (abstract, on disk, loopback TCP) are out
//! of reach, nothing routes off the loopback, dangerous socket families
//! are refused, and Landlock allows exactly the listed TCP ports.

use crate::common::*;
use crate::support::*;

use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;

/// A config with a profile `agent` that allows `socket(AF_UNIX)`: the
/// directory holding it (keep it alive) and its path, for
/// `--config PATH --profile agent`.
fn unix_sockets_allowed() -> (tempfile::TempDir, String) {
    let (dir, cfg) = config(
        "[profile.agent]\nextends = \"code\"\n[profile.agent.security]\nunix_sockets = true\n",
    );
    (dir, cfg.display().to_string())
}

#[test]
fn attack_host_abstract_unix_socket_is_invisible() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
    let name = format!("corral-attack-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
    let listener = UnixListener::bind_addr(&addr).expect("bind abstract socket on the host");
    listener.set_nonblocking(true).expect("nonblocking");
    // The socket is real: the host itself can connect.
    let probe = UnixStream::connect_addr(&addr).expect("host connect");
    drop(listener.accept().expect("host accept"));
    drop(probe);
    let body = format!(
        "s = socket.socket(socket.AF_UNIX)\nsay('connect', try_(lambda: s.connect('\\0{name}')))\n"
    );
    // With unix sockets allowed, so the layer under test is the network
    // namespace (by default socket(AF_UNIX) itself is refused).
    let (_cfg, cfg) = unix_sockets_allowed();
    let (code, out, err) = attack(&["--config", &cfg, "--profile", "agent"], &body);
    assert_eq!(code, 0, "{err}");
    let e = out.trim().rsplit(' ').next().unwrap_or("");
    assert!(
        e == "ECONNREFUSED" || e == "EPERM",
        "the sandbox reached a host abstract socket: {out}"
    );
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
}

#[test]
fn attack_host_unix_sockets_on_disk_are_unreachable() {
    use std::os::unix::net::UnixListener;
    let dir = readable_dir();
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    std::fs::set_permissions(&path, PermissionsExt::from_mode(0o777)).expect("chmod");
    listener.set_nonblocking(true).expect("nonblocking");
    let body = format!(
        r#"for p in ('{}', '/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock', '/run/dbus/system_bus_socket', '/run/systemd/private', '/tmp/.X11-unix/X0'):
    s = socket.socket(socket.AF_UNIX)
    say(try_(lambda: s.connect(p)))
"#,
        path.display()
    );
    // With unix sockets allowed: the layer under test is the mount view.
    let (_cfg, cfg) = unix_sockets_allowed();
    let (code, out, err) = attack(&["--config", &cfg, "--profile", "agent"], &body);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "ENOENT\n".repeat(7));
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
}

#[test]
fn attack_host_loopback_tcp_listener_is_unreachable() {
    // The profile lets Landlock allow the port, so only the network
    // namespace stands between the program and the host's listener.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let (_d, cfg) = config(&format!(
        "[profile.net]\nextends = \"code\"\n[profile.net.security]\ntcp_connect = [{port}]\n"
    ));
    let body = format!(
        "say('connect', try_(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5)))\n"
    );
    let (code, out, err) = attack(
        &["--config", cfg.to_str().expect("utf-8"), "--profile", "net"],
        &body,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "connect ECONNREFUSED\n");
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
}

#[test]
fn attack_shell_and_node_clients_cannot_reach_a_host_loopback_listener() {
    // Codex's suite tries the tools an agent reaches for (bash's /dev/tcp,
    // a runtime's own socket API) rather than one syscall: each must fail,
    // and the host's listener must see nothing. Landlock allows the port
    // here, so the network namespace is the layer under test.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let (_d, cfg) = config(&format!(
        "[profile.net]\nextends = \"code\"\n[profile.net.security]\ntcp_connect = [{port}]\n"
    ));
    let cfg = cfg.display().to_string();
    let flags = [
        "--config",
        cfg.as_str(),
        "--profile",
        "net",
        "--timeout",
        "30",
    ];
    let bash = format!("echo hi > /dev/tcp/127.0.0.1/{port}");
    let out = run(&flags, &["bash", "-c", &bash]);
    assert_ne!(out.status.code(), Some(0), "bash /dev/tcp reached the host");
    assert!(
        text(&out.stderr).contains("Connection refused"),
        "{}",
        text(&out.stderr)
    );
    let node = format!(
        "require('net').connect({port}, '127.0.0.1').on('connect', () => {{ console.log('connected'); process.exit(0); }}).on('error', e => {{ console.log(e.code); process.exit(3); }})"
    );
    let out = run(&flags, &["node", "-e", &node]);
    assert_eq!(text(&out.stdout), "ECONNREFUSED\n", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3));
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
}

#[test]
fn attack_there_is_no_route_off_the_loopback() {
    // Without a route nothing leaves, whatever the address; nothing here
    // sends a packet anywhere.
    expect(
        r#"say('ipv4 routes', len(open('/proc/net/route').read().splitlines()) - 1)
say('ipv6 route devices', sorted(set(l.split()[-1] for l in open('/proc/net/ipv6_route'))))
say('interfaces', [n for _, n in socket.if_nameindex()])
"#,
        "ipv4 routes 0\nipv6 route devices ['lo']\ninterfaces ['lo']\n",
    );
}

#[test]
fn attack_af_packet_sockets_are_refused() {
    if !x86_64("attack_af_packet_sockets_are_refused") {
        return;
    }
    // Baseline for the bad type: EINVAL (checked before the family).
    expect(
        r#"say('AF_PACKET SOCK_RAW', sc(41, 17, 3, 0x0300))
say('AF_PACKET SOCK_DGRAM', sc(41, 17, 2, 0x0300))
say('AF_PACKET bad type', sc(41, 17, 99, 0))
say('python', try_(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)))
"#,
        "AF_PACKET SOCK_RAW EPERM\nAF_PACKET SOCK_DGRAM EPERM\nAF_PACKET bad type EPERM\npython EPERM\n",
    );
}

#[test]
fn attack_icmp_sockets_are_refused_raw_and_unprivileged() {
    // Codex's suite checks that ping fails. Raw ICMP needs CAP_NET_RAW,
    // which the sandbox never has; the unprivileged kind (SOCK_DGRAM,
    // IPPROTO_ICMP) needs the program's gid in the network namespace's
    // net.ipv4.ping_group_range, which a fresh namespace leaves empty
    // (1 to 0; read inside, both unmapped ids show as 65534): both fail
    // before anything is sent.
    expect(
        r#"for name, kind in (('raw', socket.SOCK_RAW), ('dgram', socket.SOCK_DGRAM)):
    for fam, proto in ((socket.AF_INET, socket.IPPROTO_ICMP), (socket.AF_INET6, socket.IPPROTO_ICMPV6)):
        say('icmp', name, fam == socket.AF_INET6, try_(lambda: socket.socket(fam, kind, proto)))
"#,
        "icmp raw False EPERM\nicmp raw True EPERM\nicmp dgram False EACCES\nicmp dgram True EACCES\n",
    );
}

#[test]
fn attack_af_vsock_sockets_are_refused() {
    if !x86_64("attack_af_vsock_sockets_are_refused") {
        return;
    }
    // Baseline on this kind of VM: an fd (vsock is the host bridge).
    expect(
        r#"say('AF_VSOCK SOCK_STREAM', sc(41, 40, 1, 0))
say('AF_VSOCK SOCK_DGRAM', sc(41, 40, 2, 0))
"#,
        "AF_VSOCK SOCK_STREAM EPERM\nAF_VSOCK SOCK_DGRAM EPERM\n",
    );
}

#[test]
fn attack_netlink_other_than_route_is_refused_while_route_works() {
    if !x86_64("attack_netlink_other_than_route_is_refused_while_route_works") {
        return;
    }
    // Baseline: every one of these opens.
    expect(
        r#"for name, proto in (('AUDIT', 9), ('SOCK_DIAG', 4), ('XFRM', 6), ('NETFILTER', 12), ('KOBJECT_UEVENT', 15), ('GENERIC', 16), ('CONNECTOR', 11)):
    say('NETLINK_' + name, sc(41, 16, 3, proto))
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
s.bind((0, 0))
s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + bytes(16))
say('NETLINK_ROUTE link dump names lo', b'lo\0' in s.recv(65536))
"#,
        "NETLINK_AUDIT EPERM\nNETLINK_SOCK_DIAG EPERM\nNETLINK_XFRM EPERM\nNETLINK_NETFILTER EPERM\n\
         NETLINK_KOBJECT_UEVENT EPERM\nNETLINK_GENERIC EPERM\nNETLINK_CONNECTOR EPERM\n\
         NETLINK_ROUTE link dump names lo True\n",
    );
}

#[test]
fn attack_exotic_socket_families_are_refused() {
    if !x86_64("attack_exotic_socket_families_are_refused") {
        return;
    }
    // Baseline: EAFNOSUPPORT where the module is absent, a socket where
    // it loads on demand; each has had kernel bugs.
    expect(
        r#"fams = [('AX25', 3, 5), ('IPX', 4, 2), ('APPLETALK', 5, 2), ('X25', 9, 5), ('KEY', 15, 3), ('RDS', 21, 5), ('LLC', 26, 2), ('CAN', 29, 3), ('TIPC', 30, 2), ('BLUETOOTH', 31, 3), ('ALG', 38, 5), ('NFC', 39, 5), ('QIPCRTR', 42, 2), ('SMC', 43, 1), ('XDP', 44, 3), ('MCTP', 45, 2)]
for name, fam, typ in fams:
    say('AF_' + name, sc(41, fam, typ, 0))
"#,
        "AF_AX25 EPERM\nAF_IPX EPERM\nAF_APPLETALK EPERM\nAF_X25 EPERM\nAF_KEY EPERM\nAF_RDS EPERM\n\
         AF_LLC EPERM\nAF_CAN EPERM\nAF_TIPC EPERM\nAF_BLUETOOTH EPERM\nAF_ALG EPERM\nAF_NFC EPERM\n\
         AF_QIPCRTR EPERM\nAF_SMC EPERM\nAF_XDP EPERM\nAF_MCTP EPERM\n",
    );
}

#[test]
fn attack_tcp_bind_on_loopback_is_refused_by_landlock() {
    // Baseline: binding in the sandbox's own network namespace succeeds.
    expect(
        r#"say('bind 127.0.0.1:8080', try_(lambda: socket.socket().bind(('127.0.0.1', 8080))))
say('bind 127.0.0.1:0', try_(lambda: socket.socket().bind(('127.0.0.1', 0))))
say('bind [::1]:8080', try_(lambda: socket.socket(socket.AF_INET6).bind(('::1', 8080))))
"#,
        "bind 127.0.0.1:8080 EACCES\nbind 127.0.0.1:0 EACCES\nbind [::1]:8080 EACCES\n",
    );
}

#[test]
fn attack_tcp_connect_on_loopback_is_refused_by_landlock() {
    // Baseline: ECONNREFUSED (nothing listens); EACCES is Landlock's.
    expect(
        r#"say('connect 127.0.0.1:8080', try_(lambda: socket.socket().connect(('127.0.0.1', 8080))))
say('connect 127.0.0.1:22', try_(lambda: socket.socket().connect(('127.0.0.1', 22))))
say('connect [::1]:8080', try_(lambda: socket.socket(socket.AF_INET6).connect(('::1', 8080))))
"#,
        "connect 127.0.0.1:8080 EACCES\nconnect 127.0.0.1:22 EACCES\nconnect [::1]:8080 EACCES\n",
    );
}

#[test]
fn landlock_tcp_rules_allow_exactly_the_listed_port() {
    let (_d, cfg) = config(
        "[profile.web]\nextends = \"code\"\n[profile.web.security]\ntcp_bind = [8080]\ntcp_connect = [8080]\n",
    );
    expect_with(
        &["--config", cfg.to_str().expect("utf-8"), "--profile", "web"],
        r#"srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 8080))
srv.listen(1)
c = socket.create_connection(('127.0.0.1', 8080), timeout=5)
conn, _ = srv.accept()
c.sendall(b'ping')
say('8080 round trip', conn.recv(4))
say('bind 8081', try_(lambda: socket.socket().bind(('127.0.0.1', 8081))))
say('connect 8081', try_(lambda: socket.socket().connect(('127.0.0.1', 8081))))
"#,
        "8080 round trip b'ping'\nbind 8081 EACCES\nconnect 8081 EACCES\n",
    );
}

/// A listening unix socket on the host (an agent's, a bus's), world
/// connectable, that counts the connections it accepts.
struct HostSocketListener {
    dir: tempfile::TempDir,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl HostSocketListener {
    fn start(dir: tempfile::TempDir) -> HostSocketListener {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind agent.sock");
        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o777)).expect("chmod");
        listener.set_nonblocking(true).expect("nonblocking");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        // Bounded: the thread gives up after 60 s whatever happens.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok(_) => {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        });
        HostSocketListener { dir, accepted }
    }

    fn accepted(&self) -> usize {
        // Give a connection that got through time to be counted.
        std::thread::sleep(std::time::Duration::from_millis(100));
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

const CONNECT_AGENT: &str = r#"def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect('/data/agent.sock')
say('connect', try_(connect))
say('socketpair', try_(lambda: socket.socketpair()))
"#;

#[test]
fn attack_a_host_socket_behind_a_read_only_or_writable_bind_is_unreachable() {
    for (how, dir) in [("--ro", readable_dir()), ("--rw", workdir())] {
        let agent = HostSocketListener::start(dir);
        let bind = format!("{}:/data", agent.dir.path().display());
        let (code, out, err) = attack(&[how, &bind], CONNECT_AGENT);
        assert_eq!(code, 0, "{how}: {err}");
        assert_eq!(out, "connect EPERM\nsocketpair ok\n", "{how}");
        assert_eq!(agent.accepted(), 0, "{how}: the host listener was reached");
    }
}

#[test]
fn attack_strict_profile_refuses_unix_sockets_too() {
    let agent = HostSocketListener::start(readable_dir());
    let (_cfg_dir, cfg) =
        config("[profile.s]\nextends = \"code\"\n[profile.s.security]\nseccomp = \"strict\"\n");
    let bind = format!("{}:/data", agent.dir.path().display());
    let cfg = cfg.display().to_string();
    let (code, out, err) = attack(
        &["--config", &cfg, "--profile", "s", "--ro", &bind],
        CONNECT_AGENT,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "connect EPERM\nsocketpair ok\n");
    assert_eq!(agent.accepted(), 0);
}

#[test]
fn unix_sockets_are_an_explicit_opt_in_that_reaches_the_listener() {
    // The same setup with `security.unix_sockets = true`: the connection
    // arrives, so the refusals above are the layer, not a broken test.
    let agent = HostSocketListener::start(readable_dir());
    let (_cfg, cfg) = unix_sockets_allowed();
    let bind = format!("{}:/data", agent.dir.path().display());
    let flags = ["--config", &cfg, "--profile", "agent", "--ro", &bind];
    let (code, out, err) = attack(&flags, CONNECT_AGENT);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "connect ok\nsocketpair ok\n");
    assert_eq!(agent.accepted(), 1);
}
