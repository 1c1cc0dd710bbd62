//! cgroup v1: one directory per hierarchy under `<hierarchy>/corral`:
//! memory, pids, cpu (when limited), cpuacct (usage) and freezer (kill).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    cpu_quota_us, ensure_dir, keyed_u64, read_opt, read_pids, read_u64, write_file, Backend,
    CgroupEnforced, CgroupError, CgroupLimits, CgroupStats, Controller, GroupDir, SandboxCgroup,
    BASE_DIR, CPU_PERIOD_US,
};

/// How often creating a group directory is retried when `corral/`
/// vanished in between (another corral removed it).
const MKDIR_ATTEMPTS: usize = 3;

/// How long to wait for the freezer to report FROZEN before killing
/// anyway (a task in uninterruptible sleep can hold it in FREEZING).
const FREEZE_WAIT: Duration = Duration::from_millis(100);

/// The distinct hierarchies among `mounts`, each with the controllers it
/// carries, in [`Controller::ALL`] order. Co-mounted controllers
/// (`cpu,cpuacct`) give one entry.
pub(super) fn hierarchies(
    mounts: &BTreeMap<Controller, PathBuf>,
) -> Vec<(PathBuf, Vec<Controller>)> {
    let mut out: Vec<(PathBuf, Vec<Controller>)> = Vec::new();
    for c in Controller::ALL {
        let Some(path) = mounts.get(&c) else {
            continue;
        };
        match out.iter_mut().find(|(p, _)| p == path) {
            Some((_, cs)) => cs.push(c),
            None => out.push((path.clone(), vec![c])),
        }
    }
    out
}

/// Creates `<hierarchy>/corral/<name>` (retrying when `corral/` vanished).
fn make_group(backend: &Backend, mount: &Path, name: &str) -> Result<PathBuf, CgroupError> {
    let base = mount.join(BASE_DIR);
    let group = base.join(name);
    let mut attempt = 0;
    loop {
        ensure_dir(backend, &base)?;
        match backend.mkdir(&group) {
            Ok(()) => return Ok(group),
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt + 1 < MKDIR_ATTEMPTS => {
                attempt += 1;
            }
            Err(source) => {
                return Err(CgroupError::Create {
                    path: group,
                    source,
                })
            }
        }
    }
}

/// Creates the group in every hierarchy it needs and writes the limits.
/// A hierarchy needed for a limit must work; the others (usage, freezer)
/// are best effort and noted when they fail. The caller has validated
/// `name` and checked [`super::CgroupHost::can_enforce`].
pub(super) fn create(
    backend: &Backend,
    mounts: &BTreeMap<Controller, PathBuf>,
    name: &str,
    limits: &CgroupLimits,
) -> Result<SandboxCgroup, CgroupError> {
    let required: Vec<Controller> = limits.requested().into_iter().map(|(_, c, _)| c).collect();
    let useful = |c: &Controller| match c {
        Controller::Cpu => limits.cpu_millicores.is_some(),
        _ => true,
    };
    let mut cg = SandboxCgroup {
        v2: false,
        dirs: Vec::new(),
        enforced: CgroupEnforced::none("v1"),
        backend: backend.clone(),
        done: false,
    };
    let mut enforced = CgroupEnforced::none("v1");
    for (mount, controllers) in hierarchies(mounts) {
        if !controllers.iter().any(useful) {
            continue;
        }
        match make_group(backend, &mount, name) {
            Ok(path) => cg.dirs.push(GroupDir { path, controllers }),
            // Dropping `cg` removes what was created so far.
            Err(e) if controllers.iter().any(|c| required.contains(c)) => return Err(e),
            Err(e) => {
                let names: Vec<&str> = controllers.iter().map(|c| c.name()).collect();
                enforced
                    .notes
                    .push(format!("{} hierarchy not used: {e}", names.join(",")));
            }
        }
    }
    let dir_of = |c: Controller| {
        cg.dirs
            .iter()
            .find(|d| d.controllers.contains(&c))
            .map(|d| d.path.clone())
    };
    if let (Some(bytes), Some(dir)) = (limits.memory_bytes, dir_of(Controller::Memory)) {
        // memory first: the kernel keeps memory <= memory+swap, and both
        // start unlimited.
        write_file(
            backend,
            &dir.join("memory.limit_in_bytes"),
            &bytes.to_string(),
        )?;
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write_file(backend, &memsw, &bytes.to_string())?;
            enforced.memory_includes_swap = true;
        } else {
            enforced.notes.push(format!(
                "{} is missing (kernel without swap accounting; boot with swapaccount=1): swap is not limited",
                memsw.display()
            ));
        }
        enforced.controllers.push("memory");
        enforced.memory_bytes = Some(bytes);
    }
    if let (Some(n), Some(dir)) = (limits.pids, dir_of(Controller::Pids)) {
        write_file(backend, &dir.join("pids.max"), &n.to_string())?;
        enforced.controllers.push("pids");
        enforced.pids = Some(n);
    }
    if let (Some(m), Some(dir)) = (limits.cpu_millicores, dir_of(Controller::Cpu)) {
        let quota = cpu_quota_us(m).ok_or(CgroupError::InvalidLimit {
            limit: "cpu",
            value: m,
            reason: "is too large",
        })?;
        write_file(
            backend,
            &dir.join("cpu.cfs_period_us"),
            &CPU_PERIOD_US.to_string(),
        )?;
        write_file(backend, &dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        enforced.controllers.push("cpu");
        enforced.cpu_millicores = Some(m);
    }
    cg.enforced = enforced;
    Ok(cg)
}

/// Freezes the group, sends SIGKILL to every process and thaws it, so no
/// process can fork between the listing and the kill. Without a freezer
/// hierarchy the caller's loop signals each pid until none is left.
pub(super) fn kill(backend: &Backend, dirs: &[GroupDir]) {
    let Some(freezer) = dirs
        .iter()
        .find(|d| d.controllers.contains(&Controller::Freezer))
    else {
        return;
    };
    let state = freezer.path.join("freezer.state");
    if backend.write(&state, "FROZEN").is_ok() {
        let deadline = Instant::now() + FREEZE_WAIT;
        while Instant::now() < deadline
            && read_opt(backend, &state).is_some_and(|s| s.trim() != "FROZEN")
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for dir in dirs {
        for pid in read_pids(backend, &dir.path) {
            // Pending until the thaw; a frozen task cannot act on it or fork.
            let _ = corral_sys::process::kill(pid, libc::SIGKILL);
        }
    }
    let _ = backend.write(&state, "THAWED");
}

/// Usage figures from the memory, cpuacct and pids hierarchies.
pub(super) fn stats(backend: &Backend, dirs: &[GroupDir]) -> CgroupStats {
    let file = |c: Controller, f: &str| {
        dirs.iter()
            .find(|d| d.controllers.contains(&c))
            .map(|d| d.path.join(f))
    };
    let mut stats = CgroupStats::default();
    if let Some(p) = file(Controller::Memory, "memory.max_usage_in_bytes") {
        stats.peak_memory_bytes = read_u64(backend, &p);
    }
    if let Some(p) = file(Controller::Memory, "memory.oom_control") {
        let text = read_opt(backend, &p).unwrap_or_default();
        // oom_kill since Linux 4.13; under_oom when the OOM killer is
        // disabled or still at work.
        stats.oom_killed = keyed_u64(&text, "oom_kill").unwrap_or(0) > 0
            || keyed_u64(&text, "under_oom").unwrap_or(0) > 0;
    }
    if let Some(p) = file(Controller::Cpuacct, "cpuacct.usage") {
        stats.cpu_usage_ns = read_u64(backend, &p);
    }
    if let Some(p) = file(Controller::Pids, "pids.peak") {
        stats.pids_peak = read_u64(backend, &p);
    }
    if let Some(p) = file(Controller::Pids, "pids.events") {
        let text = read_opt(backend, &p).unwrap_or_default();
        stats.pids_limit_hit = keyed_u64(&text, "max").unwrap_or(0) > 0;
    }
    stats
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};
    use std::sync::{Arc, Mutex};

    use super::super::fake::{FakeKernel, TestDir};
    use super::super::{sandbox_group_name, CgroupHost, Version};
    use super::*;

    use Controller::{Cpu, Cpuacct, Freezer, Memory, Pids};

    /// The hierarchies of this host: one per controller.
    const SEPARATE: &[(&str, &[Controller])] = &[
        ("cpu", &[Cpu]),
        ("cpuacct", &[Cpuacct]),
        ("memory", &[Memory]),
        ("freezer", &[Freezer]),
        ("pids", &[Pids]),
    ];

    fn host(hierarchies: &[(&str, &[Controller])], swap: bool) -> (TestDir, CgroupHost) {
        let dir = TestDir::new("v1");
        let (kernel, mountinfo, own) = FakeKernel::v1(&dir.0, hierarchies, swap);
        let mut host = CgroupHost::from_mountinfo_at(&dir.0, &mountinfo, &own).unwrap();
        host.backend = Backend::Fake(Arc::new(kernel));
        (dir, host)
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    /// A child killed and reaped on drop.
    struct Guard(Child);

    impl Guard {
        fn sleep() -> Guard {
            Guard(Command::new("sleep").arg("30").spawn().unwrap())
        }
        fn pid(&self) -> i32 {
            self.0.id() as i32
        }
        /// Waits up to `secs` for the exit; the signal that ended it.
        fn wait_signal(&mut self, secs: u64) -> Option<i32> {
            let deadline = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < deadline {
                if let Some(status) = self.0.try_wait().unwrap() {
                    return status.signal();
                }
                std::thread::sleep(Duration::from_millis(5));
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

    #[test]
    fn create_limits_kill_stats_remove() {
        let (dir, host) = host(SEPARATE, true);
        let root = dir.0.join("sys/fs/cgroup");
        let name = sandbox_group_name();
        let cg = host
            .create(
                &name,
                &CgroupLimits {
                    memory_bytes: Some(64 << 20),
                    pids: Some(32),
                    cpu_millicores: Some(500),
                },
            )
            .unwrap();
        let g = |h: &str| root.join(h).join("corral").join(&name);
        let expected: Vec<PathBuf> = ["memory", "pids", "cpu", "cpuacct", "freezer"]
            .iter()
            .map(|h| g(h))
            .collect();
        assert_eq!(
            cg.paths(),
            expected.iter().map(PathBuf::as_path).collect::<Vec<_>>()
        );
        assert_eq!(read(&g("memory").join("memory.limit_in_bytes")), "67108864");
        // The fake refuses memsw below the memory limit, as the kernel does:
        // this passing shows the order of the two writes is right.
        assert_eq!(
            read(&g("memory").join("memory.memsw.limit_in_bytes")),
            "67108864"
        );
        assert_eq!(read(&g("pids").join("pids.max")), "32");
        assert_eq!(read(&g("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(read(&g("cpu").join("cpu.cfs_quota_us")), "50000");
        assert_eq!(
            cg.enforced(),
            CgroupEnforced {
                version: "v1",
                controllers: vec!["memory", "pids", "cpu"],
                memory_bytes: Some(64 << 20),
                memory_includes_swap: true,
                pids: Some(32),
                cpu_millicores: Some(500),
                notes: vec![],
            }
        );

        let mut child = Guard::sleep();
        cg.add_process(child.pid()).unwrap();
        for p in &expected {
            assert_eq!(
                read(&p.join("cgroup.procs")),
                child.pid().to_string(),
                "{}",
                p.display()
            );
        }
        cg.kill_all();
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(read(&g("freezer").join("freezer.state")), "THAWED");
        assert!(cg.pids().is_empty());

        std::fs::write(g("memory").join("memory.max_usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(
            g("memory").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        std::fs::write(g("cpuacct").join("cpuacct.usage"), "777\n").unwrap();
        std::fs::write(g("pids").join("pids.peak"), "2\n").unwrap();
        assert_eq!(
            cg.stats(),
            CgroupStats {
                peak_memory_bytes: Some(4096),
                oom_killed: true,
                cpu_usage_ns: Some(777),
                pids_peak: Some(2),
                pids_limit_hit: false,
            }
        );
        cg.remove().unwrap();
        for p in &expected {
            assert!(!p.exists(), "{}", p.display());
        }
    }

    #[test]
    fn without_a_cpu_limit_the_cpu_hierarchy_is_not_used() {
        let (_dir, host) = host(SEPARATE, true);
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let used: Vec<String> = cg
            .paths()
            .iter()
            .map(|p| {
                let hierarchy = p.parent().and_then(Path::parent).unwrap();
                hierarchy
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(used, ["memory", "pids", "cpuacct", "freezer"]);
        assert!(cg.enforced().controllers.is_empty());
    }

    #[test]
    fn comounted_cpu_and_cpuacct_share_one_directory() {
        let (dir, host) = host(
            &[("cpu,cpuacct", &[Cpu, Cpuacct]), ("memory", &[Memory])],
            false,
        );
        let name = sandbox_group_name();
        let cg = host
            .create(
                &name,
                &CgroupLimits {
                    cpu_millicores: Some(2000),
                    ..Default::default()
                },
            )
            .unwrap();
        let cpu = dir.0.join("sys/fs/cgroup/cpu,cpuacct/corral").join(&name);
        assert_eq!(cg.paths().len(), 2);
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "200000");
        std::fs::write(cpu.join("cpuacct.usage"), "123456\n").unwrap();
        assert_eq!(cg.stats().cpu_usage_ns, Some(123456));
        // No pids hierarchy: no pids figures.
        assert_eq!(cg.stats().pids_peak, None);
        cg.remove().unwrap();
        assert!(!cpu.exists());
    }

    #[test]
    fn missing_memsw_is_noted() {
        let (_dir, host) = host(SEPARATE, false);
        let cg = host
            .create(
                &sandbox_group_name(),
                &CgroupLimits {
                    memory_bytes: Some(1 << 20),
                    ..Default::default()
                },
            )
            .unwrap();
        let e = cg.enforced();
        assert!(!e.memory_includes_swap);
        assert!(
            e.notes[0].contains("memory.memsw.limit_in_bytes is missing"),
            "{:?}",
            e.notes
        );
        assert!(e.notes[0].contains("swapaccount=1"));
    }

    #[test]
    fn without_a_freezer_processes_are_signalled_until_gone() {
        let (_dir, host) = host(&[("memory", &[Memory]), ("pids", &[Pids])], true);
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let mut a = Guard::sleep();
        let mut b = Guard::sleep();
        cg.add_process(a.pid()).unwrap();
        cg.add_process(b.pid()).unwrap();
        cg.remove().unwrap();
        assert_eq!(a.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(b.wait_signal(5), Some(libc::SIGKILL));
    }

    #[test]
    fn sweep_removes_stale_groups_in_every_hierarchy() {
        let (dir, host) = host(SEPARATE, true);
        let mut done = Command::new("true").spawn().unwrap();
        let dead = done.id();
        done.wait().unwrap();
        let name = format!("{dead}-3");
        let mut stale = host.create(&name, &CgroupLimits::default()).unwrap();
        let mut orphan = Guard::sleep();
        stale.add_process(orphan.pid()).unwrap();
        stale.done = true;
        drop(stale);
        assert_eq!(host.sweep_stale(), 1);
        assert_eq!(orphan.wait_signal(5), Some(libc::SIGKILL));
        for h in ["memory", "pids", "cpuacct", "freezer"] {
            assert!(!dir
                .0
                .join("sys/fs/cgroup")
                .join(h)
                .join("corral")
                .join(&name)
                .exists());
        }
    }

    /// Real cgroups are host-wide: one real test at a time.
    static REAL: Mutex<()> = Mutex::new(());

    /// The real host, when running as root on cgroup v1 with writable
    /// memory and pids hierarchies (like the build machines).
    fn real_v1_host() -> Option<CgroupHost> {
        let skip = || {
            eprintln!("skipped: needs root and cgroup v1 memory+pids");
            None
        };
        if corral_sys::process::uids().1 != 0 {
            return skip();
        }
        let Ok(host) = CgroupHost::detect() else {
            return skip();
        };
        let Version::V1 { mounts } = host.version() else {
            return skip();
        };
        if !mounts.contains_key(&Memory) || !mounts.contains_key(&Pids) {
            return skip();
        }
        let probe = CgroupLimits {
            memory_bytes: Some(1 << 20),
            pids: Some(1),
            cpu_millicores: None,
        };
        if host.can_enforce(&probe).is_err() {
            return skip();
        }
        Some(host)
    }

    /// The `corral/` bases that do not exist yet, to remove after the test
    /// so the host is left as found.
    fn missing_bases(host: &CgroupHost) -> Vec<PathBuf> {
        let Version::V1 { mounts } = host.version() else {
            return Vec::new();
        };
        hierarchies(mounts)
            .into_iter()
            .map(|(m, _)| m.join(BASE_DIR))
            .filter(|b| !b.exists())
            .collect()
    }

    fn remove_bases(bases: &[PathBuf]) {
        for b in bases {
            // Fails harmlessly if another corral uses it meanwhile.
            let _ = std::fs::remove_dir(b);
        }
    }

    #[test]
    fn real_v1_group_holds_a_process_and_is_cleaned_up() {
        let _serial = REAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(host) = real_v1_host() else {
            return;
        };
        let bases = missing_bases(&host);
        let name = sandbox_group_name();
        let cg = host
            .create(
                &name,
                &CgroupLimits {
                    memory_bytes: Some(64 << 20),
                    pids: Some(16),
                    cpu_millicores: Some(500),
                },
            )
            .unwrap();
        eprintln!("real cgroup: {:?}", cg.paths());
        eprintln!("enforced: {:?}", cg.enforced());
        let paths: Vec<PathBuf> = cg.paths().iter().map(|p| p.to_path_buf()).collect();
        let mem = paths
            .iter()
            .find(|p| p.starts_with(host_mount(&host, Memory)))
            .unwrap()
            .clone();
        assert_eq!(
            read(&mem.join("memory.limit_in_bytes")),
            (64u64 << 20).to_string()
        );
        if mem.join("memory.memsw.limit_in_bytes").exists() {
            assert!(cg.enforced().memory_includes_swap);
            assert_eq!(
                read(&mem.join("memory.memsw.limit_in_bytes")),
                (64u64 << 20).to_string()
            );
        }

        let mut child = Guard::sleep();
        cg.add_process(child.pid()).unwrap();
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.pid())).unwrap();
        let wanted = format!("/{BASE_DIR}/{name}");
        for c in ["memory", "pids", "freezer"] {
            assert!(
                own.lines().any(|l| {
                    let mut f = l.splitn(3, ':').skip(1);
                    f.next().is_some_and(|cs| cs.split(',').any(|x| x == c))
                        && f.next() == Some(wanted.as_str())
                }),
                "{c} not {wanted} in\n{own}"
            );
        }
        assert_eq!(cg.pids(), vec![child.pid()]);
        let stats = cg.stats();
        eprintln!("stats: {stats:?}");
        assert!(stats.peak_memory_bytes.is_some());
        assert!(stats.cpu_usage_ns.is_some());
        assert!(!stats.oom_killed);

        let start = Instant::now();
        cg.kill_all();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        assert!(cg.pids().is_empty());
        cg.remove().unwrap();
        for p in &paths {
            assert!(!p.exists(), "{} left behind", p.display());
        }
        remove_bases(&bases);
    }

    fn host_mount(host: &CgroupHost, c: Controller) -> PathBuf {
        match host.version() {
            Version::V1 { mounts } => mounts.get(&c).cloned().unwrap_or_default(),
            Version::V2 { mount, .. } => mount.clone(),
        }
    }

    #[test]
    fn real_v1_memory_bomb_is_reported_as_oom() {
        let _serial = REAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some(host) = real_v1_host() else {
            return;
        };
        let bases = missing_bases(&host);
        let cg = host
            .create(
                &sandbox_group_name(),
                &CgroupLimits {
                    memory_bytes: Some(32 << 20),
                    pids: Some(8),
                    cpu_millicores: None,
                },
            )
            .unwrap();
        // Waits for a line so that it is inside the group before it
        // allocates; then doubles a shell string until the limit hits.
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"read _ || exit 3; x=aaaaaaaa; while :; do x="$x$x"; done"#)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Guard(child);
        cg.add_process(child.pid()).unwrap();
        child.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let signal = child.wait_signal(20);
        let stats = cg.stats();
        eprintln!("memory bomb: signal {signal:?}, stats {stats:?}");
        assert_eq!(signal, Some(libc::SIGKILL));
        assert!(stats.oom_killed, "{stats:?}");
        assert!(
            stats.peak_memory_bytes.unwrap_or(0) >= 16 << 20,
            "{stats:?}"
        );
        cg.remove().unwrap();
        remove_bases(&bases);
    }
}
