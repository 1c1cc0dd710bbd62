//! TOML type errors in plain words, with the dotted key they are about.
//!
//! serde reports `invalid type: string "many", expected u64` and toml adds
//! only the byte span. An operator needs the key
//! (`profile.x.limits.pids`) and the type in words (`a whole number`).

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The dotted key whose value holds byte `at` of `text` (array items as
/// `key[i]`), or `None` when `at` is in no value.
pub(super) fn key_at(text: &str, at: usize) -> Option<String> {
    let doc = DeTable::parse(text).ok()?;
    let mut path = String::new();
    walk_table(doc.get_ref(), at, &mut path).then_some(path)
}

fn contains(span: &Range<usize>, at: usize) -> bool {
    span.start <= at && at < span.end.max(span.start + 1)
}

fn walk_table(table: &DeTable<'_>, at: usize, path: &mut String) -> bool {
    for (key, value) in table {
        // Tables opened with a [header] span their header only: look
        // inside every table, keep a key when its value holds `at`.
        let before = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key.get_ref());
        // An unknown field's error points at its key.
        if contains(&key.span(), at) || walk_value(value, at, path) {
            return true;
        }
        path.truncate(before);
    }
    false
}

fn walk_value(value: &Spanned<DeValue<'_>>, at: usize, path: &mut String) -> bool {
    match value.get_ref() {
        DeValue::Table(t) => walk_table(t, at, path) || contains(&value.span(), at),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let before = path.len();
                path.push_str(&format!("[{i}]"));
                if walk_value(item, at, path) {
                    return true;
                }
                path.truncate(before);
            }
            contains(&value.span(), at)
        }
        _ => contains(&value.span(), at),
    }
}

/// serde's `invalid type: X, expected Y` (or `invalid value: ...`) as
/// `expected Y-in-words, found X-in-words`; other messages unchanged.
pub(super) fn plain_message(message: &str) -> String {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    let Some((found, expected)) = rest.and_then(|r| r.split_once(", expected ")) else {
        return message.to_string();
    };
    format!(
        "expected {}, found {}",
        expected_words(expected.trim()),
        found_words(found.trim())
    )
}

fn expected_words(t: &str) -> String {
    let words = match t {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" => "a whole number from 0 to 4294967295",
        "u64" | "u128" | "usize" => "a whole number (0 or more)",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" => "a string in quotes",
        "a sequence" => "a list in brackets, like [\"a\", \"b\"]",
        "a map" => "a table",
        _ if t.starts_with("struct ") => "a table",
        _ => return t.to_string(),
    };
    words.to_string()
}

fn found_words(t: &str) -> String {
    for (serde, plain) in [
        ("string ", "the string "),
        ("integer ", "the number "),
        ("floating point ", "the number "),
        ("boolean ", ""),
    ] {
        if let Some(v) = t.strip_prefix(serde) {
            return format!("{plain}{}", v.trim_matches('`'));
        }
    }
    match t {
        "sequence" => "a list".into(),
        "map" => "a table".into(),
        _ => t.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_types_in_plain_words() {
        let text = "[profile.x]\nextends = \"code\"\n[profile.x.limits]\npids = \"many\"\n[profile.x.network]\nallow_domains = [\"a\", 3]\n";
        let at = text.find("\"many\"").unwrap_or(0);
        assert_eq!(key_at(text, at).as_deref(), Some("profile.x.limits.pids"));
        let at = text.find('3').unwrap_or(0);
        assert_eq!(
            key_at(text, at).as_deref(),
            Some("profile.x.network.allow_domains[1]")
        );
        assert_eq!(
            plain_message("invalid type: string \"many\", expected u64"),
            "expected a whole number (0 or more), found the string \"many\""
        );
        assert_eq!(
            plain_message("invalid value: integer `-1`, expected u64"),
            "expected a whole number (0 or more), found the number -1"
        );
        assert_eq!(
            plain_message("invalid type: boolean `true`, expected a string"),
            "expected a string in quotes, found true"
        );
        assert_eq!(plain_message("unknown field `x`"), "unknown field `x`");
        assert_eq!(
            plain_message("invalid value: integer `70000`, expected u16"),
            "expected a whole number from 0 to 65535, found the number 70000"
        );
        let text = "[profile.x.filesystem]\nread_olny = []\n";
        let at = text.find("read_olny").unwrap_or(0);
        assert_eq!(
            key_at(text, at).as_deref(),
            Some("profile.x.filesystem.read_olny")
        );
    }
}
