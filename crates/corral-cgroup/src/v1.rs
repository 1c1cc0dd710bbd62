//! cgroup v1: one directory under `<hierarchy>/corral` in each hierarchy
//! a set limit needs (memory, pids, cpu). No cpuacct or freezer groups:
//! CPU time comes from wait4, and the kill loop signals each pid until
//! none is left. Stale groups older corral versions left in cpuacct or
//! freezer are still found by the sweep (and frozen before the kill).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{
    cpu_quota_us, ensure_dir, keyed_u64, read_opt, read_pids, write_file, Backend, CgroupEnforced,
    CgroupError, CgroupLimits, CgroupStats, Controller, GroupDir, SandboxCgroup, StatFiles,
    BASE_DIR, CPU_PERIOD_US,
};

/// How often a group's `mkdir` is tried: the first finds `corral/`
/// missing on a host's first run, the others when another corral removed
/// it in between.
const MKDIR_ATTEMPTS: usize = 4;

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

/// Creates `<hierarchy>/corral/<name>`, and `corral/` when it is missing
/// (the first run on a host, or another corral removed it in between).
/// The group is tried first: `corral/` is there for every other run, whose
/// `mkdir` of it would only fail with EEXIST.
fn make_group(backend: &Backend, mount: &Path, name: &str) -> Result<PathBuf, CgroupError> {
    let base = mount.join(BASE_DIR);
    let group = base.join(name);
    let mut attempt = 0;
    loop {
        match backend.mkdir(&group) {
            Ok(()) => return Ok(group),
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt + 1 < MKDIR_ATTEMPTS => {
                attempt += 1;
                ensure_dir(backend, &base)?;
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

/// Creates the group in each hierarchy a set limit needs, and in no
/// other, and writes the limits. The caller has validated `name` and
/// checked [`super::CgroupHost::can_enforce`].
pub(super) fn create(
    backend: &Backend,
    mounts: &BTreeMap<Controller, PathBuf>,
    name: &str,
    limits: &CgroupLimits,
) -> Result<SandboxCgroup, CgroupError> {
    let required: Vec<Controller> = limits.requested().into_iter().map(|(_, c, _)| c).collect();
    // Only the hierarchies a limit needs: each v1 mkdir (memory above all)
    // costs start-up time, CPU time comes from wait4 anyway, and the pid
    // namespace already kills the whole tree, the freezer being a backstop
    // we do without.
    let useful = |c: &Controller| required.contains(c);
    let mut cg = SandboxCgroup {
        v2: false,
        dirs: Vec::new(),
        enforced: CgroupEnforced::none("v1"),
        backend: backend.clone(),
        done: false,
        stat_files: std::sync::OnceLock::new(),
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
        // Written without a look first: a kernel without swap accounting
        // has no such file, which its open says.
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        let value = bytes.to_string();
        match backend.write(&memsw, &value) {
            Ok(()) => enforced.memory_includes_swap = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                enforced.notes.push(format!(
                    "{} is missing (kernel without swap accounting; boot with swapaccount=1): swap is not limited",
                    memsw.display()
                ));
            }
            Err(source) => {
                return Err(CgroupError::Write {
                    path: memsw,
                    value,
                    source,
                })
            }
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

/// For a group with a freezer directory (only stale groups of older
/// corral versions, found by the sweep): freezes it, sends SIGKILL to every
/// process and thaws it, so no process can fork between the listing and
/// the kill. Otherwise nothing: the caller's loop signals each pid until
/// none is left.
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

/// Usage figures from the memory and pids hierarchies, and from cpuacct
/// where it is co-mounted with cpu (so only with a cpu limit).
/// The files [`stats`] reads: each in the hierarchy of its controller.
pub(super) fn stat_files(dirs: &[GroupDir]) -> StatFiles {
    let file = |c: Controller, f: &str| {
        dirs.iter()
            .find(|d| d.controllers.contains(&c))
            .map(|d| d.path.join(f))
    };
    StatFiles {
        peak: file(Controller::Memory, "memory.max_usage_in_bytes"),
        // oom_kill since Linux 4.13; under_oom when the OOM killer is
        // disabled or still at work.
        oom: file(Controller::Memory, "memory.oom_control"),
        cpu: file(Controller::Cpuacct, "cpuacct.usage"),
        pids_peak: file(Controller::Pids, "pids.peak"),
        pids_events: file(Controller::Pids, "pids.events"),
    }
}

/// The group's figures, from `files` read by `read`.
pub(super) fn stats(read: &dyn Fn(&Path) -> Option<String>, files: &StatFiles) -> CgroupStats {
    let number = |p: &Option<PathBuf>| read(p.as_deref()?)?.trim().parse().ok();
    let text = |p: &Option<PathBuf>| p.as_deref().and_then(read).unwrap_or_default();
    let oom = text(&files.oom);
    let oom = |key: &str| keyed_u64(&oom, key).unwrap_or(0) > 0;
    CgroupStats {
        peak_memory_bytes: number(&files.peak),
        oom_killed: oom("oom_kill") || oom("under_oom"),
        cpu_usage_ns: number(&files.cpu),
        pids_peak: number(&files.pids_peak),
        pids_limit_hit: keyed_u64(&text(&files.pids_events), "max").unwrap_or(0) > 0,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    use super::super::fake::{FakeKernel, Guard, TestDir};
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
        host_with(hierarchies, swap, |_| {})
    }

    /// [`host`] on a fake kernel that `tweak` changed first.
    fn host_with(
        hierarchies: &[(&str, &[Controller])],
        swap: bool,
        tweak: impl FnOnce(&mut FakeKernel),
    ) -> (TestDir, CgroupHost) {
        let dir = TestDir::new("v1");
        let (mut kernel, mountinfo, own) = FakeKernel::v1(&dir.0, hierarchies, swap);
        tweak(&mut kernel);
        let mut host = CgroupHost::from_mountinfo_at(&dir.0, &mountinfo, &own).unwrap();
        host.backend = Backend::Fake(Arc::new(kernel));
        (dir, host)
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    /// The hierarchies among `hierarchies` (directory names below `root`,
    /// in that order) that have `corral/<name>`, or with no name,
    /// `corral/` itself.
    fn made(root: &Path, hierarchies: &[(&str, &[Controller])], name: Option<&str>) -> Vec<String> {
        hierarchies
            .iter()
            .map(|(h, _)| *h)
            .filter(|h| {
                let base = root.join(h).join(BASE_DIR);
                match name {
                    Some(n) => base.join(n).is_dir(),
                    None => base.is_dir(),
                }
            })
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_kill_loop_signals_only_processes_still_in_the_group() {
        let (_dir, host) = host(SEPARATE, true);
        let limits = CgroupLimits {
            pids: Some(8),
            ..Default::default()
        };
        let cg = host.create(&sandbox_group_name(), &limits).unwrap();
        // `outsider` stands for a host process that got the number of a
        // sandbox process which exited after the group was listed.
        let mut outsider = Guard::sleep();
        let mut member = Guard::sleep();
        cg.add_process(member.pid()).unwrap();
        cg.kill_members(&[outsider.pid(), member.pid()]);
        assert_eq!(member.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(outsider.wait_signal(1), None, "a non-member was killed");
        assert!(super::super::fake::live(outsider.pid()));
    }

    #[test]
    fn a_group_costs_one_mkdir_per_hierarchy_once_corral_dir_exists() {
        let (_dir, host) = host(SEPARATE, true);
        let Backend::Fake(kernel) = &host.backend else {
            unreachable!()
        };
        let mkdirs = || kernel.mkdirs.load(std::sync::atomic::Ordering::Relaxed);
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(32),
            ..Default::default()
        };
        // The first group on the host makes `corral/` too (memory, pids:
        // the group, NotFound; `corral/`; the group again).
        host.create(&sandbox_group_name(), &limits)
            .unwrap()
            .remove()
            .unwrap();
        assert_eq!(mkdirs(), 6);
        // Every later one: the group alone.
        let cg = host.create(&sandbox_group_name(), &limits).unwrap();
        assert_eq!(mkdirs(), 8);
        assert_eq!(cg.paths().len(), 2);
        cg.remove().unwrap();
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
        // Exactly the hierarchies of the three limits: no cpuacct or
        // freezer group, not even a `corral/` there.
        let expected: Vec<PathBuf> = ["memory", "pids", "cpu"].iter().map(|h| g(h)).collect();
        assert_eq!(
            cg.paths(),
            expected.iter().map(PathBuf::as_path).collect::<Vec<_>>()
        );
        assert_eq!(made(&root, SEPARATE, None), ["cpu", "memory", "pids"]);
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
        // No freezer group: the per-pid SIGKILL loop does the kill.
        cg.kill_all();
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        assert!(cg.pids().is_empty());
        assert_eq!(made(&root, SEPARATE, None), ["cpu", "memory", "pids"]);

        std::fs::write(g("memory").join("memory.max_usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(
            g("memory").join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        std::fs::write(g("pids").join("pids.peak"), "2\n").unwrap();
        // No cpuacct group, so no cgroup cpu time (corral has wait4's).
        assert_eq!(
            cg.stats(),
            CgroupStats {
                peak_memory_bytes: Some(4096),
                oom_killed: true,
                cpu_usage_ns: None,
                pids_peak: Some(2),
                pids_limit_hit: false,
            }
        );
        // A fork refused at pids.max, as v1's pids.events counts it.
        std::fs::write(g("pids").join("pids.events"), "max 3\n").unwrap();
        assert!(cg.stats().pids_limit_hit);
        cg.remove().unwrap();
        for p in &expected {
            assert!(!p.exists(), "{}", p.display());
        }
    }

    #[test]
    fn only_the_hierarchies_of_the_set_limits_are_used() {
        let mem = Some(1 << 20);
        let cases: [(CgroupLimits, &[&str]); 5] = [
            (CgroupLimits::default(), &[]),
            (
                CgroupLimits {
                    memory_bytes: mem,
                    ..Default::default()
                },
                &["memory"],
            ),
            (
                CgroupLimits {
                    pids: Some(8),
                    ..Default::default()
                },
                &["pids"],
            ),
            (
                CgroupLimits {
                    cpu_millicores: Some(500),
                    ..Default::default()
                },
                &["cpu"],
            ),
            (
                CgroupLimits {
                    memory_bytes: mem,
                    pids: Some(8),
                    cpu_millicores: None,
                },
                &["memory", "pids"],
            ),
        ];
        for (limits, wanted) in cases {
            let (dir, host) = host(SEPARATE, true);
            let root = dir.0.join("sys/fs/cgroup");
            let name = sandbox_group_name();
            let cg = host.create(&name, &limits).unwrap();
            let expected: Vec<PathBuf> = wanted
                .iter()
                .map(|h| root.join(h).join(BASE_DIR).join(&name))
                .collect();
            assert_eq!(
                cg.paths(),
                expected.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
                "{limits:?}"
            );
            // Nothing at all in the other hierarchies, not even `corral/`.
            let mut bases = made(&root, SEPARATE, None);
            bases.sort();
            let mut sorted = wanted.to_vec();
            sorted.sort();
            assert_eq!(bases, sorted, "{limits:?}");
            assert_eq!(cg.enforced().controllers, wanted, "{limits:?}");
            assert_eq!(cg.stats().cpu_usage_ns, None, "{limits:?}");
            cg.remove().unwrap();
            assert!(made(&root, SEPARATE, Some(&name)).is_empty(), "{limits:?}");
        }
    }

    #[test]
    fn comounted_cpu_and_cpuacct_is_used_only_with_a_cpu_limit() {
        const COMOUNTED: &[(&str, &[Controller])] =
            &[("cpu,cpuacct", &[Cpu, Cpuacct]), ("memory", &[Memory])];
        // A cpu limit: the shared directory only; its cpuacct.usage comes
        // along at no extra cost and is reported.
        let (dir, host) = host(COMOUNTED, false);
        let root = dir.0.join("sys/fs/cgroup");
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
        let cpu = root.join("cpu,cpuacct/corral").join(&name);
        assert_eq!(cg.paths(), vec![cpu.as_path()]);
        assert_eq!(made(&root, COMOUNTED, None), ["cpu,cpuacct"]);
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "200000");
        std::fs::write(cpu.join("cpuacct.usage"), "123456\n").unwrap();
        let stats = cg.stats();
        assert_eq!(stats.cpu_usage_ns, Some(123456));
        // No memory limit, so no memory group and no memory figures.
        assert_eq!(stats.peak_memory_bytes, None);
        // No pids hierarchy: no pids figures.
        assert_eq!(stats.pids_peak, None);
        cg.remove().unwrap();
        assert!(!cpu.exists());

        // No cpu limit: the shared hierarchy is not touched at all.
        let (dir, host) = self::host(COMOUNTED, false);
        let root = dir.0.join("sys/fs/cgroup");
        let name = sandbox_group_name();
        let cg = host
            .create(
                &name,
                &CgroupLimits {
                    memory_bytes: Some(1 << 20),
                    ..Default::default()
                },
            )
            .unwrap();
        let mem = root.join("memory/corral").join(&name);
        assert_eq!(cg.paths(), vec![mem.as_path()]);
        assert_eq!(made(&root, COMOUNTED, None), ["memory"]);
        assert_eq!(cg.stats().cpu_usage_ns, None);
        cg.remove().unwrap();
        assert!(!mem.exists());
    }

    /// Only a missing memory+swap file means "no swap accounting": any
    /// other refusal of its limit fails the group, as the memory limit's
    /// would.
    #[test]
    fn a_memsw_limit_the_kernel_refuses_fails_the_group() {
        let (dir, host) = host_with(SEPARATE, true, |k| {
            k.refuse_writes = Some(("memory.memsw.limit_in_bytes", libc::EBUSY));
        });
        let name = sandbox_group_name();
        let err = host
            .create(
                &name,
                &CgroupLimits {
                    memory_bytes: Some(1 << 20),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            matches!(&err, CgroupError::Write { path, .. } if path.ends_with("memory.memsw.limit_in_bytes")),
            "{err:?}"
        );
        // Nothing of the group is left behind.
        let root = dir.0.join("sys/fs/cgroup");
        assert!(made(&root, SEPARATE, Some(&name)).is_empty());
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
        // No freezer hierarchy mounted at all.
        let (_dir, host) = host(&[("memory", &[Memory]), ("pids", &[Pids])], true);
        let cg = host
            .create(
                &sandbox_group_name(),
                &CgroupLimits {
                    memory_bytes: Some(1 << 20),
                    pids: Some(8),
                    cpu_millicores: None,
                },
            )
            .unwrap();
        let paths: Vec<PathBuf> = cg.paths().iter().map(|p| p.to_path_buf()).collect();
        assert_eq!(paths.len(), 2);
        let mut a = Guard::sleep();
        let mut b = Guard::sleep();
        cg.add_process(a.pid()).unwrap();
        cg.add_process(b.pid()).unwrap();
        assert_eq!(cg.pids().len(), 2);
        // Processes are left, so remove kills them before the rmdir.
        cg.remove().unwrap();
        assert_eq!(a.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(b.wait_signal(5), Some(libc::SIGKILL));
        for p in &paths {
            assert!(!p.exists(), "{}", p.display());
        }
    }

    #[test]
    fn sweep_removes_stale_groups_in_every_hierarchy() {
        let (dir, host) = host(SEPARATE, true);
        let root = dir.0.join("sys/fs/cgroup");
        let mut done = Command::new("true").spawn().unwrap();
        let dead = done.id();
        done.wait().unwrap();

        // Left by a killed corral of this version: memory, pids and cpu.
        let current = format!("{dead}-3");
        let mut stale = host
            .create(
                &current,
                &CgroupLimits {
                    memory_bytes: Some(1 << 20),
                    pids: Some(8),
                    cpu_millicores: Some(500),
                },
            )
            .unwrap();
        assert_eq!(
            made(&root, SEPARATE, Some(&current)),
            ["cpu", "memory", "pids"]
        );
        let mut a = Guard::sleep();
        stale.add_process(a.pid()).unwrap();
        stale.done = true;
        drop(stale);

        // Left by older corral versions, which also made cpuacct and
        // freezer groups: one in every hierarchy, and one of a corral
        // killed while removing its group, left only in cpuacct and
        // freezer (the last two it removes), where this version never
        // creates anything.
        let leave_old = |name: &str, hs: &[&str], pid: i32| {
            for h in hs {
                make_group(&host.backend, &root.join(h), name).unwrap();
            }
            let mut g = host.existing_group(name).unwrap();
            assert_eq!(g.paths().len(), hs.len());
            g.add_process(pid).unwrap();
            g.done = true;
        };
        let old = format!("{dead}-4");
        let mut b = Guard::sleep();
        leave_old(
            &old,
            &["memory", "pids", "cpu", "cpuacct", "freezer"],
            b.pid(),
        );
        let half_removed = format!("{dead}-5");
        let mut c = Guard::sleep();
        leave_old(&half_removed, &["cpuacct", "freezer"], c.pid());
        // The old group's freezer.state, kept past its rmdir through a
        // hard link and marked, to see that the sweep froze it.
        let witness = dir.0.join("freezer.state.witness");
        std::fs::hard_link(
            root.join("freezer/corral").join(&old).join("freezer.state"),
            &witness,
        )
        .unwrap();
        std::fs::write(&witness, "untouched\n").unwrap();

        // A live corral's group (ours) is left alone.
        let ours_name = sandbox_group_name();
        let mut ours = host
            .create(
                &ours_name,
                &CgroupLimits {
                    pids: Some(8),
                    ..Default::default()
                },
            )
            .unwrap();
        ours.done = true;
        drop(ours);

        assert_eq!(host.sweep_stale(), 3);
        assert_eq!(a.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(b.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(c.wait_signal(5), Some(libc::SIGKILL));
        for name in [&current, &old, &half_removed] {
            assert!(made(&root, SEPARATE, Some(name)).is_empty(), "{name}");
        }
        assert_eq!(read(&witness), "THAWED");
        assert_eq!(made(&root, SEPARATE, Some(&ours_name)), ["pids"]);
        assert_eq!(host.sweep_stale(), 0);
        host.existing_group(&ours_name).unwrap().remove().unwrap();
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

    /// A group with `limits` on the real v1 host (None: skipped), with the
    /// bases it found missing (to remove afterwards) and its name.
    fn real_v1_group(
        limits: CgroupLimits,
    ) -> Option<(CgroupHost, Vec<PathBuf>, String, SandboxCgroup)> {
        let host = real_v1_host()?;
        let bases = missing_bases(&host);
        let name = sandbox_group_name();
        let cg = host.create(&name, &limits).unwrap();
        Some((host, bases, name, cg))
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
        let Some((host, bases, name, cg)) = real_v1_group(CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(16),
            cpu_millicores: Some(500),
        }) else {
            return;
        };
        eprintln!("real cgroup: {:?}", cg.paths());
        eprintln!("enforced: {:?}", cg.enforced());
        let Version::V1 { mounts } = host.version() else {
            unreachable!("real_v1_host checked the version");
        };
        // Exactly the hierarchies of memory, pids and cpu; nothing in the
        // others (cpuacct, freezer, ...), not even a `corral/` this test
        // found missing.
        let needed = [Memory, Pids, Cpu];
        let all: Vec<(PathBuf, Vec<Controller>)> = hierarchies(mounts);
        let is_needed = |cs: &[Controller]| cs.iter().any(|c| needed.contains(c));
        let paths: Vec<PathBuf> = all
            .iter()
            .filter(|(_, cs)| is_needed(cs))
            .map(|(m, _)| m.join(BASE_DIR).join(&name))
            .collect();
        assert_eq!(
            cg.paths(),
            paths.iter().map(PathBuf::as_path).collect::<Vec<_>>()
        );
        for (m, cs) in &all {
            let group = m.join(BASE_DIR).join(&name);
            assert_eq!(group.is_dir(), is_needed(cs), "{}", group.display());
            if !is_needed(cs) && bases.contains(&m.join(BASE_DIR)) {
                assert!(!m.join(BASE_DIR).exists(), "{} created", m.display());
            }
        }
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
        // In the group in the memory, pids and cpu hierarchies (each line
        // of those is), and in no other.
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.pid())).unwrap();
        let wanted = format!("/{BASE_DIR}/{name}");
        let mut inside = 0;
        for l in own.lines() {
            let mut f = l.splitn(3, ':').skip(1);
            let (Some(cs), Some(path)) = (f.next(), f.next()) else {
                panic!("malformed line {l:?} in\n{own}");
            };
            let limited = cs.split(',').any(|x| needed.iter().any(|c| c.name() == x));
            assert_eq!(path == wanted, limited, "{l:?} in\n{own}");
            inside += usize::from(limited);
        }
        assert_eq!(inside, paths.len(), "{own}");
        assert_eq!(cg.pids(), vec![child.pid()]);
        // Nothing is opened before it is asked for; then the files `stats`
        // reads are open, and it reads them there.
        assert!(cg.stat_files.get().is_none());
        cg.open_stat_files();
        let opened: Vec<&PathBuf> = cg
            .stat_files
            .get()
            .unwrap()
            .iter()
            .map(|(p, _)| p)
            .collect();
        let files = stat_files(&cg.dirs);
        assert_eq!(opened, files.all().collect::<Vec<_>>());
        assert!(opened.len() >= 4, "{opened:?}");
        let stats = cg.stats();
        eprintln!("stats: {stats:?}");
        assert!(stats.peak_memory_bytes.is_some(), "{stats:?}");
        assert_eq!(stats.pids_peak, Some(1), "{stats:?}");
        // cgroup cpu time only where cpuacct shares the cpu hierarchy.
        let comounted = mounts.contains_key(&Cpuacct) && mounts.get(&Cpuacct) == mounts.get(&Cpu);
        assert_eq!(stats.cpu_usage_ns.is_some(), comounted, "{stats:?}");
        assert!(!stats.oom_killed);

        // Without a freezer, descendants forked inside are killed too.
        let sh = Command::new("sh")
            .arg("-c")
            .arg("read _ || exit 3; sleep 30 & sleep 30 & wait")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut sh = Guard(sh);
        cg.add_process(sh.pid()).unwrap();
        sh.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while cg.pids().len() < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let sleeps: Vec<i32> = cg
            .pids()
            .into_iter()
            .filter(|p| *p != child.pid() && *p != sh.pid())
            .collect();
        assert_eq!(sleeps.len(), 2, "{:?}", cg.pids());

        let start = Instant::now();
        cg.kill_all();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(cg.pids().is_empty());
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(sh.wait_signal(5), Some(libc::SIGKILL));
        for p in sleeps {
            assert!(!super::super::fake::live(p), "sleep {p} survived");
        }
        cg.remove().unwrap();
        for (m, _) in &all {
            let group = m.join(BASE_DIR).join(&name);
            assert!(!group.exists(), "{} left behind", group.display());
        }
        remove_bases(&bases);
        for b in &bases {
            // Unless another corral uses it meanwhile.
            let in_use = std::fs::read_dir(b)
                .map(|d| d.flatten().any(|e| e.path().is_dir()))
                .unwrap_or(false);
            assert!(!b.exists() || in_use, "{} left behind", b.display());
        }
    }

    fn host_mount(host: &CgroupHost, c: Controller) -> PathBuf {
        match host.version() {
            Version::V1 { mounts } => mounts.get(&c).cloned().unwrap_or_default(),
            Version::V2 { mount, .. } => mount.clone(),
        }
    }

    #[test]
    fn real_v1_a_single_threaded_process_joins_itself_through_tasks() {
        let _serial = REAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_host, bases, name, cg)) = real_v1_group(CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(16),
            cpu_millicores: None,
        }) else {
            return;
        };
        let files = cg.self_join_files();
        let tasks: Vec<PathBuf> = cg.paths().iter().map(|p| p.join("tasks")).collect();
        assert_eq!(files, tasks);
        // sh (one thread) writes `0` into each file itself, as the forked
        // sandbox helper does, then waits.
        let sh = Command::new("sh")
            .arg("-c")
            .arg(r#"for f; do printf 0 > "$f" || exit 3; done; read _"#)
            .arg("sh")
            .args(&files)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut sh = Guard(sh);
        // In every hierarchy: `pids()` is their union, which the first
        // write already fills.
        let in_each = |pid: i32| {
            cg.paths()
                .iter()
                .all(|p| read_pids(&cg.backend, p).contains(&pid))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !in_each(sh.pid()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(in_each(sh.pid()), "sh did not join every hierarchy");
        assert_eq!(cg.pids(), vec![sh.pid()]);
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", sh.pid())).unwrap();
        let wanted = format!("/{BASE_DIR}/{name}");
        for c in ["memory", "pids"] {
            assert!(
                own.lines().any(|l| l.ends_with(&wanted)
                    && l.split(':')
                        .nth(1)
                        .is_some_and(|cs| cs.split(',').any(|x| x == c))),
                "not in the {c} group:\n{own}"
            );
        }
        cg.kill_all();
        assert_eq!(sh.wait_signal(5), Some(libc::SIGKILL));
        cg.remove().unwrap();
        remove_bases(&bases);
    }

    #[test]
    fn real_v1_memory_bomb_is_reported_as_oom() {
        let _serial = REAL.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_host, bases, _name, cg)) = real_v1_group(CgroupLimits {
            memory_bytes: Some(32 << 20),
            pids: Some(8),
            cpu_millicores: None,
        }) else {
            return;
        };
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
