//! Bounded output capture: keep the head and the tail of a stream.
//!
//! A program may print forever. corral keeps the first quarter of its
//! budget (what the program said first) and the last three quarters (where
//! tracebacks and summaries live), counts everything, and never holds more
//! than the budget in memory, whatever the program writes and whether or
//! not it ends its lines.

use std::collections::VecDeque;

/// The head and tail of one stream, within a fixed byte budget.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
}

impl HeadTail {
    /// A buffer that keeps at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        let head_cap = budget / 4;
        HeadTail {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: budget - head_cap,
            total: 0,
        }
    }

    /// Appends bytes the program wrote.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    /// Bytes the program wrote in total.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether some bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept bytes: head, an elision marker if anything was dropped,
    /// tail.
    pub fn into_bytes(self) -> Vec<u8> {
        let elided = self.total - (self.head.len() + self.tail.len()) as u64;
        let mut out = self.head;
        if elided > 0 {
            out.extend_from_slice(elision_marker(elided).as_bytes());
        }
        out.extend(self.tail);
        out
    }
}

/// The line corral puts where it dropped output.
pub fn elision_marker(elided: u64) -> String {
    format!("\n[corral: {elided} bytes elided]\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut b = HeadTail::new(100);
        b.push(b"hello ");
        b.push(b"world");
        assert!(!b.truncated());
        assert_eq!(b.total(), 11);
        assert_eq!(b.into_bytes(), b"hello world");
    }

    #[test]
    fn keeps_head_and_tail_with_a_marker() {
        let mut b = HeadTail::new(8);
        for chunk in [&b"abcdef"[..], b"ghijkl", b"mnopqrstuvwxyz"] {
            b.push(chunk);
        }
        assert!(b.truncated());
        assert_eq!(b.total(), 26);
        let out = String::from_utf8(b.into_bytes()).unwrap();
        assert_eq!(out, "ab\n[corral: 18 bytes elided]\nuvwxyz");
    }

    #[test]
    fn memory_stays_within_budget_for_a_flood_without_newlines() {
        let mut b = HeadTail::new(1024);
        let chunk = vec![b'x'; 65536];
        for _ in 0..100 {
            b.push(&chunk);
            assert!(b.head.len() + b.tail.len() <= 1024);
        }
        assert_eq!(b.total(), 6_553_600);
    }
}
