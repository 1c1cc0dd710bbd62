//! Client bytes made safe to print: refusal bodies and audit messages
//! quote what the sandbox sent, which may be anything.

/// At most this many characters of client input are quoted.
const MAX_SHOWN: usize = 80;

/// `bytes` as printable text: control and non-ASCII bytes escaped, cut to
/// [`MAX_SHOWN`] characters with an ellipsis.
pub(crate) fn shown(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, &b) in bytes.iter().enumerate() {
        if out.len() >= MAX_SHOWN {
            out.push_str(&format!("… ({} more bytes)", bytes.len() - i));
            break;
        }
        out.extend(std::ascii::escape_default(b).map(char::from));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_truncates() {
        assert_eq!(shown(b"GET /\r\n\x00"), "GET /\\r\\n\\x00");
        let long = shown(&[b'a'; 200]);
        assert!(long.starts_with(&"a".repeat(80)) && long.ends_with("(120 more bytes)"));
    }
}
