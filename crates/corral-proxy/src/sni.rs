//! The server name in a TLS ClientHello, and the check that it matches the
//! host the client asked the proxy for.
//!
//! Why: a tunnel to an allowed name on port 443 could otherwise carry TLS
//! to a different virtual host on the same server (domain fronting). The
//! proxy reads the client's first handshake message (possibly spread over
//! several records), never decrypts anything, and forwards the bytes
//! unchanged once the name matches.

use corral_policy::network::normalize_host;
use thiserror::Error;

/// Most handshake bytes buffered while looking for the ClientHello's end.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// TLS record content type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake message type of the ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Largest TLS plaintext record body.
const MAX_RECORD: usize = 16 * 1024;
/// Extension number of server_name.
const SERVER_NAME: u16 = 0;

/// Why the first bytes are not a usable ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HelloError {
    /// The bytes do not start a TLS handshake record.
    #[error("the client did not start TLS")]
    NotTls,
    /// A TLS record or ClientHello that does not parse.
    #[error("malformed TLS ClientHello: {0}")]
    Malformed(&'static str),
}

/// The result of reading the first bytes of a TLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed.
    Incomplete,
    /// A complete ClientHello with this server name (lower case, no
    /// trailing dot), or `None` when it carries none.
    Complete(Option<String>),
}

/// Parses the ClientHello at the start of `buf`.
pub fn parse_client_hello(buf: &[u8]) -> Result<Hello, HelloError> {
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if let Some(&kind) = rest.first() {
            if kind != HANDSHAKE {
                return Err(if handshake.is_empty() {
                    HelloError::NotTls
                } else {
                    HelloError::Malformed("non-handshake record inside the ClientHello")
                });
            }
        }
        if let Some(&major) = rest.get(1) {
            if major != 3 {
                return Err(HelloError::NotTls);
            }
        }
        if rest.len() < 5 {
            return Ok(Hello::Incomplete);
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err(HelloError::Malformed("bad record length"));
        }
        let Some(body) = rest.get(5..5 + len) else {
            return Ok(Hello::Incomplete);
        };
        handshake.extend_from_slice(body);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != CLIENT_HELLO {
                return Err(HelloError::Malformed(
                    "first handshake message is not a ClientHello",
                ));
            }
            let msg_len = usize::from(handshake[1]) << 16
                | usize::from(handshake[2]) << 8
                | usize::from(handshake[3]);
            if msg_len > MAX_CLIENT_HELLO {
                return Err(HelloError::Malformed("ClientHello too large"));
            }
            if let Some(msg) = handshake.get(4..4 + msg_len) {
                return server_name(msg).map(Hello::Complete);
            }
        }
    }
}

/// A cursor over a byte slice; every read checks bounds.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed("truncated ClientHello"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    /// One byte.
    fn u8(&mut self) -> Result<u8, HelloError> {
        Ok(self.take(1)?[0])
    }

    /// A big-endian u16.
    fn u16(&mut self) -> Result<u16, HelloError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self) -> Result<&'a [u8], HelloError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    /// Whether everything was read.
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The server_name of a ClientHello body (after the 4-byte header).
fn server_name(msg: &[u8]) -> Result<Option<String>, HelloError> {
    let mut r = Reader(msg);
    r.take(2 + 32)?; // legacy_version, random
    let session_id = r.vec8()?;
    if session_id.len() > 32 {
        return Err(HelloError::Malformed("session id longer than 32 bytes"));
    }
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    if r.is_empty() {
        return Ok(None); // no extensions at all
    }
    let mut exts = Reader(r.vec16()?);
    if !r.is_empty() {
        return Err(HelloError::Malformed("bytes after the extensions"));
    }
    let mut found = None;
    while !exts.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != SERVER_NAME {
            continue;
        }
        if found.is_some() {
            return Err(HelloError::Malformed("two server_name extensions"));
        }
        found = Some(host_name(data)?);
    }
    Ok(found)
}

/// The single host_name entry of a server_name extension.
fn host_name(data: &[u8]) -> Result<String, HelloError> {
    let mut outer = Reader(data);
    let mut list = Reader(outer.vec16()?);
    if !outer.is_empty() {
        return Err(HelloError::Malformed("bytes after the server name list"));
    }
    let mut name = None;
    while !list.is_empty() {
        let kind = list.u8()?;
        let value = list.vec16()?;
        if kind != 0 {
            continue;
        }
        if name.is_some() {
            return Err(HelloError::Malformed("two host names in server_name"));
        }
        let text = std::str::from_utf8(value)
            .map_err(|_| HelloError::Malformed("server name is not text"))?;
        name = Some(
            normalize_host(text).ok_or(HelloError::Malformed("server name is not a host name"))?,
        );
    }
    name.ok_or(HelloError::Malformed("server_name without a host name"))
}

/// What to do with a tunnel after seeing its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SniVerdict {
    /// Read more bytes and ask again.
    NeedMore,
    /// The ClientHello names the expected host: forward.
    Match,
    /// Close the tunnel, for this reason.
    Refuse(String),
}

/// Checks the first bytes a client sent through a tunnel to
/// `expected_host` (normalised): the ClientHello must carry a server name
/// equal to it.
pub fn sni_verdict(expected_host: &str, first_bytes: &[u8]) -> SniVerdict {
    match parse_client_hello(first_bytes) {
        Ok(Hello::Incomplete) if first_bytes.len() >= MAX_CLIENT_HELLO => SniVerdict::Refuse(
            format!("no complete ClientHello within {MAX_CLIENT_HELLO} bytes"),
        ),
        Ok(Hello::Incomplete) => SniVerdict::NeedMore,
        Ok(Hello::Complete(Some(name))) if name == expected_host => SniVerdict::Match,
        Ok(Hello::Complete(Some(name))) => SniVerdict::Refuse(format!(
            "TLS server name {name} does not match the requested host {expected_host}"
        )),
        Ok(Hello::Complete(None)) => SniVerdict::Refuse(format!(
            "the TLS ClientHello names no server; {expected_host} was requested"
        )),
        Err(e) => SniVerdict::Refuse(format!("{e} on port 443 (sni_check)")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn vec16(body: &[u8]) -> Vec<u8> {
        let len = u16::try_from(body.len()).expect("a test vector under 64 KiB");
        let mut v = len.to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    /// A ClientHello handshake message; `names` become host_name entries
    /// of one server_name extension (none: no extension).
    pub(crate) fn client_hello(names: &[&str]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]); // random
        body.push(0); // session id
        body.extend_from_slice(&vec16(&[0x13, 0x01])); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut exts = Vec::new();
        exts.extend_from_slice(&[0x00, 0x0a]); // supported_groups, before SNI
        exts.extend_from_slice(&vec16(&vec16(&[0x00, 0x1d])));
        if !names.is_empty() {
            let mut list = Vec::new();
            for name in names {
                list.push(0);
                list.extend_from_slice(&vec16(name.as_bytes()));
            }
            exts.extend_from_slice(&SERVER_NAME.to_be_bytes());
            exts.extend_from_slice(&vec16(&vec16(&list)));
        }
        body.extend_from_slice(&vec16(&exts));
        let mut msg = vec![CLIENT_HELLO];
        let len = u32::try_from(body.len()).expect("a test hello under 4 GiB");
        msg.extend_from_slice(&len.to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    /// `msg` wrapped in handshake records of at most `chunk` bytes each.
    pub(crate) fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&vec16(part));
        }
        out
    }

    #[test]
    fn reads_the_server_name() {
        let rec = records(&client_hello(&["SNI.Test."]), MAX_RECORD);
        assert_eq!(
            parse_client_hello(&rec),
            Ok(Hello::Complete(Some("sni.test".into())))
        );
        // Every strict prefix is incomplete, never an error or a panic.
        for cut in 0..rec.len() {
            assert_eq!(
                parse_client_hello(&rec[..cut]),
                Ok(Hello::Incomplete),
                "cut at {cut}"
            );
        }
        // Bytes after the hello (the next record) do not matter.
        let mut more = rec.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(
            parse_client_hello(&more),
            Ok(Hello::Complete(Some("sni.test".into())))
        );
    }

    #[test]
    fn reassembles_a_hello_split_over_records() {
        let rec = records(&client_hello(&["a.sni.test"]), 7);
        assert_eq!(
            parse_client_hello(&rec),
            Ok(Hello::Complete(Some("a.sni.test".into())))
        );
    }

    #[test]
    fn hello_without_server_name() {
        let rec = records(&client_hello(&[]), MAX_RECORD);
        assert_eq!(parse_client_hello(&rec), Ok(Hello::Complete(None)));
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(
            parse_client_hello(b"GET / HTTP/1.1\r\n"),
            Err(HelloError::NotTls)
        );
        assert_eq!(parse_client_hello(b"\x16\x02"), Err(HelloError::NotTls));
        assert!(
            parse_client_hello(&[22, 3, 1, 0, 0]).is_err(),
            "empty record"
        );
        assert!(
            parse_client_hello(&[22, 3, 1, 0x50, 0]).is_err(),
            "oversized record"
        );
        assert!(
            parse_client_hello(&records(&[2, 0, 0, 0], 100)).is_err(),
            "ServerHello"
        );
        let two = records(&client_hello(&["a.test", "b.test"]), MAX_RECORD);
        assert!(parse_client_hello(&two).is_err(), "two host names");
        let bad_name = records(&client_hello(&["a b"]), MAX_RECORD);
        assert!(parse_client_hello(&bad_name).is_err());
        // A hello whose inner lengths overrun its (consistently framed) body.
        let mut msg = client_hello(&["a.test"]);
        msg.truncate(msg.len() - 3);
        let body_len = u32::try_from(msg.len() - 4).expect("a test hello under 4 GiB");
        msg[1..4].copy_from_slice(&body_len.to_be_bytes()[1..]);
        assert_eq!(
            parse_client_hello(&records(&msg, MAX_RECORD)),
            Err(HelloError::Malformed("truncated ClientHello"))
        );
        // Arbitrary bytes after a handshake header never panic.
        for seed in 0u8..=255 {
            let mut junk = vec![22, 3, 1, 0, 64, 1, 0, 0, 60];
            junk.extend((0..60).map(|i| seed.wrapping_mul(31).wrapping_add(i)));
            let _ = parse_client_hello(&junk);
        }
    }

    #[test]
    fn verdicts() {
        let hello = |names: &[&str]| records(&client_hello(names), MAX_RECORD);
        assert_eq!(
            sni_verdict("sni.test", &hello(&["sni.test"])),
            SniVerdict::Match
        );
        assert_eq!(
            sni_verdict("sni.test", &hello(&["SNI.TEST"])),
            SniVerdict::Match
        );
        assert_eq!(
            sni_verdict("sni.test", &hello(&["sni.test"])[..10]),
            SniVerdict::NeedMore
        );
        let other = sni_verdict("sni.test", &hello(&["other.test"]));
        assert_eq!(
            other,
            SniVerdict::Refuse(
                "TLS server name other.test does not match the requested host sni.test".into()
            )
        );
        assert!(matches!(
            sni_verdict("sni.test", &hello(&[])),
            SniVerdict::Refuse(_)
        ));
        assert!(matches!(
            sni_verdict("sni.test", b"GET / HTTP/1.1\r\n\r\n"),
            SniVerdict::Refuse(_)
        ));
        // A hello that claims the maximum size and never completes.
        let mut endless = vec![CLIENT_HELLO, 0x01, 0x00, 0x00];
        endless.resize(MAX_CLIENT_HELLO, 0);
        let endless = records(&endless, MAX_RECORD);
        assert_eq!(parse_client_hello(&endless), Ok(Hello::Incomplete));
        assert!(matches!(
            sni_verdict("sni.test", &endless),
            SniVerdict::Refuse(_)
        ));
    }
}
