//! A fake cgroup filesystem in a temporary directory, emulating the kernel
//! where plain files would not: mkdir creates the interface files, writes
//! to `cgroup.subtree_control`, `cgroup.procs`, `cgroup.kill`,
//! `freezer.state` and the v1 memory limits behave as in the kernel,
//! `cgroup.procs` lists only live processes, and rmdir succeeds only on an
//! empty group.

use crate::host::under_root;
use crate::Controller;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary directory removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "corral-cgroup-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TestDir(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the fake kernel supports.
#[derive(Debug, Clone)]
pub struct FakeKernel {
    /// v2 mount (full path), if any.
    pub v2_mount: Option<PathBuf>,
    /// v1 hierarchies (full path, controllers).
    pub v1: Vec<(PathBuf, Vec<Controller>)>,
    /// v2 groups have `cgroup.kill` (Linux 5.14+).
    pub cgroup_kill: bool,
    /// Swap accounting: v2 `memory.swap.max`, v1 `memory.memsw.*`.
    pub swap: bool,
    /// A control file (by name) whose writes fail with this errno, as a
    /// kernel refuses a value it will not take.
    pub refuse_writes: Option<(&'static str, i32)>,
    /// How many `mkdir`s were asked of it, failed ones included.
    pub mkdirs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn io_err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// A child process killed and reaped on drop.
pub struct Guard(pub std::process::Child);

impl Guard {
    /// A `sleep 30`.
    pub fn sleep() -> Guard {
        Guard(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        )
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).expect("a pid fits in pid_t")
    }

    /// Waits up to `secs` for the exit; the signal that ended it.
    pub fn wait_signal(&mut self, secs: u64) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.signal();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        None
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `pid` is a live (not zombie) process.
pub fn live(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

fn put(dir: &Path, name: &str, content: &str) {
    let _ = std::fs::write(dir.join(name), content);
}

impl FakeKernel {
    /// A pure v2 host below `root` offering `controllers`; returns the
    /// kernel, mountinfo and /proc/self/cgroup texts.
    pub fn v2(
        root: &Path,
        controllers: &[&str],
        cgroup_kill: bool,
        swap: bool,
    ) -> (FakeKernel, String, String) {
        let mount = under_root(root, Path::new("/sys/fs/cgroup"));
        std::fs::create_dir_all(&mount).unwrap();
        put(
            &mount,
            "cgroup.controllers",
            &format!("{}\n", controllers.join(" ")),
        );
        put(&mount, "cgroup.subtree_control", "\n");
        put(&mount, "cgroup.procs", "");
        put(&mount, "cgroup.root", "");
        let mountinfo = "\
22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
        (
            FakeKernel {
                v2_mount: Some(mount),
                v1: Vec::new(),
                cgroup_kill,
                swap,
                refuse_writes: None,
                mkdirs: Default::default(),
            },
            mountinfo.to_string(),
            "0::/user.slice/user-1000.slice/session-1.scope\n".to_string(),
        )
    }

    /// A v1 host below `root` with the given hierarchies (directory
    /// name under /sys/fs/cgroup, controllers); returns the kernel,
    /// mountinfo and /proc/self/cgroup texts.
    pub fn v1(
        root: &Path,
        hierarchies: &[(&str, &[Controller])],
        swap: bool,
    ) -> (FakeKernel, String, String) {
        let mut mountinfo =
            String::from("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n");
        let mut self_cgroup = String::new();
        let mut v1 = Vec::new();
        for (i, (dir, ctrls)) in hierarchies.iter().enumerate() {
            let path = under_root(root, &Path::new("/sys/fs/cgroup").join(dir));
            std::fs::create_dir_all(&path).unwrap();
            put(&path, "cgroup.procs", "");
            put(&path, "tasks", "");
            let names: Vec<&str> = ctrls.iter().map(|c| c.name()).collect();
            mountinfo.push_str(&format!(
                "{} 31 0:{} / /sys/fs/cgroup/{dir} rw,relatime - cgroup cgroup rw,{}\n",
                32 + i,
                29 + i,
                names.join(",")
            ));
            self_cgroup.push_str(&format!("{}:{}:/\n", i + 1, names.join(",")));
            v1.push((path, ctrls.to_vec()));
        }
        self_cgroup.push_str("0::/\n");
        (
            FakeKernel {
                v2_mount: None,
                v1,
                cgroup_kill: false,
                swap,
                refuse_writes: None,
                mkdirs: Default::default(),
            },
            mountinfo,
            self_cgroup,
        )
    }

    fn is_v2(&self, path: &Path) -> bool {
        self.v2_mount.as_ref().is_some_and(|m| path.starts_with(m))
    }

    fn v1_controllers(&self, path: &Path) -> Vec<Controller> {
        self.v1
            .iter()
            .find(|(m, _)| path.starts_with(m))
            .map(|(_, c)| c.clone())
            .unwrap_or_default()
    }

    pub fn mkdir(&self, path: &Path) -> io::Result<()> {
        self.mkdirs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::fs::create_dir(path)?;
        let parent = path.parent().unwrap_or(path);
        put(path, "cgroup.procs", "");
        if self.is_v2(path) {
            let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control"))?;
            let enabled: Vec<&str> = enabled.split_whitespace().collect();
            put(
                path,
                "cgroup.controllers",
                &format!("{}\n", enabled.join(" ")),
            );
            put(path, "cgroup.subtree_control", "\n");
            put(path, "cgroup.type", "domain\n");
            put(path, "cgroup.events", "populated 0\nfrozen 0\n");
            put(
                path,
                "cpu.stat",
                "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
            );
            if self.cgroup_kill {
                put(path, "cgroup.kill", "");
            }
            for c in enabled {
                match c {
                    "memory" => {
                        put(path, "memory.max", "max\n");
                        put(path, "memory.current", "0\n");
                        put(path, "memory.peak", "0\n");
                        put(path, "memory.oom.group", "0\n");
                        put(
                            path,
                            "memory.events",
                            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
                        );
                        if self.swap {
                            put(path, "memory.swap.max", "max\n");
                        }
                    }
                    "pids" => {
                        put(path, "pids.max", "max\n");
                        put(path, "pids.current", "0\n");
                        put(path, "pids.peak", "0\n");
                        put(path, "pids.events", "max 0\n");
                    }
                    "cpu" => {
                        put(path, "cpu.max", "max 100000\n");
                        put(path, "cpu.weight", "100\n");
                    }
                    _ => {}
                }
            }
        } else {
            put(path, "tasks", "");
            put(path, "notify_on_release", "0\n");
            for c in self.v1_controllers(path) {
                match c {
                    Controller::Memory => {
                        put(path, "memory.limit_in_bytes", "9223372036854771712\n");
                        put(path, "memory.max_usage_in_bytes", "0\n");
                        put(path, "memory.usage_in_bytes", "0\n");
                        put(
                            path,
                            "memory.oom_control",
                            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                        );
                        if self.swap {
                            put(path, "memory.memsw.limit_in_bytes", "9223372036854771712\n");
                            put(path, "memory.memsw.max_usage_in_bytes", "0\n");
                        }
                    }
                    Controller::Pids => {
                        put(path, "pids.max", "max\n");
                        put(path, "pids.current", "0\n");
                        put(path, "pids.peak", "0\n");
                        put(path, "pids.events", "max 0\n");
                    }
                    Controller::Cpu => {
                        put(path, "cpu.cfs_period_us", "100000\n");
                        put(path, "cpu.cfs_quota_us", "-1\n");
                    }
                    Controller::Cpuacct => put(path, "cpuacct.usage", "0\n"),
                    Controller::Freezer => put(path, "freezer.state", "THAWED\n"),
                }
            }
        }
        Ok(())
    }

    fn live_pids(&self, dir: &Path) -> Vec<i32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p| live(*p))
            .collect()
    }

    pub fn rmdir(&self, path: &Path) -> io::Result<()> {
        if !path.is_dir() {
            return Err(io_err(libc::ENOENT));
        }
        if !self.live_pids(path).is_empty() {
            return Err(io_err(libc::EBUSY));
        }
        for entry in std::fs::read_dir(path)? {
            if entry?.file_type()?.is_dir() {
                return Err(io_err(libc::EBUSY));
            }
        }
        std::fs::remove_dir_all(path)
    }

    pub fn read(&self, path: &Path) -> io::Result<String> {
        let text = std::fs::read_to_string(path)?;
        match path.file_name().and_then(|n| n.to_str()) {
            Some("cgroup.procs") | Some("tasks") => {
                let dir = path.parent().unwrap_or(path);
                Ok(self
                    .live_pids(dir)
                    .iter()
                    .map(|p| format!("{p}\n"))
                    .collect())
            }
            _ => Ok(text),
        }
    }

    pub fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        if !path.is_file() {
            return Err(io_err(libc::ENOENT));
        }
        let dir = path.parent().unwrap_or(path);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some((refused, code)) = self.refuse_writes {
            if name == refused {
                return Err(io_err(code));
            }
        }
        let value = value.trim();
        match name {
            "cgroup.procs" => {
                let pid: i32 = value.parse().map_err(|_| io_err(libc::EINVAL))?;
                if !live(pid) {
                    return Err(io_err(libc::ESRCH));
                }
                for file in ["cgroup.procs", "tasks"] {
                    let p = dir.join(file);
                    if p.is_file() {
                        let mut text = std::fs::read_to_string(&p)?;
                        text.push_str(&format!("{pid}\n"));
                        std::fs::write(&p, text)?;
                    }
                }
                Ok(())
            }
            "cgroup.subtree_control" => {
                // What the parent enabled is what this group offers.
                let offered = if self.v2_mount.as_deref() == Some(dir) {
                    std::fs::read_to_string(dir.join("cgroup.controllers"))?
                } else {
                    let parent = dir.parent().unwrap_or(dir);
                    std::fs::read_to_string(parent.join("cgroup.subtree_control"))?
                };
                let mut enabled: Vec<String> = std::fs::read_to_string(path)?
                    .split_whitespace()
                    .map(str::to_string)
                    .collect();
                for token in value.split_whitespace() {
                    let (plus, c) = match token.split_at_checked(1) {
                        Some(("+", c)) => (true, c),
                        Some(("-", c)) => (false, c),
                        _ => return Err(io_err(libc::EINVAL)),
                    };
                    if !offered.split_whitespace().any(|o| o == c) {
                        return Err(io_err(libc::ENOENT));
                    }
                    let is_mount_root = self.v2_mount.as_deref() == Some(dir);
                    if !is_mount_root && !self.live_pids(dir).is_empty() {
                        return Err(io_err(libc::EBUSY));
                    }
                    enabled.retain(|e| e != c);
                    if plus {
                        enabled.push(c.to_string());
                    }
                }
                std::fs::write(path, format!("{}\n", enabled.join(" ")))
            }
            "cgroup.kill" => {
                if value != "1" {
                    return Err(io_err(libc::EINVAL));
                }
                for pid in self.live_pids(dir) {
                    let _ = corral_sys::process::kill(pid, libc::SIGKILL);
                }
                // Kept so tests can see it was used.
                std::fs::write(path, "1\n")
            }
            "freezer.state" => match value {
                "FROZEN" | "THAWED" => std::fs::write(path, format!("{value}\n")),
                _ => Err(io_err(libc::EINVAL)),
            },
            "memory.limit_in_bytes" | "memory.memsw.limit_in_bytes" => {
                let v: u64 = value.parse().map_err(|_| io_err(libc::EINVAL))?;
                let num = |f: &str| -> Option<u64> {
                    std::fs::read_to_string(dir.join(f))
                        .ok()?
                        .trim()
                        .parse()
                        .ok()
                };
                // The kernel keeps memory <= memory+swap.
                let bad = if name == "memory.limit_in_bytes" {
                    num("memory.memsw.limit_in_bytes").is_some_and(|sw| v > sw)
                } else {
                    num("memory.limit_in_bytes").is_some_and(|m| v < m)
                };
                if bad {
                    return Err(io_err(libc::EINVAL));
                }
                std::fs::write(path, format!("{v}\n"))
            }
            _ => std::fs::write(path, format!("{value}\n")),
        }
    }
}
