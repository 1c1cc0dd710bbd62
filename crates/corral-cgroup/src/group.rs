//! One sandbox's group: add a process, kill everything in it, usage
//! figures, removal.

use super::*;

/// One directory of a sandbox's group.
#[derive(Debug, Clone)]
pub(crate) struct GroupDir {
    pub(crate) path: PathBuf,
    /// v1: the controllers of its hierarchy; v2: the ones enabled.
    pub(crate) controllers: Vec<Controller>,
}

/// What was enforced, for the result's `enforced` field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupEnforced {
    /// `"v1"` or `"v2"`.
    pub version: &'static str,
    /// Controllers a limit was written to.
    pub controllers: Vec<&'static str>,
    /// The memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Whether the memory limit covers swap too.
    pub memory_includes_swap: bool,
    /// The pids limit.
    pub pids: Option<u64>,
    /// The cpu limit in millicores.
    pub cpu_millicores: Option<u64>,
    /// Caveats, e.g. swap not covered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl CgroupEnforced {
    pub(crate) fn none(version: &'static str) -> Self {
        CgroupEnforced {
            version,
            controllers: Vec::new(),
            memory_bytes: None,
            memory_includes_swap: false,
            pids: None,
            cpu_millicores: None,
            notes: Vec::new(),
        }
    }
}

/// Usage figures of a sandbox's group. `None` where the host does not
/// provide the figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CgroupStats {
    /// Peak memory use in bytes (v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`).
    pub peak_memory_bytes: Option<u64>,
    /// Whether the kernel OOM-killed a process of the group.
    pub oom_killed: bool,
    /// CPU time used by the group in nanoseconds (v2; v1 only where
    /// cpuacct is co-mounted with a limited cpu).
    pub cpu_usage_ns: Option<u64>,
    /// Most processes at once (`pids.peak`).
    pub pids_peak: Option<u64>,
    /// Whether a fork failed because of the pids limit.
    pub pids_limit_hit: bool,
}

/// A sandbox's cgroup. Removed (processes killed, directories deleted)
/// by [`SandboxCgroup::remove`] or, best effort, when dropped.
#[derive(Debug)]
pub struct SandboxCgroup {
    pub(crate) v2: bool,
    pub(crate) dirs: Vec<GroupDir>,
    pub(crate) enforced: CgroupEnforced,
    pub(crate) backend: Backend,
    pub(crate) done: bool,
    /// The statistics files, once [`SandboxCgroup::open_stat_files`]
    /// opened them.
    pub(crate) stat_files: std::sync::OnceLock<Vec<(PathBuf, std::fs::File)>>,
}

/// The files [`SandboxCgroup::stats`] reads, where the host has them.
#[derive(Debug, Default)]
pub(crate) struct StatFiles {
    /// Peak memory (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub(crate) peak: Option<PathBuf>,
    /// OOM kills (v1 `memory.oom_control`, v2 `memory.events`).
    pub(crate) oom: Option<PathBuf>,
    /// CPU time (v1 `cpuacct.usage`, v2 `cpu.stat`).
    pub(crate) cpu: Option<PathBuf>,
    /// `pids.peak`.
    pub(crate) pids_peak: Option<PathBuf>,
    /// `pids.events`.
    pub(crate) pids_events: Option<PathBuf>,
}

impl StatFiles {
    /// Every file there is.
    pub(crate) fn all(&self) -> impl Iterator<Item = &PathBuf> {
        [
            &self.peak,
            &self.oom,
            &self.cpu,
            &self.pids_peak,
            &self.pids_events,
        ]
        .into_iter()
        .flatten()
    }
}

impl SandboxCgroup {
    /// The group's directories (one on v2, one per hierarchy on v1), e.g.
    /// for `CLONE_INTO_CGROUP`.
    pub fn paths(&self) -> Vec<&Path> {
        self.dirs.iter().map(|d| d.path.as_path()).collect()
    }

    /// Moves `pid` into every hierarchy of this group. Call it for the
    /// sandbox helper before it forks anything, so every descendant starts
    /// inside.
    pub fn add_process(&self, pid: i32) -> Result<(), CgroupError> {
        if pid <= 0 {
            return Err(CgroupError::Write {
                path: self
                    .dirs
                    .first()
                    .map(|d| d.path.join("cgroup.procs"))
                    .unwrap_or_default(),
                value: pid.to_string(),
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        for dir in &self.dirs {
            write_file(
                &self.backend,
                &dir.path.join("cgroup.procs"),
                &pid.to_string(),
            )?;
        }
        Ok(())
    }

    /// The files a single-threaded process writes `0` to, each once, to
    /// move itself into every hierarchy of this group: on v1 the `tasks`
    /// file of each directory; empty on v2, where a thread may move itself
    /// only within its own domain, so the parent uses
    /// [`SandboxCgroup::add_process`] there.
    ///
    /// Why this exists: writing a pid to `cgroup.procs` takes the kernel's
    /// global `cgroup_threadgroup_rwsem` for writing, which first waits for
    /// an RCU grace period (10-40 ms measured on this project's v1 test VM,
    /// and it stalls every fork on the host meanwhile). A thread that moves
    /// *itself* (`tasks`, pid `0`) skips that lock (kernel/cgroup/cgroup.c,
    /// `cgroup_procs_write_start`). Only a process with one thread is moved
    /// whole this way, so callers must guarantee it has exactly one.
    pub fn self_join_files(&self) -> Vec<PathBuf> {
        if self.v2 {
            return Vec::new();
        }
        self.dirs.iter().map(|d| d.path.join("tasks")).collect()
    }

    /// The pids listed in the group's `cgroup.procs`, over all hierarchies.
    pub fn pids(&self) -> Vec<i32> {
        let mut all = BTreeSet::new();
        for dir in &self.dirs {
            all.extend(read_pids(&self.backend, &dir.path));
        }
        all.into_iter().collect()
    }

    /// Kills every process in the group and waits (up to [`EMPTY_WAIT`])
    /// until it is empty. v2: `cgroup.kill` when present, else SIGKILL each
    /// listed pid until none is left; v1: SIGKILL each listed pid until
    /// none is left (a stale group of an older version that has a freezer
    /// directory is frozen, killed and thawed first).
    pub fn kill_all(&self) {
        self.kill_until(Instant::now() + EMPTY_WAIT);
    }

    pub(crate) fn kill_until(&self, deadline: Instant) {
        if self.v2 {
            v2::kill(&self.backend, &self.dirs);
        } else {
            v1::kill(&self.backend, &self.dirs);
        }
        let mut pause = Duration::from_millis(1);
        loop {
            let left = self.pids();
            if left.is_empty() || Instant::now() >= deadline {
                return;
            }
            self.kill_members(&left);
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Sends SIGKILL to each of `listed` that is still a member. A pid read
    /// from `cgroup.procs` may belong to a process that has exited since,
    /// and the number to an unrelated host process by the time it is
    /// signalled (corral often runs as root). So each pid is first pinned
    /// with a pidfd (pidfd_open(2): it keeps naming that process), then the
    /// group is listed again, and only pidfds whose pid is still listed are
    /// signalled (pidfd_send_signal(2)). A pid reused between the two
    /// listings leaves a pidfd to the process that exited, which ESRCH
    /// makes harmless. Kernels without pidfds (before 5.3) get kill(2).
    pub(crate) fn kill_members(&self, listed: &[i32]) {
        let mut pinned = Vec::with_capacity(listed.len());
        for &pid in listed {
            match corral_sys::process::pidfd_open(pid) {
                Ok(fd) => pinned.push((pid, fd)),
                Err(corral_sys::Errno(libc::ENOSYS)) => {
                    let _ = corral_sys::process::kill(pid, libc::SIGKILL);
                }
                // Gone already (ESRCH): nothing to kill.
                Err(_) => {}
            }
        }
        if pinned.is_empty() {
            return;
        }
        let members: BTreeSet<i32> = self.pids().into_iter().collect();
        for (pid, fd) in &pinned {
            if members.contains(pid) {
                let _ = corral_sys::process::pidfd_send_signal(fd, libc::SIGKILL);
            }
        }
    }

    /// Usage figures: peak memory, OOM kill, cpu time, peak process count.
    pub fn stats(&self) -> CgroupStats {
        let opened = self.stat_files.get().map(Vec::as_slice).unwrap_or_default();
        let read = |path: &Path| match opened.iter().find(|(p, _)| p == path) {
            Some((_, file)) => read_from_start(file).ok(),
            None => read_opt(&self.backend, path),
        };
        if self.v2 {
            v2::stats(&read, &v2::stat_files(&self.dirs))
        } else {
            v1::stats(&read, &v1::stat_files(&self.dirs))
        }
    }

    /// Opens the files [`SandboxCgroup::stats`] reads, once; `stats` opens
    /// by path what is not open by then. Each open is a walk through the
    /// cgroup filesystem (~15 us), so a caller opens them where nobody
    /// waits: a service when it makes its groups ahead of its requests,
    /// `corral run` while init builds the sandbox's root on the other
    /// CPU. A file that cannot be opened is read by path later.
    pub fn open_stat_files(&self) {
        self.stat_files.get_or_init(|| {
            let files = if self.v2 {
                v2::stat_files(&self.dirs)
            } else {
                v1::stat_files(&self.dirs)
            };
            files
                .all()
                .filter_map(|p| Some((p.clone(), self.backend.open_read(p)?)))
                .collect()
        });
    }

    /// What was enforced: version and the controllers with limits written.
    pub fn enforced(&self) -> CgroupEnforced {
        self.enforced.clone()
    }

    /// Kills leftovers (skipped when the group has no processes any
    /// more, the usual case), waits (up to [`EMPTY_WAIT`]) until the group
    /// is empty and removes every directory.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_inner()
    }

    pub(crate) fn remove_inner(&mut self) -> Result<(), CgroupError> {
        if self.done {
            return Ok(());
        }
        // Whatever happens, Drop does not try again.
        self.done = true;
        let start = Instant::now();
        let deadline = start + EMPTY_WAIT;
        // The usual case: the pid namespace is gone and so is every
        // process, and the rmdir just works; only a group the kernel
        // finds busy is listed and killed (once), then removed again.
        let mut killed = false;
        let mut first_err = None;
        // Leaf first does not matter (no children), but the order is fixed
        // for predictable errors.
        for dir in &self.dirs {
            let mut pause = Duration::from_millis(1);
            loop {
                match self.backend.rmdir(&dir.path) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY)
                            && !killed
                            && !self.pids().is_empty() =>
                    {
                        killed = true;
                        self.kill_until(deadline);
                    }
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(20));
                    }
                    Err(e) => {
                        let pids = read_pids(&self.backend, &dir.path);
                        let err = if e.raw_os_error() == Some(libc::EBUSY) && !pids.is_empty() {
                            CgroupError::Busy {
                                path: dir.path.clone(),
                                pids,
                                waited_ms: u64::try_from(start.elapsed().as_millis())
                                    .unwrap_or(u64::MAX),
                            }
                        } else {
                            CgroupError::Remove {
                                path: dir.path.clone(),
                                source: e,
                            }
                        };
                        first_err.get_or_insert(err);
                        break;
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A statistics file's whole text, read from its start (cgroup files
/// produce their text anew for each read from offset 0).
fn read_from_start(file: &std::fs::File) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut text = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let offset = u64::try_from(text.len()).unwrap_or(u64::MAX);
        let n = file.read_at(&mut buf, offset)?;
        text.extend_from_slice(&buf[..n]);
        // A cgroup file is a seq_file: a read returns as much of the text
        // as the buffer holds, so a short one was the end. Reading on to
        // the empty read would have the kernel produce the text once
        // more (a read at another offset starts it over), on the path of
        // every run's answer.
        if n < buf.len() {
            break;
        }
    }
    String::from_utf8(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        let _ = self.remove_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::read_from_start;

    /// The text whole, whether it ends inside the first 512-byte read, at
    /// its very end (the empty read then says so) or spans several.
    #[test]
    fn a_statistics_file_is_read_whole_in_as_few_reads_as_its_size_allows() {
        let dir = crate::fake::TestDir::new("stat-read");
        for len in [0usize, 7, 511, 512, 513, 1300] {
            let text: String = "abcdefghijklmnopqrstuvwxyz"
                .chars()
                .cycle()
                .take(len)
                .collect();
            let path = dir.0.join(format!("stat-{len}"));
            std::fs::write(&path, &text).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            assert_eq!(read_from_start(&file).unwrap(), text, "{len} bytes");
        }
    }
}
