//! Seed 000's per-process log limiter: a sliding one-second window of
//! lines, long lines cut, the excess dropped and counted, and at most one
//! summary per interval saying how many were dropped. A server that floods
//! stderr (or prints banners on stdout) costs corral a counter, not memory
//! or log volume.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use corral_policy::LogLimits;

/// The limiter of one process.
#[derive(Debug)]
pub struct LogLimiter {
    limits: LogLimits,
    /// When each line of the last second was passed.
    window: VecDeque<Instant>,
    /// Dropped since the last summary.
    dropped: u64,
    /// When the first line dropped since the last summary was dropped.
    dropping_since: Option<Instant>,
    /// Lines passed, in all.
    pub passed_total: u64,
    /// Lines dropped, in all.
    pub dropped_total: u64,
}

/// What happens to one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Log it (cut to the limit).
    Pass,
    /// Drop it (counted).
    Drop,
}

impl LogLimiter {
    /// A limiter with `limits`.
    pub fn new(limits: LogLimits) -> LogLimiter {
        LogLimiter {
            limits,
            window: VecDeque::new(),
            dropped: 0,
            dropping_since: None,
            passed_total: 0,
            dropped_total: 0,
        }
    }

    /// The line length limit, bytes.
    pub fn line_max(&self) -> u64 {
        self.limits.line_max_bytes
    }

    /// Decides one line arriving at `now`.
    pub fn offer(&mut self, now: Instant) -> Admit {
        while self
            .window
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= Duration::from_secs(1))
        {
            self.window.pop_front();
        }
        if self.window.len() < self.limits.lines_per_second as usize {
            self.window.push_back(now);
            self.passed_total += 1;
            Admit::Pass
        } else {
            self.dropped += 1;
            self.dropped_total += 1;
            self.dropping_since.get_or_insert(now);
            Admit::Drop
        }
    }

    /// The dropped count to report now, if a summary is due: lines were
    /// dropped and the interval since the first of them has passed.
    pub fn summary_due(&mut self, now: Instant) -> Option<u64> {
        let since = self.dropping_since?;
        let interval = Duration::from_secs(self.limits.summary_secs);
        (now.saturating_duration_since(since) >= interval).then(|| self.take())
    }

    /// The dropped count not yet reported (at the process's end).
    pub fn flush(&mut self) -> Option<u64> {
        self.dropping_since.map(|_| self.take())
    }

    fn take(&mut self) -> u64 {
        self.dropping_since = None;
        std::mem::take(&mut self.dropped)
    }

    /// `line` cut to the line limit, at a character boundary, lossy UTF-8.
    pub fn cut(&self, line: &[u8]) -> (String, bool) {
        let max = usize::try_from(self.limits.line_max_bytes).unwrap_or(usize::MAX);
        let text = String::from_utf8_lossy(line);
        if text.len() <= max {
            return (text.into_owned(), false);
        }
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        (text[..end].to_string(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(lines: u32, summary: u64) -> LogLimits {
        LogLimits {
            lines_per_second: lines,
            line_max_bytes: 8,
            summary_secs: summary,
        }
    }

    #[test]
    fn a_burst_passes_the_window_and_drops_the_rest_with_exact_counts() {
        let mut l = LogLimiter::new(limits(20, 60));
        let t = Instant::now();
        let passed = (0..100_000).filter(|_| l.offer(t) == Admit::Pass).count();
        assert_eq!(passed, 20);
        assert_eq!((l.passed_total, l.dropped_total), (20, 99_980));
        // No summary before the interval, one after it, then none.
        assert_eq!(l.summary_due(t + Duration::from_secs(59)), None);
        assert_eq!(l.summary_due(t + Duration::from_secs(60)), Some(99_980));
        assert_eq!(l.summary_due(t + Duration::from_secs(200)), None);
        assert_eq!(l.flush(), None);
    }

    #[test]
    fn the_window_slides() {
        let mut l = LogLimiter::new(limits(2, 1));
        let t = Instant::now();
        assert_eq!(l.offer(t), Admit::Pass);
        assert_eq!(l.offer(t + Duration::from_millis(500)), Admit::Pass);
        assert_eq!(l.offer(t + Duration::from_millis(900)), Admit::Drop);
        // The first line left the window at t+1s: room for one.
        assert_eq!(l.offer(t + Duration::from_millis(1000)), Admit::Pass);
        assert_eq!(l.offer(t + Duration::from_millis(1001)), Admit::Drop);
        assert_eq!(l.flush(), Some(2));
        assert_eq!(l.dropped_total, 2);
    }

    #[test]
    fn long_lines_are_cut_at_a_character_boundary() {
        let l = LogLimiter::new(limits(1, 1));
        assert_eq!(l.cut(b"short"), ("short".into(), false));
        assert_eq!(l.cut(b"0123456789"), ("01234567".into(), true));
        // "é" is two bytes: a cut inside it backs off.
        assert_eq!(l.cut("0123456é9".as_bytes()), ("0123456".into(), true));
    }
}
