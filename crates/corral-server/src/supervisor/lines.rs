//! Newline-delimited messages with a size limit: a line longer than the
//! limit is skipped to its end without being kept (corral's memory stays
//! bounded), and reported with its size, first bytes and top-level numeric
//! `id` (found by a scan of every byte, wherever the id is: the TypeScript
//! SDK writes it after the result) so the request it answers can still fail
//! with a clear error.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Most leading bytes of an oversized line kept (the limit itself when
/// smaller: a log line cut at 1 KiB keeps its first KiB).
const PREFIX: usize = 64 << 10;

/// One read.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A whole line (without its newline) is in the buffer.
    Complete,
    /// A line of `len` bytes, more than the limit; `prefix` holds its start.
    TooLong {
        /// Its full length.
        len: u64,
        /// Its first bytes.
        prefix: Vec<u8>,
        /// Its top-level numeric `"id"`, if it is a JSON object with one.
        id: Option<u64>,
    },
    /// End of the stream (a last line without newline is `Complete` first).
    Eof,
}

/// Reads the next line into `buf` (cleared first), keeping at most `max`
/// bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    let mut len: u64 = 0;
    let mut prefix: Option<(Vec<u8>, IdScanner)> = None;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match prefix {
                Some((prefix, scan)) => Line::TooLong {
                    len,
                    prefix,
                    id: scan.id(),
                },
                None if len == 0 => Line::Eof,
                None => Line::Complete,
            });
        }
        let (take, done) = match memchr(chunk) {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        len += take as u64;
        match &mut prefix {
            Some((_, scan)) => scan.feed(&chunk[..take]),
            None if buf.len() + take <= max => buf.extend_from_slice(&chunk[..take]),
            None => {
                let keep = max.min(PREFIX);
                let mut scan = IdScanner::default();
                scan.feed(buf);
                scan.feed(&chunk[..take]);
                let mut p = std::mem::take(buf);
                p.extend_from_slice(&chunk[..take.min(keep)]);
                p.truncate(keep);
                prefix = Some((p, scan));
            }
        }
        reader.consume(take + usize::from(done));
        if done {
            return Ok(match prefix {
                Some((prefix, scan)) => Line::TooLong {
                    len,
                    prefix,
                    id: scan.id(),
                },
                None => Line::Complete,
            });
        }
    }
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Finds the numeric `"id"` member of a JSON object fed to it in pieces,
/// at the object's top level only (an `"id"` inside the result, or inside
/// a string, is not the message's), in constant memory.
#[derive(Debug, Default)]
pub struct IdScanner {
    /// Nesting depth: 1 inside the message object.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a member name.
    expect_key: bool,
    /// The member name being read is (so far) a prefix of `id`.
    key: KeyState,
    /// The last member name was `id`: its value follows the colon.
    id_key: bool,
    /// Reading the id's digits.
    in_value: bool,
    value: Option<u64>,
    found: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// Not reading a member name (or it cannot be `id`).
    #[default]
    No,
    /// Read this many bytes of `id`.
    Matched(usize),
}

impl IdScanner {
    /// Scans the next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// The top-level numeric id seen, if any.
    pub fn id(&self) -> Option<u64> {
        self.found
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
                self.key = KeyState::No;
            } else if b == b'\\' {
                self.escaped = true;
                self.key = KeyState::No;
            } else if b == b'"' {
                self.in_string = false;
                self.id_key = self.key == KeyState::Matched(2);
                self.key = KeyState::No;
            } else if let KeyState::Matched(n) = self.key {
                self.key = if n < 2 && b"id"[n] == b {
                    KeyState::Matched(n + 1)
                } else {
                    KeyState::No
                };
            }
            return;
        }
        if self.in_value {
            if b.is_ascii_digit() {
                let d = u64::from(b - b'0');
                self.value = self
                    .value
                    .unwrap_or(0)
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(d));
                return;
            }
            if self.value.is_none() && b.is_ascii_whitespace() {
                return;
            }
            self.in_value = false;
            if self.found.is_none() {
                self.found = self.value;
            }
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.key = if self.depth == 1 && self.expect_key {
                    KeyState::Matched(0)
                } else {
                    KeyState::No
                };
                self.expect_key = false;
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.expect_key = self.depth == 1 && b == b'{';
                self.id_key = false;
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.id_key = false;
            }
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.id_key = false;
            }
            b':' if self.depth == 1 && self.id_key => {
                self.id_key = false;
                self.in_value = true;
                self.value = None;
            }
            _ => {}
        }
    }
}

/// The top-level numeric `id` of a whole message.
#[cfg(test)]
fn id_of(message: &[u8]) -> Option<u64> {
    let mut s = IdScanner::default();
    s.feed(message);
    s.feed(b"\n");
    s.id()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Result<Vec<u8>, (u64, Vec<u8>)>> {
        // A tiny buffer: lines cross many fill_buf calls.
        let mut r = tokio::io::BufReader::with_capacity(3, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            match read_line(&mut r, &mut buf, max).await.unwrap() {
                Line::Complete => out.push(Ok(buf.clone())),
                Line::TooLong { len, prefix, .. } => out.push(Err((len, prefix))),
                Line::Eof => return out,
            }
        }
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_and_longer_ones_are_skipped_whole() {
        let got = lines(b"ab\n0123456789\ncd\nlast", 5).await;
        assert_eq!(
            got,
            vec![
                Ok(b"ab".to_vec()),
                Err((10, b"01234".to_vec())),
                Ok(b"cd".to_vec()),
                Ok(b"last".to_vec()),
            ]
        );
        assert_eq!(lines(b"", 5).await, vec![]);
        assert_eq!(lines(b"\n", 5).await, vec![Ok(vec![])]);
    }

    #[test]
    fn the_top_level_id_wherever_it_is() {
        assert_eq!(id_of(br#"{"jsonrpc":"2.0","id":42,"result":{}}"#), Some(42));
        assert_eq!(id_of(br#"{"id" : 7 ,"x":1}"#), Some(7));
        // The TypeScript SDK's order, with ids inside the result.
        assert_eq!(
            id_of(br#"{"result":{"id":1,"a":[{"id":2}],"s":"\"id\":3"},"jsonrpc":"2.0","id":9}"#),
            Some(9)
        );
        assert_eq!(id_of(br#"{"jsonrpc":"2.0","result":{"id":5}}"#), None);
        assert_eq!(id_of(br#"{"id":"s1"}"#), None);
        assert_eq!(id_of(br#"{"idx":4,"xid":5}"#), None);
        assert_eq!(id_of(br#"{"k":"id","v":":3"}"#), None);
    }

    #[tokio::test]
    async fn an_oversized_line_reports_its_id_even_after_the_limit() {
        let line = format!(
            r#"{{"result":{{"id":1,"t":"{}"}},"jsonrpc":"2.0","id":31}}"#,
            "x".repeat(100)
        );
        let input = format!("{line}\n");
        let mut r = tokio::io::BufReader::with_capacity(7, input.as_bytes());
        let mut buf = Vec::new();
        match read_line(&mut r, &mut buf, 20).await.unwrap() {
            Line::TooLong { len, prefix, id } => {
                assert_eq!(len, line.len() as u64);
                assert_eq!(prefix, line.as_bytes()[..20].to_vec());
                assert_eq!(id, Some(31));
            }
            other => panic!("{other:?}"),
        }
    }
}
