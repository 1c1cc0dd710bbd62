//! The range of every limit, checked once at the edge.
//!
//! A config file, the flags of `corral run` and the `limits` of a
//! `corral serve` request all check a limit with [`RunLimit::check`], so
//! the three accept the same values and refuse the others with the same
//! message, naming the range. The minimum is the smallest value with which
//! a sandbox can still start; the maximum is the largest value what
//! consumes the limit can hold without wrapping or meaning "unlimited":
//!
//! - the wall-clock timeout becomes a deadline (`Instant + Duration`) and
//!   a poll(2) timeout, a 32-bit count of milliseconds (24.8 days);
//! - sizes end in cgroup files, rlimits and file offsets, which the kernel
//!   holds as signed 64-bit numbers; an rlimit of `u64::MAX` would be
//!   `RLIM_INFINITY`, no limit at all;
//! - `pids` ends in `pids.max`, which refuses more than the kernel's
//!   largest pid count; `open_files` in `RLIMIT_NOFILE`, which refuses
//!   more than `fs.nr_open`.

use std::fmt;

use crate::profile::Limits;
use crate::size::ByteSize;

/// The value that switches off a limit which may be off (`timeout_secs =
/// "none"`, `output_kill = "none"`, `corral run --timeout none`), also
/// when a profile inherits one.
pub const NO_LIMIT: &str = "none";

/// Seconds in a day.
const DAY: u64 = 86_400;

/// The longest wall-clock timeout, in seconds: 24 days. corral waits for
/// the program in poll(2), whose timeout is an `int` of milliseconds (at
/// most 24.8 days), and adds one millisecond to the time left.
pub const MAX_TIMEOUT_SECS: u64 = 24 * DAY;

/// The most CPU time per process, in seconds: 366 days. The kernel turns
/// `RLIMIT_CPU` into nanoseconds in 64 bits (584 years), and corral sets
/// the hard limit one second above the soft one.
pub const MAX_CPU_TIME_SECS: u64 = 366 * DAY;

/// The largest size of any limit, in bytes: `i64::MAX` (8 EiB - 1). The
/// kernel holds file offsets (`RLIMIT_FSIZE` is compared with them) and
/// cgroup memory counters as signed 64-bit numbers, and an rlimit of
/// `u64::MAX` means no limit at all.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// The fewest processes a sandbox runs with: corral's helper (moved into
/// the sandbox's cgroup before the sandbox starts), the sandbox's init and
/// the program. With 2, forking the program fails; with 1, forking init
/// (`sandbox.setup`, measured with `corral run --pids N -- sh -c true`).
pub const MIN_PIDS: u64 = 3;

/// The most processes and threads: 4,194,304 (`PID_MAX_LIMIT` on 64-bit
/// Linux), the largest value `pids.max` accepts and more processes than
/// can exist, so also the most `RLIMIT_NPROC` can usefully hold.
pub const MAX_PIDS: u64 = 1 << 22;

/// The most open files per process: 1,048,576, the kernel's default
/// `fs.nr_open`, above which setrlimit(2) refuses `RLIMIT_NOFILE`.
pub const MAX_OPEN_FILES: u64 = 1 << 20;

/// The smallest CPU bandwidth: 10 millicores, a 1 ms quota per 100 ms
/// period, the smallest quota the kernel accepts.
pub const MIN_CPU_MILLICORES: u64 = 10;

/// The most CPU bandwidth: 8,192 CPUs (the largest `CONFIG_NR_CPUS`), in
/// millicores. More would limit nothing on any machine.
pub const MAX_CPU_MILLICORES: u64 = 8192 * 1000;

// Each maximum fits what consumes it; the build fails otherwise.
const _: () = {
    // poll(2) waits an `int` of milliseconds, and corral adds one.
    assert!(MAX_TIMEOUT_SECS * 1000 < i32::MAX as u64);
    // The service shows ceilings in milliseconds.
    assert!(MAX_CPU_TIME_SECS.checked_mul(1000).is_some());
    // RLIMIT_CPU: the hard limit is one above; the kernel counts
    // nanoseconds in 64 bits.
    assert!(MAX_CPU_TIME_SECS.checked_mul(1_000_000_000).is_some());
    // cpu.max: the quota per 100 ms period, in microseconds, below the
    // kernel's largest quota (2^44 - 1 us).
    assert!(MAX_CPU_MILLICORES * 100 < 1 << 44);
    // pids.max refuses more than PID_MAX_LIMIT.
    assert!(MAX_PIDS == 4 * 1024 * 1024);
};

/// A limit of a profile (`[profile.NAME.limits]`), some of which `corral
/// run` flags and `corral serve` requests may also set. Each has a range
/// ([`RunLimit::minimum`] to [`RunLimit::maximum`]) that every way of
/// setting it checks with [`RunLimit::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLimit {
    /// Wall-clock limit, in seconds (`timeout_secs`, `--timeout`); may be
    /// off ([`NO_LIMIT`]).
    Timeout,
    /// Memory, swap included, in bytes (`memory`, `--memory`).
    Memory,
    /// Bytes kept of each output stream (`output`, `--output-limit`).
    Output,
    /// Bytes of one output stream, in total, after which the sandbox is
    /// killed (`output_kill`); may be off ([`NO_LIMIT`]).
    OutputKill,
    /// Processes and threads at once (`pids`, `--pids`).
    Pids,
    /// CPU time per process, in seconds (`cpu_time_secs`, `--cpu-time`).
    CpuTime,
    /// CPU bandwidth in thousandths of a CPU (`cpu_millicores`).
    CpuMillicores,
    /// Virtual address space per process, in bytes (`address_space`).
    AddressSpace,
    /// Largest file a process may write, in bytes (`file_size`).
    FileSize,
    /// Open file descriptors per process (`open_files`).
    OpenFiles,
    /// Processes of the sandbox's uid (`processes`).
    Processes,
}

/// What a limit counts, for messages.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Bytes,
    Count,
    Millicores,
}

impl RunLimit {
    /// Every limit, in the order of the limits table.
    pub const ALL: [RunLimit; 11] = [
        RunLimit::Timeout,
        RunLimit::Memory,
        RunLimit::Pids,
        RunLimit::CpuMillicores,
        RunLimit::CpuTime,
        RunLimit::AddressSpace,
        RunLimit::FileSize,
        RunLimit::OpenFiles,
        RunLimit::Processes,
        RunLimit::Output,
        RunLimit::OutputKill,
    ];

    /// The limit's key in `[profile.NAME.limits]`.
    pub const fn key(self) -> &'static str {
        match self {
            RunLimit::Timeout => "timeout_secs",
            RunLimit::Memory => "memory",
            RunLimit::Output => "output",
            RunLimit::OutputKill => "output_kill",
            RunLimit::Pids => "pids",
            RunLimit::CpuTime => "cpu_time_secs",
            RunLimit::CpuMillicores => "cpu_millicores",
            RunLimit::AddressSpace => "address_space",
            RunLimit::FileSize => "file_size",
            RunLimit::OpenFiles => "open_files",
            RunLimit::Processes => "processes",
        }
    }

    /// The smallest value accepted, in the limit's unit (seconds, bytes, a
    /// count or millicores). Below 1 MiB of memory the interpreters cannot
    /// even start; below 64 bytes the head-and-tail output has no room
    /// for its marker; see [`MIN_PIDS`] and [`MIN_CPU_MILLICORES`].
    pub const fn minimum(self) -> u64 {
        match self {
            RunLimit::Memory => 1 << 20,
            RunLimit::Output | RunLimit::OutputKill => 64,
            RunLimit::AddressSpace | RunLimit::FileSize => 4096,
            RunLimit::Pids => MIN_PIDS,
            RunLimit::CpuMillicores => MIN_CPU_MILLICORES,
            RunLimit::Timeout | RunLimit::CpuTime | RunLimit::OpenFiles | RunLimit::Processes => 1,
        }
    }

    /// The largest value accepted, in the limit's unit: what the limit's
    /// consumer holds (see the module documentation and the `MAX_`
    /// constants).
    pub const fn maximum(self) -> u64 {
        match self {
            RunLimit::Timeout => MAX_TIMEOUT_SECS,
            RunLimit::CpuTime => MAX_CPU_TIME_SECS,
            RunLimit::Memory
            | RunLimit::Output
            | RunLimit::OutputKill
            | RunLimit::AddressSpace
            | RunLimit::FileSize => MAX_BYTES,
            RunLimit::Pids | RunLimit::Processes => MAX_PIDS,
            RunLimit::OpenFiles => MAX_OPEN_FILES,
            RunLimit::CpuMillicores => MAX_CPU_MILLICORES,
        }
    }

    /// `value` (in the limit's unit) if it lies in
    /// [`RunLimit::minimum`]..=[`RunLimit::maximum`], else an error
    /// saying which end it passed and what the range is. The caller puts
    /// its own name for the limit (config key, flag or request field) in
    /// front.
    pub fn check(self, value: u64) -> Result<u64, LimitError> {
        if value < self.minimum() {
            Err(LimitError::TooSmall { limit: self, value })
        } else if value > self.maximum() {
            Err(LimitError::TooLarge { limit: self, value })
        } else {
            Ok(value)
        }
    }

    /// Whether the limit may be switched off with [`NO_LIMIT`]: the wall
    /// timeout and the output kill ceiling (a long-running server such as
    /// an MCP server over stdio has neither an end nor an output total).
    pub const fn can_be_off(self) -> bool {
        matches!(self, RunLimit::Timeout | RunLimit::OutputKill)
    }

    /// What values the limit takes, for messages about a value that is
    /// not one: `1 to 2073600 seconds (24 days)`.
    pub fn range_hint(self) -> String {
        let r = self.range();
        r.strip_prefix("use ").map(str::to_owned).unwrap_or(r)
    }

    const fn unit(self) -> Unit {
        match self {
            RunLimit::Timeout | RunLimit::CpuTime => Unit::Seconds,
            RunLimit::Memory
            | RunLimit::Output
            | RunLimit::OutputKill
            | RunLimit::AddressSpace
            | RunLimit::FileSize => Unit::Bytes,
            RunLimit::Pids | RunLimit::OpenFiles | RunLimit::Processes => Unit::Count,
            RunLimit::CpuMillicores => Unit::Millicores,
        }
    }

    /// `value` with its unit: `5 seconds`, `64KiB`, `12`.
    fn show(self, value: u64) -> String {
        match self.unit() {
            Unit::Seconds if value == 1 => String::from("1 second"),
            Unit::Seconds => format!("{value} seconds"),
            Unit::Bytes => ByteSize(value).to_string(),
            Unit::Count => value.to_string(),
            Unit::Millicores => format!("{value} millicores"),
        }
    }

    /// The accepted range, as the end of an error message.
    fn range(self) -> String {
        let (min, max) = (self.minimum(), self.maximum());
        match self {
            RunLimit::Timeout => format!("use {min} to {max} seconds (24 days)"),
            RunLimit::CpuTime => format!("use {min} to {max} seconds (366 days)"),
            RunLimit::Pids => format!(
                "use {min} to {max} (corral's helper, the sandbox's init and the program are {min} processes)"
            ),
            RunLimit::CpuMillicores => format!(
                "use {min} to {max} millicores (a hundredth of a CPU to 8192 CPUs)"
            ),
            _ => match self.unit() {
                Unit::Bytes => format!("use {} to {max} bytes (2^63 - 1)", ByteSize(min)),
                _ => format!("use {min} to {max}"),
            },
        }
    }
}

/// A limit value outside its range ([`RunLimit::check`]). The message
/// gives the value with its unit and the range, e.g. `2 is too small: use
/// 3 to 4194304 (...)`; callers prefix the key, flag or field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Below [`RunLimit::minimum`].
    #[error("{} is too small: {}", .limit.show(*.value), .limit.range())]
    TooSmall {
        /// Which limit.
        limit: RunLimit,
        /// The value, in the limit's unit.
        value: u64,
    },
    /// Above [`RunLimit::maximum`].
    #[error("{} is too large: {}", .limit.show(*.value), .limit.range())]
    TooLarge {
        /// Which limit.
        limit: RunLimit,
        /// The value, in the limit's unit.
        value: u64,
    },
}

impl LimitError {
    /// A stable code for JSON error objects: `limits.invalid`.
    pub fn code(&self) -> &'static str {
        "limits.invalid"
    }

    /// The limit that is out of range.
    pub fn limit(&self) -> RunLimit {
        match self {
            LimitError::TooSmall { limit, .. } | LimitError::TooLarge { limit, .. } => *limit,
        }
    }
}

impl fmt::Display for RunLimit {
    /// The limit's config key (`timeout_secs`, `memory`, ...).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

impl Limits {
    /// Checks every limit that is set against its range, so a profile
    /// however built (built in, from a file, merged) holds only values
    /// its consumers can take. The first value out of range is the error.
    pub fn check(&self) -> Result<(), LimitError> {
        let set = [
            (RunLimit::Timeout, self.timeout_secs),
            (RunLimit::Memory, self.memory_bytes.map(ByteSize::bytes)),
            (RunLimit::Pids, self.pids),
            (RunLimit::CpuMillicores, self.cpu_millicores),
            (RunLimit::CpuTime, self.cpu_time_secs),
            (
                RunLimit::AddressSpace,
                self.address_space_bytes.map(ByteSize::bytes),
            ),
            (
                RunLimit::FileSize,
                self.file_size_bytes.map(ByteSize::bytes),
            ),
            (RunLimit::OpenFiles, Some(self.open_files)),
            (RunLimit::Processes, self.processes),
            (RunLimit::Output, Some(self.output_bytes.bytes())),
            (
                RunLimit::OutputKill,
                self.output_kill_bytes.map(ByteSize::bytes),
            ),
        ];
        for (limit, value) in set {
            if let Some(v) = value {
                limit.check(v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn every_limit_accepts_its_range_and_refuses_past_both_ends() {
        for limit in RunLimit::ALL {
            let (min, max) = (limit.minimum(), limit.maximum());
            assert!(min >= 1 && min < max, "{limit}");
            assert_eq!(limit.check(min), Ok(min), "{limit}");
            assert_eq!(limit.check(max), Ok(max), "{limit}");
            let below = limit.check(min - 1).unwrap_err();
            assert_eq!(
                below,
                LimitError::TooSmall {
                    limit,
                    value: min - 1
                }
            );
            assert!(below.to_string().contains("too small: use"), "{below}");
            let above = limit.check(max + 1).unwrap_err();
            assert_eq!(limit.to_string(), limit.key());
            assert_eq!(above.limit(), limit);
            assert!(above.to_string().contains("too large: use"), "{above}");
            assert_eq!(above.code(), "limits.invalid");
            assert!(
                limit.check(u64::MAX).is_err(),
                "{limit}: u64::MAX would be RLIM_INFINITY or overflow"
            );
        }
    }

    #[test]
    fn messages_give_the_value_with_its_unit_and_the_range() {
        assert_eq!(
            RunLimit::Timeout.check(u64::MAX).unwrap_err().to_string(),
            "18446744073709551615 seconds is too large: use 1 to 2073600 seconds (24 days)"
        );
        assert_eq!(
            RunLimit::Pids.check(2).unwrap_err().to_string(),
            "2 is too small: use 3 to 4194304 (corral's helper, the sandbox's init and the program are 3 processes)"
        );
        assert_eq!(
            RunLimit::Memory
                .check((1 << 20) - 1)
                .unwrap_err()
                .to_string(),
            "1048575B is too small: use 1MiB to 9223372036854775807 bytes (2^63 - 1)"
        );
        assert_eq!(
            RunLimit::Output.check(63).unwrap_err().to_string(),
            "63B is too small: use 64B to 9223372036854775807 bytes (2^63 - 1)"
        );
        assert_eq!(
            RunLimit::CpuTime.check(0).unwrap_err().to_string(),
            "0 seconds is too small: use 1 to 31622400 seconds (366 days)"
        );
        assert_eq!(
            RunLimit::CpuMillicores.check(5).unwrap_err().to_string(),
            "5 millicores is too small: use 10 to 8192000 millicores (a hundredth of a CPU to 8192 CPUs)"
        );
        assert_eq!(
            RunLimit::OpenFiles
                .check(MAX_OPEN_FILES + 1)
                .unwrap_err()
                .to_string(),
            "1048577 is too large: use 1 to 1048576"
        );
    }

    #[test]
    fn the_longest_timeout_is_a_valid_deadline() {
        // The compile-time checks above cover poll(2); the deadline is
        // `Instant + Duration`, which panics on overflow.
        let deadline = Instant::now().checked_add(Duration::from_secs(MAX_TIMEOUT_SECS));
        assert!(deadline.is_some());
        let ms = Duration::from_secs(MAX_TIMEOUT_SECS).as_millis() + 1;
        assert!(i32::try_from(ms).is_ok(), "{ms} ms does not fit poll(2)");
    }

    #[test]
    fn profiles_are_checked_whole() {
        for (name, p) in crate::builtin::all() {
            assert_eq!(p.limits.check(), Ok(()), "built-in profile {name}");
        }
        assert_eq!(crate::builtin::base("x").limits.check(), Ok(()));
        let mut l = crate::builtin::code().limits;
        l.pids = Some(2);
        assert_eq!(
            l.check(),
            Err(LimitError::TooSmall {
                limit: RunLimit::Pids,
                value: 2
            })
        );
        l.pids = Some(MIN_PIDS);
        l.open_files = 0;
        assert_eq!(l.check().map_err(|e| e.limit()), Err(RunLimit::OpenFiles));
        l.open_files = 1;
        l.timeout_secs = Some(u64::MAX);
        assert_eq!(l.check().map_err(|e| e.limit()), Err(RunLimit::Timeout));
    }
}
