use super::fake::{FakeKernel, TestDir};
use super::host::*;
use super::*;

/// This host's real /proc/self/mountinfo (cgroup v1 hybrid).
const HYBRID: &str = "\
24 1 0:22 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
23 24 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const HYBRID_SELF: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/fa1f37a11c032bceb42c9d7dc4c143a1
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

fn fake_root_with_unified(controllers: &str) -> TestDir {
    let dir = TestDir::new("mi");
    let unified = dir.0.join("sys/fs/cgroup/unified");
    std::fs::create_dir_all(&unified).unwrap();
    std::fs::write(unified.join("cgroup.controllers"), controllers).unwrap();
    dir
}

#[test]
fn hybrid_host_like_this_one_uses_v1() {
    // The unified mount offers no controller corral uses (here: hugetlb).
    let root = fake_root_with_unified("hugetlb\n");
    let host = CgroupHost::from_mountinfo_at(&root.0, HYBRID, HYBRID_SELF).unwrap();
    let Version::V1 { mounts } = host.version() else {
        panic!("expected v1, got {:?}", host.version());
    };
    let base = root.0.join("sys/fs/cgroup");
    assert_eq!(mounts.len(), 5);
    for c in Controller::ALL {
        assert_eq!(mounts[&c], base.join(c.name()), "{c:?}");
    }
    assert_eq!(host.version().label(), "v1");
    assert_eq!(
        host.own_cgroup(Controller::Memory),
        Some("/process_api/fa1f37a11c032bceb42c9d7dc4c143a1")
    );
    assert_eq!(host.own_cgroup(Controller::Pids), Some("/"));
}

#[test]
fn pure_v2_host() {
    let root = TestDir::new("mi");
    let (_k, mountinfo, own) = FakeKernel::v2(
        &root.0,
        &["cpuset", "cpu", "io", "memory", "pids"],
        true,
        true,
    );
    let host = CgroupHost::from_mountinfo_at(&root.0, &mountinfo, &own).unwrap();
    assert_eq!(
        host.version(),
        &Version::V2 {
            mount: root.0.join("sys/fs/cgroup"),
            controllers: ["cpuset", "cpu", "io", "memory", "pids"]
                .map(String::from)
                .to_vec(),
        }
    );
    assert_eq!(
        host.own_cgroup(Controller::Memory),
        Some("/user.slice/user-1000.slice/session-1.scope")
    );
}

#[test]
fn v1_only_host_with_comounted_cpu_cpuacct() {
    let mountinfo = "\
25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
28 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/freezer ro,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup ro,freezer
";
    let host = CgroupHost::from_mountinfo(mountinfo, "4:memory:/\n").unwrap();
    let Version::V1 { mounts } = host.version() else {
        panic!("expected v1");
    };
    assert_eq!(
        mounts[&Controller::Cpu],
        Path::new("/sys/fs/cgroup/cpu,cpuacct")
    );
    assert_eq!(
        mounts[&Controller::Cpuacct],
        Path::new("/sys/fs/cgroup/cpu,cpuacct")
    );
    assert_eq!(
        mounts[&Controller::Memory],
        Path::new("/sys/fs/cgroup/memory")
    );
    assert_eq!(mounts[&Controller::Pids], Path::new("/sys/fs/cgroup/pids"));
    assert!(host.read_only.contains(Path::new("/sys/fs/cgroup/freezer")));
    assert_eq!(
        v1::hierarchies(mounts).len(),
        4,
        "cpu and cpuacct share one directory"
    );
}

#[test]
fn systemd_hybrid_with_controllers_on_unified_uses_v2() {
    let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    let root = fake_root_with_unified("cpu memory pids\n");
    let host = CgroupHost::from_mountinfo_at(&root.0, mountinfo, "0::/\n").unwrap();
    assert!(
        matches!(host.version(), Version::V2 { mount, .. } if mount.ends_with("sys/fs/cgroup/unified"))
    );
}

#[test]
fn over_mounted_and_escaped_mount_points() {
    // The v1 memory hierarchy at /sys/fs/cgroup/memory is hidden by a
    // later tmpfs on /sys/fs/cgroup; the pids one is mounted after it.
    // A root mount listed last does not hide what is mounted on it.
    let mountinfo = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
50 23 0:40 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw
51 50 0:36 / /sys/fs/cgroup/my\\040pids rw,relatime - cgroup cgroup rw,pids
1 0 0:1 / / rw - rootfs rootfs rw
";
    let host = CgroupHost::from_mountinfo(mountinfo, "").unwrap();
    let Version::V1 { mounts } = host.version() else {
        panic!("expected v1");
    };
    assert_eq!(mounts.len(), 1);
    assert_eq!(
        mounts[&Controller::Pids],
        Path::new("/sys/fs/cgroup/my pids")
    );
    assert_eq!(unescape_mount_path("a\\134b\\011c\\"), "a\\b\tc\\");
}

#[test]
fn mountinfo_fields_split_and_unescape_as_the_std_ways_do() {
    for text in [
        "",
        " ",
        "a",
        "a b",
        " a",
        "a ",
        "a  b",
        "24 1 0:22 / /",
        "é ü ",
        "rw,ro,,x,",
    ] {
        for sep in [b' ', b','] {
            let ours: Vec<&str> = split_at_byte(text, sep).collect();
            let std: Vec<&str> = text.split(char::from(sep)).collect();
            assert_eq!(ours, std, "{text:?} at {:?}", char::from(sep));
        }
    }
    for path in ["/sys/fs/cgroup", "/a\\040b", "/x\\134y\\", "/plain"] {
        assert_eq!(mount_path(path), unescape_mount_path(path), "{path}");
    }
    assert!(matches!(
        mount_path("/sys/fs/cgroup"),
        std::borrow::Cow::Borrowed(_)
    ));
}

#[test]
fn no_cgroups_and_malformed_input_are_errors() {
    let err =
        CgroupHost::from_mountinfo("24 1 0:22 / / rw - overlay overlay rw\n", "").unwrap_err();
    assert!(matches!(err, CgroupError::NotMounted), "{err}");
    let err = CgroupHost::from_mountinfo("24 1 0:22 / / rw overlay\n", "").unwrap_err();
    assert!(
        err.to_string()
            .contains("malformed /proc/self/mountinfo line 1"),
        "{err}"
    );
    let err = CgroupHost::from_mountinfo(HYBRID, "garbage\n").unwrap_err();
    assert!(
        err.to_string().contains("/proc/self/cgroup line 1"),
        "{err}"
    );
    // A cgroup2 mount whose root cannot be read names the file.
    let root = TestDir::new("mi");
    let err = CgroupHost::from_mountinfo_at(
        &root.0,
        "27 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        "0::/\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("cgroup.controllers"), "{err}");
}

#[test]
fn detect_works_on_this_host() {
    match CgroupHost::detect() {
        Ok(host) => eprintln!("cgroup host: {:?}", host.version()),
        Err(CgroupError::NotMounted) => eprintln!("no cgroups mounted here"),
        Err(e) => panic!("detect failed: {e}"),
    }
}

#[test]
fn names_are_validated() {
    for good in ["1234-1", "abc_DEF-9", &"a".repeat(128)] {
        assert!(validate_name(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        ".",
        "..",
        "../x",
        "a/b",
        "a b",
        "a\0b",
        "é",
        &"a".repeat(129),
    ] {
        let err = validate_name(bad).unwrap_err();
        assert!(err.to_string().starts_with("invalid cgroup name"), "{err}");
    }
    let n = sandbox_group_name();
    let pid = i32::try_from(std::process::id()).expect("a pid fits in pid_t");
    assert_eq!(owner_pid(&n), Some(pid));
    assert!(validate_name(&n).is_ok());
    assert_eq!(owner_pid("12-x"), None);
    assert_eq!(owner_pid("foreign"), None);
    assert_eq!(owner_pid("0-1"), None);
}

#[test]
fn limit_values_are_validated() {
    let root = TestDir::new("lim");
    let (_k, mi, own) = FakeKernel::v2(&root.0, &["cpu", "memory", "pids"], true, true);
    let host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
    for (limits, text) in [
        (
            CgroupLimits {
                memory_bytes: Some(0),
                ..Default::default()
            },
            "memory limit 0",
        ),
        (
            CgroupLimits {
                pids: Some(0),
                ..Default::default()
            },
            "pids limit 0",
        ),
        (
            CgroupLimits {
                cpu_millicores: Some(5),
                ..Default::default()
            },
            "cpu limit 5 is below",
        ),
        (
            CgroupLimits {
                cpu_millicores: Some(u64::MAX),
                ..Default::default()
            },
            "too large",
        ),
    ] {
        let err = host.can_enforce(&limits).unwrap_err();
        assert!(err.to_string().contains(text), "{err}");
    }
    assert_eq!(cpu_quota_us(1500), Some(150_000));
}

#[test]
fn can_enforce_names_the_missing_controller_and_why() {
    let root = TestDir::new("enf");
    let (_k, mi, own) = FakeKernel::v2(&root.0, &["cpu", "io"], true, true);
    let mut host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
    let memory = CgroupLimits {
        memory_bytes: Some(1 << 20),
        ..Default::default()
    };
    let cpu = CgroupLimits {
        cpu_millicores: Some(500),
        ..Default::default()
    };
    let mount = root.0.join("sys/fs/cgroup");
    // As the owner of the fake hierarchy: only the controller is missing.
    let err = host.can_enforce(&memory).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "memory limit needs the memory controller: cgroup v2 at {} has controllers [cpu io]",
            mount.display()
        )
    );
    assert!(host.can_enforce(&cpu).is_ok());
    // As some other unprivileged user: no delegation either.
    let owner = std::fs::metadata(&mount).unwrap().uid();
    host.euid = if owner == 4242 { 4243 } else { 4242 };
    host.egid = 4242;
    host.groups = vec![4242];
    let err = host.can_enforce(&memory).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "memory limit needs the memory controller: cgroup v2 at {} has controllers [cpu io] and corral cannot write {}/corral (not root, no delegation; corral runs in cgroup /user.slice/user-1000.slice/session-1.scope)",
            mount.display(),
            mount.display()
        )
    );
    assert!(host
        .can_enforce(&cpu)
        .unwrap_err()
        .to_string()
        .starts_with("cpu limit needs the cpu controller"));
    // Unlimited needs nothing.
    assert!(host.can_enforce(&CgroupLimits::default()).is_ok());
}

#[test]
fn v1_missing_hierarchy_is_named() {
    let root = TestDir::new("enf1");
    let (_k, mi, own) = FakeKernel::v1(&root.0, &[("memory", &[Controller::Memory])], true);
    let host = CgroupHost::from_mountinfo_at(&root.0, &mi, &own).unwrap();
    let err = host
        .can_enforce(&CgroupLimits {
            pids: Some(10),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pids limit needs the pids controller: cgroup v1 has no pids hierarchy mounted (mounted: [memory])"
    );
}
