//! Newline-delimited messages with a size limit: a line longer than the
//! limit is skipped to its end without being kept (corral's memory stays
//! bounded), and reported with its size and first bytes so the request it
//! answers can still fail with a clear error.

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
    let mut prefix: Option<Vec<u8>> = None;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match prefix {
                Some(prefix) => Line::TooLong { len, prefix },
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
            Some(_) => {}
            None if buf.len() + take <= max => buf.extend_from_slice(&chunk[..take]),
            None => {
                let keep = max.min(PREFIX);
                let mut p = std::mem::take(buf);
                p.extend_from_slice(&chunk[..take.min(keep)]);
                p.truncate(keep);
                prefix = Some(p);
            }
        }
        reader.consume(take + usize::from(done));
        if done {
            return Ok(match prefix {
                Some(prefix) => Line::TooLong { len, prefix },
                None => Line::Complete,
            });
        }
    }
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// The numeric JSON-RPC `id` near the start of a message, if it shows
/// there (`"id":123`), for answering a request whose reply was too large
/// to read.
pub fn leading_id(prefix: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(prefix);
    let at = text.find("\"id\"")? + 4;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
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
                Line::TooLong { len, prefix } => out.push(Err((len, prefix))),
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
    fn the_id_of_a_cut_message() {
        assert_eq!(
            leading_id(br#"{"jsonrpc":"2.0","id":42,"result":{"#),
            Some(42)
        );
        assert_eq!(leading_id(br#"{"id" : 7 ,"#), Some(7));
        assert_eq!(leading_id(br#"{"jsonrpc":"2.0","result":"#), None);
        assert_eq!(leading_id(br#"{"id":"s1""#), None);
    }
}
