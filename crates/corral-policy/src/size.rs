//! Byte sizes written the way operators write them: `64MiB`, `1G`, `4096`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A size in bytes. Parsed from an integer or a string with an optional
/// binary unit (`K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB`; the short
/// forms are binary too, as in `ulimit` and tmpfs's `size=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size `{input}`: {why} (write e.g. `4096`, `64K`, `64MiB` or `1G`)")]
pub struct SizeError {
    /// The text as written.
    pub input: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl ByteSize {
    /// Parses `text` as a byte size.
    pub fn parse(text: &str) -> Result<Self, SizeError> {
        let err = |why| SizeError {
            input: text.to_string(),
            why,
        };
        let trimmed = text.trim();
        let digits_end = trimmed
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(trimmed.len());
        if digits_end == 0 {
            return Err(err("it must start with a number"));
        }
        let number: u64 = trimmed[..digits_end]
            .parse()
            .map_err(|_| err("the number is too large"))?;
        let unit = trimmed[digits_end..].trim();
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(err("unknown unit")),
        };
        number
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| err("the size overflows 64 bits"))
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        for (name, shift) in UNITS {
            let unit = 1u64 << shift;
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{}", self.0 / unit, name);
            }
        }
        write!(f, "{}B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(ByteSize::parse("4096").unwrap().bytes(), 4096);
        assert_eq!(ByteSize::parse("64K").unwrap().bytes(), 64 << 10);
        assert_eq!(ByteSize::parse("64MiB").unwrap().bytes(), 64 << 20);
        assert_eq!(ByteSize::parse("1G").unwrap().bytes(), 1 << 30);
        assert_eq!(ByteSize::parse(" 2 gib ").unwrap().bytes(), 2 << 30);
    }

    #[test]
    fn rejects_garbage() {
        assert!(ByteSize::parse("").is_err());
        assert!(ByteSize::parse("MiB").is_err());
        assert!(ByteSize::parse("-1").is_err());
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("99999999999999999999").is_err());
        assert!(ByteSize::parse("17179869184T").is_err());
    }

    #[test]
    fn displays_round_units() {
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }
}
