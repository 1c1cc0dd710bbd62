//! cgroup v2: one directory per sandbox under `<mount>/corral`, with the
//! controllers enabled through `cgroup.subtree_control` on the way down.

use std::io;
use std::path::{Path, PathBuf};

use super::{
    cpu_quota_us, ensure_dir, keyed_u64, write_file, Backend, CgroupEnforced, CgroupError,
    CgroupLimits, CgroupStats, Controller, GroupDir, SandboxCgroup, StatFiles, BASE_DIR,
    CPU_PERIOD_US,
};

/// How often creating the group is retried when `corral/` vanished in
/// between (another corral removed it).
const MKDIR_ATTEMPTS: usize = 3;

/// Enables `wanted` in `dir/cgroup.subtree_control` where not enabled yet.
fn enable(backend: &Backend, dir: &Path, wanted: &[Controller]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let current = backend.read(&file).map_err(|source| CgroupError::Read {
        path: file.clone(),
        source,
    })?;
    for c in wanted {
        if current.split_whitespace().any(|e| e == c.name()) {
            continue;
        }
        let value = format!("+{}", c.name());
        match backend.write(&file, &value) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(CgroupError::InternalProcesses {
                    path: dir.to_path_buf(),
                    controller: c.name(),
                })
            }
            Err(source) => {
                return Err(CgroupError::Write {
                    path: file,
                    value,
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Creates `<mount>/corral/<name>` and writes the limits. The caller has
/// validated `name` and checked [`super::CgroupHost::can_enforce`].
pub(super) fn create(
    backend: &Backend,
    mount: &Path,
    offered: &[String],
    name: &str,
    limits: &CgroupLimits,
) -> Result<SandboxCgroup, CgroupError> {
    let offers = |c: Controller| offered.iter().any(|o| o == c.name());
    // memory and pids also without a limit, for peak usage and OOM
    // reporting; cpu only when limited (cpu.stat exists in every group).
    let mut wanted: Vec<Controller> = [Controller::Memory, Controller::Pids]
        .into_iter()
        .filter(|c| offers(*c))
        .collect();
    if limits.cpu_millicores.is_some() {
        wanted.push(Controller::Cpu);
    }
    let base = mount.join(BASE_DIR);
    let group = base.join(name);
    let mut attempt = 0;
    loop {
        enable(backend, mount, &wanted)?;
        ensure_dir(backend, &base)?;
        enable(backend, &base, &wanted)?;
        match backend.mkdir(&group) {
            Ok(()) => break,
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
    // From here on, dropping `cg` on an error removes the directory.
    let mut cg = SandboxCgroup {
        v2: true,
        dirs: vec![GroupDir {
            path: group.clone(),
            controllers: wanted,
        }],
        enforced: CgroupEnforced::none("v2"),
        backend: backend.clone(),
        done: false,
        stat_files: std::sync::OnceLock::new(),
    };
    let mut enforced = CgroupEnforced::none("v2");
    // An OOM kill, whatever limit caused it, ends the whole sandbox rather
    // than leaving it half-dead.
    let oom_group = group.join("memory.oom.group");
    if oom_group.exists() {
        write_file(backend, &oom_group, "1")?;
    }
    if let Some(bytes) = limits.memory_bytes {
        write_file(backend, &group.join("memory.max"), &bytes.to_string())?;
        let swap = group.join("memory.swap.max");
        if swap.exists() {
            write_file(backend, &swap, "0")?;
            enforced.memory_includes_swap = true;
        } else {
            enforced.notes.push(format!(
                "{} is missing (kernel without swap accounting): swap is not limited",
                swap.display()
            ));
        }
        enforced.controllers.push("memory");
        enforced.memory_bytes = Some(bytes);
    }
    if let Some(n) = limits.pids {
        write_file(backend, &group.join("pids.max"), &n.to_string())?;
        enforced.controllers.push("pids");
        enforced.pids = Some(n);
    }
    if let Some(m) = limits.cpu_millicores {
        let quota = cpu_quota_us(m).ok_or(CgroupError::InvalidLimit {
            limit: "cpu",
            value: m,
            reason: "is too large",
        })?;
        write_file(
            backend,
            &group.join("cpu.max"),
            &format!("{quota} {CPU_PERIOD_US}"),
        )?;
        enforced.controllers.push("cpu");
        enforced.cpu_millicores = Some(m);
    }
    cg.enforced = enforced;
    Ok(cg)
}

/// Kills the group at once with `cgroup.kill` (Linux 5.14+). Without it,
/// the caller's loop signals each pid.
pub(super) fn kill(backend: &Backend, dirs: &[GroupDir]) {
    for dir in dirs {
        let file = dir.path.join("cgroup.kill");
        if file.exists() {
            let _ = backend.write(&file, "1");
        }
    }
}

/// Usage figures from the group's files.
/// The files [`stats`] reads, all in the group's one directory.
pub(super) fn stat_files(dirs: &[GroupDir]) -> StatFiles {
    let Some(dir) = dirs.first() else {
        return StatFiles::default();
    };
    let p = |f: &str| Some(dir.path.join(f));
    StatFiles {
        peak: p("memory.peak"),
        oom: p("memory.events"),
        cpu: p("cpu.stat"),
        pids_peak: p("pids.peak"),
        pids_events: p("pids.events"),
    }
}

/// The group's figures, from `files` read by `read`.
pub(super) fn stats(read: &dyn Fn(&Path) -> Option<String>, files: &StatFiles) -> CgroupStats {
    let text = |p: &Option<PathBuf>| p.as_deref().and_then(read).unwrap_or_default();
    let events = text(&files.oom);
    let oom = |k: &str| keyed_u64(&events, k).unwrap_or(0) > 0;
    let pids_events = text(&files.pids_events);
    CgroupStats {
        peak_memory_bytes: text(&files.peak).trim().parse().ok(),
        oom_killed: oom("oom_kill") || oom("oom_group_kill"),
        cpu_usage_ns: keyed_u64(&text(&files.cpu), "usage_usec").map(|us| us.saturating_mul(1000)),
        pids_peak: text(&files.pids_peak).trim().parse().ok(),
        pids_limit_hit: keyed_u64(&pids_events, "max").unwrap_or(0) > 0,
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::fake::{FakeKernel, Guard, TestDir};
    use super::super::host::process_alive;
    use super::super::{sandbox_group_name, CgroupHost};
    use super::*;

    /// A fake pure-v2 host offering `controllers`.
    fn host(controllers: &[&str], cgroup_kill: bool, swap: bool) -> (TestDir, CgroupHost) {
        let dir = TestDir::new("v2");
        let (kernel, mountinfo, own) = FakeKernel::v2(&dir.0, controllers, cgroup_kill, swap);
        let mut host = CgroupHost::from_mountinfo_at(&dir.0, &mountinfo, &own).unwrap();
        host.backend = Backend::Fake(Arc::new(kernel));
        (dir, host)
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_string()
    }

    const ALL: &[&str] = &["cpuset", "cpu", "io", "memory", "pids"];

    #[test]
    fn create_writes_limits_and_remove_cleans_up() {
        let (dir, host) = host(ALL, true, true);
        let mount = dir.0.join("sys/fs/cgroup");
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(32),
            cpu_millicores: Some(1500),
        };
        let name = sandbox_group_name();
        let cg = host.create(&name, &limits).unwrap();
        let group = mount.join("corral").join(&name);
        assert_eq!(cg.paths(), vec![group.as_path()]);
        assert_eq!(
            read(&mount.join("cgroup.subtree_control")),
            "memory pids cpu"
        );
        assert_eq!(
            read(&mount.join("corral/cgroup.subtree_control")),
            "memory pids cpu"
        );
        assert_eq!(read(&group.join("cgroup.controllers")), "memory pids cpu");
        assert_eq!(read(&group.join("memory.max")), "67108864");
        assert_eq!(read(&group.join("memory.swap.max")), "0");
        assert_eq!(read(&group.join("memory.oom.group")), "1");
        assert_eq!(read(&group.join("pids.max")), "32");
        assert_eq!(read(&group.join("cpu.max")), "150000 100000");
        let enforced = cg.enforced();
        assert_eq!(
            enforced,
            CgroupEnforced {
                version: "v2",
                controllers: vec!["memory", "pids", "cpu"],
                memory_bytes: Some(64 << 20),
                memory_includes_swap: true,
                pids: Some(32),
                cpu_millicores: Some(1500),
                notes: vec![],
            }
        );
        let json = serde_json::to_value(&enforced).unwrap();
        assert_eq!(json["version"], "v2");
        assert!(json.get("notes").is_none());
        cg.remove().unwrap();
        assert!(!group.exists());
        assert!(mount.join("corral").is_dir(), "the base stays");
        // A second group reuses the base and the enabled controllers.
        let again = host.create(&sandbox_group_name(), &limits).unwrap();
        again.remove().unwrap();
    }

    #[test]
    fn without_a_cpu_limit_cpu_is_not_enabled() {
        let (dir, host) = host(ALL, true, true);
        let mount = dir.0.join("sys/fs/cgroup");
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        assert_eq!(
            read(&mount.join("corral/cgroup.subtree_control")),
            "memory pids"
        );
        assert!(!cg.paths()[0].join("cpu.max").exists());
        assert_eq!(read(&cg.paths()[0].join("memory.max")), "max");
        assert_eq!(read(&cg.paths()[0].join("memory.oom.group")), "1");
        assert!(cg.enforced().controllers.is_empty());
        // Usage figures without limits: memory, pids and cpu.stat.
        let stats = cg.stats();
        assert_eq!(stats.peak_memory_bytes, Some(0));
        assert_eq!(stats.cpu_usage_ns, Some(0));
        assert_eq!(stats.pids_peak, Some(0));
    }

    #[test]
    fn process_is_added_killed_with_cgroup_kill_and_stats_are_read() {
        let (_dir, host) = host(ALL, true, true);
        let cg = host
            .create(
                &sandbox_group_name(),
                &CgroupLimits {
                    memory_bytes: Some(1 << 30),
                    pids: Some(100),
                    cpu_millicores: None,
                },
            )
            .unwrap();
        // v2 moves a thread only within its domain: the parent adds the
        // helper; there is no file the helper could join through itself.
        assert!(cg.self_join_files().is_empty());
        let mut child = Guard::sleep();
        cg.add_process(child.pid()).unwrap();
        assert_eq!(cg.pids(), vec![child.pid()]);
        let start = Instant::now();
        cg.kill_all();
        assert!(start.elapsed() < Duration::from_millis(900));
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        let group = cg.paths()[0].to_path_buf();
        assert_eq!(read(&group.join("cgroup.kill")), "1");
        assert!(cg.pids().is_empty());
        // What the kernel would report after a memory bomb and a fork bomb.
        std::fs::write(group.join("memory.peak"), "1073741824\n").unwrap();
        std::fs::write(
            group.join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        std::fs::write(
            group.join("cpu.stat"),
            "usage_usec 250\nuser_usec 200\nsystem_usec 50\n",
        )
        .unwrap();
        std::fs::write(group.join("pids.peak"), "100\n").unwrap();
        std::fs::write(group.join("pids.events"), "max 7\n").unwrap();
        assert_eq!(
            cg.stats(),
            CgroupStats {
                peak_memory_bytes: Some(1 << 30),
                oom_killed: true,
                cpu_usage_ns: Some(250_000),
                pids_peak: Some(100),
                pids_limit_hit: true,
            }
        );
        assert!(cg.add_process(0).is_err());
        cg.remove().unwrap();
        assert!(!group.exists());
    }

    #[test]
    fn without_cgroup_kill_every_pid_is_signalled() {
        let (_dir, host) = host(ALL, false, true);
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let mut a = Guard::sleep();
        let mut b = Guard::sleep();
        cg.add_process(a.pid()).unwrap();
        cg.add_process(b.pid()).unwrap();
        assert_eq!(cg.pids().len(), 2);
        assert!(!cg.paths()[0].join("cgroup.kill").exists());
        cg.kill_all();
        assert_eq!(a.wait_signal(5), Some(libc::SIGKILL));
        assert_eq!(b.wait_signal(5), Some(libc::SIGKILL));
        cg.remove().unwrap();
    }

    #[test]
    fn remove_kills_leftovers_first() {
        let (_dir, host) = host(ALL, true, true);
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let group = cg.paths()[0].to_path_buf();
        let mut child = Guard::sleep();
        cg.add_process(child.pid()).unwrap();
        cg.remove().unwrap();
        assert_eq!(child.wait_signal(5), Some(libc::SIGKILL));
        assert!(!group.exists());
    }

    #[test]
    fn remove_kills_only_when_processes_are_left() {
        let (dir, host) = host(ALL, true, true);
        // The group's cgroup.kill, kept past its rmdir through a hard link,
        // shows whether remove wrote it.
        let witness = |cg: &SandboxCgroup, n: &str| {
            let w = dir.0.join(n);
            std::fs::hard_link(cg.paths()[0].join("cgroup.kill"), &w).unwrap();
            w
        };
        // Its process is gone (the usual case): no kill.
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let group = cg.paths()[0].to_path_buf();
        let mut gone = Guard::sleep();
        cg.add_process(gone.pid()).unwrap();
        gone.0.kill().unwrap();
        gone.0.wait().unwrap();
        assert!(cg.pids().is_empty());
        let w = witness(&cg, "kill-empty");
        cg.remove().unwrap();
        assert!(!group.exists());
        assert_eq!(read(&w), "");
        // A process is left: killed through cgroup.kill before the rmdir.
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let group = cg.paths()[0].to_path_buf();
        let mut left = Guard::sleep();
        cg.add_process(left.pid()).unwrap();
        let w = witness(&cg, "kill-busy");
        cg.remove().unwrap();
        assert_eq!(left.wait_signal(5), Some(libc::SIGKILL));
        assert!(!group.exists());
        assert_eq!(read(&w), "1");
    }

    #[test]
    fn drop_removes_the_group() {
        let (_dir, host) = host(ALL, true, true);
        let cg = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        let group = cg.paths()[0].to_path_buf();
        assert!(group.is_dir());
        drop(cg);
        assert!(!group.exists());
    }

    #[test]
    fn missing_swap_accounting_is_noted() {
        let (_dir, host) = host(ALL, true, false);
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
        assert_eq!(e.notes.len(), 1);
        assert!(
            e.notes[0].contains("memory.swap.max is missing"),
            "{}",
            e.notes[0]
        );
        assert!(serde_json::to_value(&e).unwrap()["notes"].is_array());
    }

    #[test]
    fn unavailable_controller_fails_before_creating_anything() {
        let (dir, host) = host(&["cpu", "io"], true, true);
        let err = host
            .create(
                "1-1",
                &CgroupLimits {
                    pids: Some(10),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pids limit needs the pids controller: cgroup v2 at"),
            "{err}"
        );
        assert!(!dir.0.join("sys/fs/cgroup/corral").exists());
        let err = host
            .create("../escape", &CgroupLimits::default())
            .unwrap_err();
        assert!(matches!(err, CgroupError::InvalidName { .. }), "{err}");
        assert!(!dir.0.join("sys/fs/escape").exists());
    }

    #[test]
    fn existing_group_is_an_error_and_is_left_alone() {
        let (_dir, host) = host(ALL, true, true);
        let name = sandbox_group_name();
        let first = host.create(&name, &CgroupLimits::default()).unwrap();
        let err = host.create(&name, &CgroupLimits::default()).unwrap_err();
        assert!(
            matches!(&err, CgroupError::Create { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
        assert!(first.paths()[0].is_dir());
        first.remove().unwrap();
    }

    #[test]
    fn internal_processes_are_reported_as_such() {
        let (dir, host) = host(ALL, true, true);
        let base = dir.0.join("sys/fs/cgroup/corral");
        host.backend.mkdir(&base).unwrap();
        let child = Guard::sleep();
        host.backend
            .write(&base.join("cgroup.procs"), &child.pid().to_string())
            .unwrap();
        let err = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap_err();
        assert!(
            matches!(err, CgroupError::InternalProcesses { .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("no-internal-processes rule"),
            "{err}"
        );
        drop(child);
    }

    #[test]
    fn sweep_removes_only_groups_of_dead_corrals() {
        let (dir, host) = host(ALL, true, true);
        let base = dir.0.join("sys/fs/cgroup/corral");
        // A pid that certainly ended.
        let mut done = Command::new("true").spawn().unwrap();
        let dead = i32::try_from(done.id()).expect("a pid fits in pid_t");
        done.wait().unwrap();
        assert!(!process_alive(dead));
        // The group of a killed corral, with a process still inside.
        let mut stale = host
            .create(&format!("{dead}-1"), &CgroupLimits::default())
            .unwrap();
        let mut orphan = Guard::sleep();
        stale.add_process(orphan.pid()).unwrap();
        stale.done = true; // as if corral died without cleaning up
        drop(stale);
        // A live corral's group (ours) and a directory corral did not make.
        let mut ours = host
            .create(&sandbox_group_name(), &CgroupLimits::default())
            .unwrap();
        ours.done = true;
        let ours_path = ours.paths()[0].to_path_buf();
        drop(ours);
        host.backend.mkdir(&base.join("foreign")).unwrap();

        assert_eq!(host.sweep_stale(), 1);
        assert_eq!(orphan.wait_signal(5), Some(libc::SIGKILL));
        assert!(!base.join(format!("{dead}-1")).exists());
        assert!(ours_path.is_dir());
        assert!(base.join("foreign").is_dir());
        assert_eq!(host.sweep_stale(), 0);
    }
}
