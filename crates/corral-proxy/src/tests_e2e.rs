//! End-to-end tests over real loopback sockets: a started proxy, upstream
//! servers on 127.0.0.1, plain blocking clients. Only loopback addresses
//! are ever dialled.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use corral_policy::{Cidr, DomainRule, NetworkMode, NetworkPolicy};

use crate::sni::tests::{client_hello, records};
use crate::{code, protocol, start, ConnectionEvent, ProxyConfig, ProxyHandle};

const WAIT: Duration = Duration::from_secs(5);

fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

/// An upstream that echoes each connection until the client closes.
fn echo_server() -> u16 {
    let l = listener();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut stream) = stream else { return };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// An upstream HTTP server: sends each request it receives (head and
/// Content-Length body) on the channel and answers `hello`.
fn http_server() -> (u16, mpsc::Receiver<String>) {
    let l = listener();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = Vec::new();
            let mut byte = [0u8; 1];
            while !buf.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                buf.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; length];
            let _ = stream.read_exact(&mut body);
            let _ = tx.send(format!("{head}{}", String::from_utf8_lossy(&body)));
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    (port, rx)
}

/// A policy allowing `allowed.test:<port>`, mapped to 127.0.0.1, with
/// 127.0.0.1/32 allowed when `cidr` is set.
fn policy(port: u16, cidr: bool) -> NetworkPolicy {
    let mut p = NetworkPolicy {
        mode: NetworkMode::Allow,
        allow_domains: vec![DomainRule::parse(&format!("allowed.test:{port}")).unwrap()],
        deny_domains: vec![DomainRule::parse("denied.test").unwrap()],
        allow_cidrs: if cidr {
            vec![Cidr::parse("127.0.0.1/32").unwrap()]
        } else {
            Vec::new()
        },
        ..NetworkPolicy::default()
    };
    p.hosts
        .insert("allowed.test".into(), "127.0.0.1".parse().unwrap());
    p.hosts
        .insert("denied.test".into(), "127.0.0.1".parse().unwrap());
    p
}

fn proxy(policy: NetworkPolicy) -> ProxyHandle {
    start(listener(), listener(), ProxyConfig::new(policy)).unwrap()
}

fn client(addr: std::net::SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// Reads up to the end of a response head.
fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            other => panic!(
                "head cut short after {:?}: {other:?}",
                String::from_utf8_lossy(&buf)
            ),
        }
    }
    String::from_utf8(buf).unwrap()
}

/// Reads until the proxy closes (a reset counts as closing).
fn read_to_end(s: &mut TcpStream) -> String {
    String::from_utf8_lossy(&read_bytes(s)).into_owned()
}

/// The raw bytes until the proxy closes.
fn read_bytes(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read failed after {out:?}: {e}"),
        }
    }
    out
}

/// Sends a request on the HTTP listener and returns the whole answer.
fn http_request(handle: &ProxyHandle, request: &str) -> String {
    let mut s = client(handle.http_addr());
    s.write_all(request.as_bytes()).unwrap();
    read_to_end(&mut s)
}

fn connect_request(target: &str) -> String {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
}

/// Opens a CONNECT tunnel and checks the 200.
fn open_tunnel(handle: &ProxyHandle, target: &str) -> TcpStream {
    let mut s = client(handle.http_addr());
    s.write_all(connect_request(target).as_bytes()).unwrap();
    let head = read_head(&mut s);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s
}

/// SOCKS5 greeting and CONNECT; returns the stream and the reply code.
fn socks_connect(handle: &ProxyHandle, target: &[u8], port: u16) -> (TcpStream, u8) {
    let mut s = client(handle.socks_addr());
    s.write_all(&[5, 1, 0]).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    assert_eq!(method, [5, 0]);
    let mut request = vec![5, 1, 0];
    request.extend_from_slice(target);
    request.extend_from_slice(&port.to_be_bytes());
    s.write_all(&request).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!((reply[0], reply[2], reply[3]), (5, 0, 1), "{reply:?}");
    (s, reply[1])
}

fn socks_domain(name: &str) -> Vec<u8> {
    let len = u8::try_from(name.len()).expect("a SOCKS5 domain under 256 bytes");
    let mut t = vec![3, len];
    t.extend_from_slice(name.as_bytes());
    t
}

/// Echoes `data` through an open tunnel, then closes and waits for the
/// far side to close too.
fn echo_through(s: &mut TcpStream, data: &[u8]) {
    s.write_all(data).unwrap();
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_to_end(s), "");
}

fn only(events: &[ConnectionEvent]) -> &ConnectionEvent {
    assert_eq!(events.len(), 1, "{events:#?}");
    &events[0]
}

fn header_reason(answer: &str) -> &str {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("X-Corral-Reason: "))
        .unwrap_or_else(|| panic!("no X-Corral-Reason in {answer}"))
}

#[test]
fn connect_tunnel_relays_and_counts_bytes() {
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let mut s = open_tunnel(&handle, &format!("allowed.test:{port}"));
    echo_through(&mut s, b"hello, tunnel");
    let events = handle.stop();
    let e = only(&events);
    assert!(e.allowed, "{e:?}");
    assert_eq!((e.code, e.protocol), (code::ALLOWED, protocol::CONNECT));
    assert_eq!(e.domain.as_deref(), Some("allowed.test"));
    assert_eq!(e.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(e.port, port);
    assert_eq!(
        e.rule.as_deref(),
        Some(format!("allowed.test:{port}").as_str())
    );
    assert_eq!((e.bytes_up, e.bytes_down), (13, 13));
    assert!(
        e.message
            .contains("address allowed by allow_cidrs 127.0.0.1/32"),
        "{}",
        e.message
    );
}

#[test]
fn bulk_tunnel_traffic_arrives_intact_both_ways() {
    // Several pipe rounds each way, sent while the echo flows back, so the
    // splice relay's partial drains and its half-close are exercised.
    const TOTAL: usize = 24 << 20;
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let s = open_tunnel(&handle, &format!("allowed.test:{port}"));
    let mut writer = s.try_clone().unwrap();
    let pattern = |i: usize| u8::try_from(i % 251).expect("below 251");
    let sender = thread::spawn(move || {
        let chunk: Vec<u8> = (0..1 << 16).map(pattern).collect();
        for _ in 0..TOTAL / chunk.len() {
            writer.write_all(&chunk).unwrap();
        }
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut reader = s;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (k, b) in buf[..n].iter().enumerate() {
            assert_eq!(*b, pattern((got + k) % (1 << 16)), "byte {}", got + k);
        }
        got += n;
    }
    sender.join().unwrap();
    assert_eq!(got, TOTAL);
    let events = handle.stop();
    let e = only(&events);
    assert_eq!((e.bytes_up, e.bytes_down), (TOTAL as u64, TOTAL as u64));
}

#[test]
fn absolute_form_request_is_forwarded_in_origin_form() {
    let (port, requests) = http_server();
    let handle = proxy(policy(port, true));
    let request = format!(
        "POST http://Allowed.Test:{port}/path?q=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nContent-Length: 3\r\nAccept: */*\r\n\r\nabc"
    );
    let answer = http_request(&handle, &request);
    assert_eq!(
        answer,
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    );
    let seen = requests.recv_timeout(WAIT).unwrap();
    assert_eq!(
        seen,
        format!("POST /path?q=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nContent-Length: 3\r\nAccept: */*\r\nConnection: close\r\n\r\nabc")
    );
    let events = handle.stop();
    let e = only(&events);
    assert_eq!((e.code, e.protocol), (code::ALLOWED, protocol::HTTP));
    assert_eq!(e.bytes_up, seen.len() as u64);
    assert_eq!(e.bytes_down, answer.len() as u64);
}

#[test]
fn socks5_with_a_domain_is_resolved_by_the_proxy() {
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let (mut s, reply) = socks_connect(&handle, &socks_domain("allowed.test"), port);
    assert_eq!(reply, 0);
    echo_through(&mut s, b"socks!");
    let events = handle.stop();
    let e = only(&events);
    assert_eq!((e.code, e.protocol), (code::ALLOWED, protocol::SOCKS5));
    assert_eq!(e.domain.as_deref(), Some("allowed.test"));
    assert_eq!((e.bytes_up, e.bytes_down), (6, 6));
}

#[test]
fn policy_refusals_answer_403_naming_the_rule() {
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let cases = [
        (format!("denied.test:{port}"), code::DENIED_DOMAIN, "refused: deny_domains rule denied.test matches denied.test".to_string()),
        (
            format!("unknown.test:{port}"),
            code::DENIED_NOT_ALLOWED,
            format!("corral: unknown.test:{port} refused: no allow_domains rule matches unknown.test (allowed: allowed.test:{port})"),
        ),
        ("allowed.test:1".to_string(), code::DENIED_PORT, format!("port 1 is not allowed for allowed.test (allowed ports: {port})")),
    ];
    for (target, want_code, want_text) in &cases {
        let answer = http_request(&handle, &connect_request(target));
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert_eq!(header_reason(&answer), *want_code);
        assert!(answer.contains(want_text.as_str()), "{answer}");
    }
    let events = handle.stop();
    let codes: Vec<&str> = events.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        [
            code::DENIED_DOMAIN,
            code::DENIED_NOT_ALLOWED,
            code::DENIED_PORT
        ]
    );
    assert_eq!(events[0].rule.as_deref(), Some("denied.test"));
    assert!(events
        .iter()
        .all(|e| !e.allowed && e.bytes_up == 0 && e.bytes_down == 0));
}

#[test]
fn name_mapped_to_loopback_needs_a_cidr() {
    let port = echo_server();
    let handle = proxy(policy(port, false));
    let answer = http_request(&handle, &connect_request(&format!("allowed.test:{port}")));
    assert_eq!(header_reason(&answer), code::DENIED_ADDRESS);
    assert!(
        answer.contains("allowed.test resolves only to refused addresses: 127.0.0.1 (loopback)"),
        "{answer}"
    );
    let (_s, reply) = socks_connect(&handle, &socks_domain("allowed.test"), port);
    assert_eq!(reply, 2, "not allowed by ruleset");
    let events = handle.stop();
    assert_eq!(events.len(), 2);
    for e in &events {
        assert_eq!(e.code, code::DENIED_ADDRESS);
        assert_eq!(e.address.as_deref(), Some("127.0.0.1"));
    }
}

#[test]
fn names_resolved_by_dns_are_screened_too() {
    // `localhost` comes from the system resolver (/etc/hosts), not from a
    // static entry: every address it yields is loopback.
    let port = echo_server();
    let mut p = policy(port, false);
    p.allow_domains
        .push(DomainRule::parse(&format!("localhost:{port}")).unwrap());
    let handle = proxy(p.clone());
    let answer = http_request(&handle, &connect_request(&format!("localhost:{port}")));
    assert_eq!(header_reason(&answer), code::DENIED_ADDRESS, "{answer}");
    assert!(answer.contains("(loopback)"), "{answer}");
    handle.stop();
    // With the CIDR, the proxy connects to exactly the IPv4 address it checked.
    p.allow_cidrs.push(Cidr::parse("127.0.0.1/32").unwrap());
    let handle = proxy(p);
    let mut s = open_tunnel(&handle, &format!("localhost:{port}"));
    echo_through(&mut s, b"resolved");
    let events = handle.stop();
    assert_eq!(only(&events).address.as_deref(), Some("127.0.0.1"));
}

#[test]
fn ip_literals_need_a_cidr() {
    let port = echo_server();
    let handle = proxy(policy(port, false));
    for target in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::1]:{port}"),
        format!("2130706433:{port}"),
    ] {
        let answer = http_request(&handle, &connect_request(&target));
        assert!(answer.starts_with("HTTP/1.1 403 "), "{target}: {answer}");
        assert_eq!(header_reason(&answer), code::DENIED_IP_LITERAL, "{target}");
    }
    let answer = http_request(
        &handle,
        &format!("GET http://[::1]:{port}/ HTTP/1.1\r\n\r\n"),
    );
    assert_eq!(header_reason(&answer), code::DENIED_IP_LITERAL);
    let (_s, reply) = socks_connect(&handle, &[1, 127, 0, 0, 1], port);
    assert_eq!(reply, 2);
    let events = handle.stop();
    assert_eq!(events.len(), 6);
    assert!(
        events.iter().all(|e| e.code == code::DENIED_IP_LITERAL),
        "{events:#?}"
    );
    assert_eq!(events[1].address.as_deref(), Some("::ffff:127.0.0.1"));
    assert_eq!(events[5].protocol, protocol::SOCKS5);

    // An allowed CIDR admits exactly its own family and range.
    let handle = proxy(policy(port, true));
    let mut s = open_tunnel(&handle, &format!("127.0.0.1:{port}"));
    echo_through(&mut s, b"literal");
    let answer = http_request(
        &handle,
        &connect_request(&format!("[::ffff:127.0.0.1]:{port}")),
    );
    assert_eq!(header_reason(&answer), code::DENIED_IP_LITERAL);
    let events = handle.stop();
    assert_eq!(events[0].code, code::ALLOWED);
    assert_eq!(events[0].rule.as_deref(), Some("127.0.0.1/32"));
    assert_eq!(events[1].code, code::DENIED_IP_LITERAL);
}

#[test]
fn socks5_refusals_use_reply_codes() {
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let (mut s, reply) = socks_connect(&handle, &socks_domain("unknown.test"), port);
    assert_eq!(reply, 2);
    assert!(read_bytes(&mut s).is_empty(), "closed after the refusal");
    drop(s);
    thread::sleep(Duration::from_millis(50));
    // BIND is not supported.
    let mut s = client(handle.socks_addr());
    s.write_all(&[5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80])
        .unwrap();
    assert_eq!(read_bytes(&mut s), [5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0]);
    // Username/password only: no acceptable method.
    let mut s = client(handle.socks_addr());
    s.write_all(&[5, 1, 2]).unwrap();
    assert_eq!(read_bytes(&mut s), [5, 0xff]);
    let events = handle.stop();
    let codes: Vec<&str> = events.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        [
            code::DENIED_NOT_ALLOWED,
            code::ERROR_PROTOCOL,
            code::ERROR_PROTOCOL
        ]
    );
}

#[test]
fn malformed_input_gets_400_and_never_a_panic() {
    let handle = proxy(policy(1, true));
    let garbage = [
        "hello\r\n\r\n".to_string(),
        "GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n".to_string(),
        "GET https://allowed.test/ HTTP/1.1\r\n\r\n".to_string(),
        format!("GET http://allowed.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(20_000)),
        format!("GET http://allowed.test/{} HTTP/1.1\r\n\r\n", "a".repeat(9_000)),
        "GET http://allowed.test/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n".to_string(),
        "\x16\x03\x01\x00\x05hello\r\n\r\n".to_string(),
    ];
    for request in &garbage {
        let answer = http_request(&handle, request);
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{request:.60?}: {answer}"
        );
        assert_eq!(header_reason(&answer), code::ERROR_PROTOCOL);
    }
    // A client that connects and leaves; a SOCKS listener fed HTTP.
    drop(client(handle.http_addr()));
    let mut s = client(handle.socks_addr());
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(read_to_end(&mut s), "");
    let events = handle.stop();
    assert_eq!(events.len(), garbage.len() + 2, "{events:#?}");
    assert!(events
        .iter()
        .all(|e| e.code == code::ERROR_PROTOCOL && !e.allowed));
}

#[test]
fn connection_limit_refuses_the_excess() {
    let port = echo_server();
    let mut p = policy(port, true);
    p.max_connections = 1;
    let handle = proxy(p);
    let target = format!("allowed.test:{port}");
    let mut first = open_tunnel(&handle, &target);
    let answer = http_request(&handle, &connect_request(&target));
    assert!(
        answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{answer}"
    );
    assert_eq!(header_reason(&answer), code::DENIED_LIMIT);
    assert!(answer.contains("max_connections"), "{answer}");
    let (_s, reply) = socks_connect(&handle, &socks_domain("allowed.test"), port);
    assert_eq!(reply, 2);
    echo_through(&mut first, b"still fine");
    drop(first);
    // The slot comes back once the first connection has ended.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut s = client(handle.http_addr());
        s.write_all(connect_request(&target).as_bytes()).unwrap();
        let head = read_head(&mut s);
        if head.starts_with("HTTP/1.1 200 ") {
            echo_through(&mut s, b"again");
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed: {head}");
        thread::sleep(Duration::from_millis(20));
    }
    let events = handle.stop();
    let limited: Vec<&ConnectionEvent> = events
        .iter()
        .filter(|e| e.code == code::DENIED_LIMIT)
        .collect();
    assert!(limited.len() >= 2, "{events:#?}");
    assert!(limited.iter().any(|e| e.protocol == protocol::SOCKS5));
    assert_eq!(events.iter().filter(|e| e.code == code::ALLOWED).count(), 2);
}

#[test]
fn idle_tunnels_are_closed() {
    let port = echo_server();
    let mut p = policy(port, true);
    p.idle_timeout_secs = 1;
    let handle = proxy(p);
    let mut s = open_tunnel(&handle, &format!("allowed.test:{port}"));
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    let quiet = Instant::now();
    assert_eq!(read_to_end(&mut s), "", "the proxy closes the idle tunnel");
    let waited = quiet.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    let events = handle.stop();
    let e = only(&events);
    assert!(e.message.contains("closed after 1 s idle"), "{}", e.message);
    assert_eq!((e.bytes_up, e.bytes_down), (4, 4));
}

#[test]
fn stop_closes_connections_and_returns_events_in_order() {
    let port = echo_server();
    let handle = proxy(policy(port, true));
    let target = format!("allowed.test:{port}");
    let http_addr = handle.http_addr();
    http_request(&handle, &connect_request("unknown.test:80"));
    thread::sleep(Duration::from_millis(100));
    let mut s = open_tunnel(&handle, &target);
    echo_through(&mut s, b"second");
    // Wait until the tunnel's event is in before the next request.
    thread::sleep(Duration::from_millis(100));
    http_request(&handle, &connect_request("denied.test:80"));
    let mut held = open_tunnel(&handle, &target);
    held.write_all(b"x").unwrap();
    let mut back = [0u8; 1];
    held.read_exact(&mut back).unwrap();
    let events = handle.stop();
    let codes: Vec<&str> = events.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        [
            code::DENIED_NOT_ALLOWED,
            code::ALLOWED,
            code::DENIED_DOMAIN,
            code::ALLOWED
        ]
    );
    assert!(
        events[3].message.contains("the proxy stopped"),
        "{}",
        events[3].message
    );
    assert_eq!(events[3].bytes_up, 1);
    assert_eq!(read_to_end(&mut held), "", "stop closed the held tunnel");
    // And nothing listens any more.
    assert!(TcpStream::connect_timeout(&http_addr, Duration::from_millis(200)).is_err());
}

#[test]
fn events_beyond_the_cap_are_counted() {
    let handle = start(
        listener(),
        listener(),
        ProxyConfig {
            max_events: 2,
            ..ProxyConfig::new(policy(1, true))
        },
    )
    .unwrap();
    for _ in 0..3 {
        http_request(&handle, &connect_request("unknown.test:80"));
    }
    let report = handle.stop_report();
    assert_eq!((report.events.len(), report.events_dropped), (2, 1));
}

/// Binds 127.0.0.1:443 for the SNI test, or says why it cannot.
fn bind_443() -> Option<TcpListener> {
    match TcpListener::bind("127.0.0.1:443") {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("SKIP sni_check end-to-end: cannot bind 127.0.0.1:443 ({e}); needs root or a low ip_unprivileged_port_start");
            None
        }
    }
}

#[test]
fn sni_must_match_on_port_443() {
    let Some(upstream) = bind_443() else { return };
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in upstream.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut got = Vec::new();
            let _ = stream.read_to_end(&mut got);
            let _ = tx.send(got);
        }
    });
    let mut p = policy(443, true);
    p.allow_domains = vec![DomainRule::parse("sni.test:443").unwrap()];
    p.hosts
        .insert("sni.test".into(), "127.0.0.1".parse().unwrap());
    let handle = proxy(p);
    let good = records(&client_hello(&["sni.test"]), 100);
    let attempts: [(&[u8], bool); 4] = [
        (&records(&client_hello(&["other.test"]), 16384), false),
        (&records(&client_hello(&[]), 16384), false),
        (b"GET / HTTP/1.1\r\nHost: sni.test\r\n\r\n", false),
        (&good, true),
    ];
    for (first, forwarded) in attempts {
        let mut s = open_tunnel(&handle, "sni.test:443");
        s.write_all(first).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        assert_eq!(read_to_end(&mut s), "");
        let seen = rx.recv_timeout(WAIT).unwrap();
        if forwarded {
            assert_eq!(seen, good, "the hello is forwarded unchanged");
        } else {
            assert!(seen.is_empty(), "nothing reaches the destination");
        }
    }
    // The same check applies to SOCKS5 tunnels.
    let (mut s, reply) = socks_connect(&handle, &socks_domain("sni.test"), 443);
    assert_eq!(reply, 0);
    s.write_all(&records(&client_hello(&["other.test"]), 16384))
        .unwrap();
    assert_eq!(read_to_end(&mut s), "");
    let events = handle.stop();
    let codes: Vec<&str> = events.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        [
            code::DENIED_SNI_MISMATCH,
            code::DENIED_SNI_MISMATCH,
            code::DENIED_SNI_MISMATCH,
            code::ALLOWED,
            code::DENIED_SNI_MISMATCH
        ]
    );
    assert!(events[0]
        .message
        .contains("TLS server name other.test does not match the requested host sni.test"));
    assert_eq!(events[3].bytes_up, good.len() as u64);
}
