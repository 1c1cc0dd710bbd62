//! The hardening order of the helper, init and the program's process,
//! asserted on the recording fake: no root, no namespaces, no forks.

use std::fs::File;
use std::os::fd::AsRawFd;

use corral_policy::{NetworkMode, SandboxPath, SeccompProfile};
use corral_sys::mount as m;
use corral_sys::ns;

use super::fake::{Fake, FakeFd, Step};
use super::Enforcement;
use crate::init::{self, LastSteps, ProgramArgs};
use crate::plan::{
    GeneratedFile, MountOp, ReducedPlan, Rlimit, RlimitKind, SandboxIdentity, SandboxPlan,
    SecurityPlan,
};
use crate::protocol::{FailureKind, HelperMessage};
use crate::{cloned_init_namespaces, cloned_init_steps, helper_steps, reduced, rootfs};
use crate::{CompiledFilters, Insn, LandlockPlan};
use crate::{Control, Failure, Next};

const PARENT: i32 = 4242;
const STRICT: u64 = m::RESOLVE_BENEATH | m::RESOLVE_NO_SYMLINKS | m::RESOLVE_NO_MAGICLINKS;
const EMPTY_PATH: u32 = libc::AT_EMPTY_PATH as u32;
/// What the finished root is sealed with: read-only, and nothing on it
/// (its /dev included) is a set-id program, a device or runnable.
const ROOT_SEAL: u64 =
    m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_NOEXEC;

fn path(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

/// A bind of the host's system trees (symlinks in them are followed
/// inside the host root).
fn bind(source: &str, dest: &str, writable: bool) -> MountOp {
    MountOp::Bind {
        source: source.into(),
        dest: path(dest),
        writable,
        idmap_from: None,
        no_symlinks: false,
    }
}

/// A bind the caller asked for (`--rw`, `--ro`, `--workdir`): its source
/// is resolved without following any symlink.
fn user_bind(source: &str, dest: &str, writable: bool) -> MountOp {
    MountOp::Bind {
        source: source.into(),
        dest: path(dest),
        writable,
        idmap_from: None,
        no_symlinks: true,
    }
}

/// A small plan with every kind of mount step, a denied directory, a
/// denied file, a denied path that does not exist, two rlimits and two
/// seccomp programs of different lengths.
fn plan() -> SandboxPlan {
    let insn = Insn {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0x7fff_0000,
    };
    SandboxPlan {
        parent_pid: PARENT,
        identity: SandboxIdentity {
            uid: 1000,
            gid: 1001,
            drop_from_root: false,
        },
        hostname: "corral".into(),
        tmp_size: 1 << 20,
        dev_pts: true,
        mounts: vec![
            bind("/usr", "/usr", false),
            MountOp::Symlink {
                target: "usr/bin".into(),
                dest: path("/bin"),
            },
            bind("/etc/ssl", "/etc/ssl", false),
            user_bind("/home/me/data", "/data", true),
            MountOp::Tmpfs {
                dest: path("/workspace"),
                size: 8 << 20,
                mode: 0o755,
            },
        ],
        deny: vec![
            path("/usr/share/secrets"),
            path("/etc/ssl/private.key"),
            path("/nowhere"),
        ],
        files: vec![GeneratedFile {
            path: path("/etc/passwd"),
            contents: "me:x:1000:1001::/workspace:/bin/sh\n".into(),
        }],
        cwd: path("/workspace"),
        exec_path: "/bin/true".into(),
        argv: vec!["true".into()],
        env: vec!["PATH=/usr/bin:/bin".into()],
        rlimits: vec![
            Rlimit {
                kind: RlimitKind::Core,
                soft: 0,
                hard: 0,
            },
            Rlimit {
                kind: RlimitKind::OpenFiles,
                soft: 1024,
                hard: 1024,
            },
        ],
        security: SecurityPlan {
            seccomp_profile: SeccompProfile::Default,
            filters: CompiledFilters {
                programs: vec![vec![insn; 3], vec![insn; 2]],
            },
            init_filters: CompiledFilters {
                programs: vec![vec![insn; 1]],
            },
            landlock: LandlockPlan {
                required: true,
                ..LandlockPlan::default()
            },
        },
        reduced: None,
        network: NetworkMode::None,
        hold: false,
        cgroup_join: Vec::new(),
    }
}

#[test]
fn a_held_sandbox_runs_only_a_plan_that_differs_in_its_program() {
    let template = SandboxPlan {
        hold: true,
        cgroup_join: vec!["/sys/fs/cgroup/pids/corral/1-1/tasks".into()],
        ..plan()
    };
    let mut run = plan();
    run.set_program(crate::ProgramPlan {
        cwd: path("/workspace/sub"),
        exec_path: "/usr/bin/python3".into(),
        argv: vec!["python3".into(), "-c".into(), "print(1)".into()],
        env: vec!["A=1".into()],
        rlimits: Vec::new(),
    });
    assert!(template.same_sandbox(&run));
    assert!(run.same_sandbox(&template));
    assert_eq!(run.program().argv[2], "print(1)");
    // Anything of the sandbox itself differs: not the same sandbox.
    let changes: [fn(&mut SandboxPlan); 7] = [
        |p| p.hostname = "other".into(),
        |p| p.mounts.pop().map(|_| ()).unwrap_or(()),
        |p| p.deny.clear(),
        |p| p.identity.uid += 1,
        |p| p.security.landlock.required = false,
        |p| p.network = NetworkMode::Allow,
        |p| p.tmp_size += 1,
    ];
    for (i, change) in changes.iter().enumerate() {
        let mut other = run.clone();
        change(&mut other);
        assert!(!template.same_sandbox(&other), "change {i} went unnoticed");
    }
    // The program part round-trips, and puts back exactly what it took.
    let mut copy = template.clone();
    copy.set_program(run.program());
    assert_eq!(copy.program(), run.program());
    assert!(copy.same_sandbox(&template));
}

/// A fake that knows the plan's denied file is a file and its missing
/// path is missing.
fn fake() -> Fake {
    let mut k = Fake::new(PARENT);
    k.file("/newroot/etc/ssl/private.key");
    k.fail(
        libc::ENOENT,
        |s| matches!(s, Step::Open { path, .. } if path == "/newroot/nowhere"),
    );
    k
}

/// A control socket whose messages the test can read after the sender is
/// dropped.
fn control() -> (Control, File) {
    let (a, b) = corral_sys::fd::seqpacket_pair().unwrap();
    (Control(File::from(a)), File::from(b))
}

/// Every message sent on `peer`, with how many descriptors each carried
/// (the sending side must be closed).
fn messages(peer: File) -> Vec<(HelperMessage, usize)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let (n, fds) = corral_sys::fd::recv_with_fds(peer.as_raw_fd(), &mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.push((serde_json::from_slice(&buf[..n]).unwrap(), fds.len()));
    }
}

fn build(k: &mut Fake, plan: &SandboxPlan) -> Result<(), crate::StepError> {
    rootfs::build(k, plan, Vec::new())
}

fn pos(steps: &[Step], what: impl Fn(&Step) -> bool) -> usize {
    steps
        .iter()
        .position(what)
        .unwrap_or_else(|| panic!("no such step in {steps:#?}"))
}

fn rpos(steps: &[Step], what: impl Fn(&Step) -> bool) -> usize {
    steps
        .iter()
        .rposition(what)
        .unwrap_or_else(|| panic!("no such step in {steps:#?}"))
}

/// Whether the step puts something into the sandbox's new root.
fn mounts_into_newroot(s: &Step) -> bool {
    match s {
        Step::Mount { target, .. } => target.starts_with("/newroot"),
        Step::MoveMount { to, .. } => to.starts_with("/newroot"),
        _ => false,
    }
}

/// The index of the move that attaches something at `to`, with the tree's
/// `OpenTree` and `SetAttr` indices and those steps.
fn attach_of(steps: &[Step], to: &str) -> (usize, usize, usize) {
    let moved = pos(
        steps,
        |s| matches!(s, Step::MoveMount { to: t, .. } if t == to),
    );
    let Step::MoveMount { from, .. } = &steps[moved] else {
        unreachable!()
    };
    let opened = pos(
        steps,
        |s| matches!(s, Step::OpenTree { tree, .. } if tree == from),
    );
    let set = pos(
        steps,
        |s| matches!(s, Step::SetAttr { path, .. } if path == from),
    );
    (opened, set, moved)
}

// The root filesystem.

#[test]
fn every_bind_gets_its_attributes_before_it_is_attached() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let s = &k.steps;
    let nosuid_nodev = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
    let binds = [
        ("/usr", "/usr", nosuid_nodev | m::MOUNT_ATTR_RDONLY),
        ("/etc/ssl", "/etc/ssl", nosuid_nodev | m::MOUNT_ATTR_RDONLY),
        ("/home/me/data", "/data", nosuid_nodev),
        (
            "/dev/null",
            "/dev/null",
            m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NOEXEC,
        ),
        (
            "/dev/urandom",
            "/dev/urandom",
            m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NOEXEC,
        ),
    ];
    for (source, dest, attrs) in binds {
        let (opened, set, moved) = attach_of(s, &format!("/newroot{dest}"));
        assert_eq!(
            s[opened],
            Step::OpenTree {
                path: format!("/oldroot{source}"),
                flags: m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC | m::AT_RECURSIVE | EMPTY_PATH,
                tree: format!("tree{}:/oldroot{source}", tree_number(&s[opened])),
            },
            "{source} is cloned with its submounts"
        );
        let Step::SetAttr {
            flags,
            set: bits,
            clear,
            ..
        } = &s[set]
        else {
            unreachable!()
        };
        assert_eq!(
            (*flags, *bits, *clear),
            (EMPTY_PATH | m::AT_RECURSIVE, attrs, 0),
            "attributes of {source}, on every mount of the clone"
        );
        assert!(opened < set && set < moved, "{source}: clone, seal, attach");
    }
}

fn tree_number(s: &Step) -> usize {
    let Step::OpenTree { tree, .. } = s else {
        unreachable!()
    };
    tree["tree".len()..tree.find(':').unwrap()].parse().unwrap()
}

#[test]
fn bind_sources_resolve_in_the_host_root_and_targets_never_follow_symlinks() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let deny_opens: Vec<String> = plan
        .deny
        .iter()
        .map(|d| format!("/newroot{}", d.as_str()))
        .collect();
    let mut targets = 0;
    let mut user_sources = 0;
    for s in &k.steps {
        let Step::Open { path, resolve, .. } = s else {
            continue;
        };
        if path == "/oldroot/home/me/data" || path.starts_with("/oldroot/dev/") {
            // What the caller (or corral, for /dev) named: no symlink at
            // all, so one planted after the plan was checked is refused.
            assert_eq!(
                *resolve,
                m::RESOLVE_IN_ROOT | m::RESOLVE_NO_MAGICLINKS | m::RESOLVE_NO_SYMLINKS,
                "{path}"
            );
            user_sources += 1;
        } else if path.starts_with("/oldroot/") {
            assert_eq!(
                *resolve,
                m::RESOLVE_IN_ROOT | m::RESOLVE_NO_MAGICLINKS,
                "{path}"
            );
        } else if deny_opens.contains(path) {
            assert_eq!(
                *resolve,
                m::RESOLVE_IN_ROOT | m::RESOLVE_NO_SYMLINKS,
                "{path}"
            );
        } else if path.starts_with("/newroot/") || (path == "/newroot" && *resolve != 0) {
            assert_eq!(*resolve, STRICT, "{path}");
            targets += 1;
        }
    }
    assert!(targets > 10, "mount targets were opened: {targets}");
    assert_eq!(user_sources, 6, "/home/me/data and the five /dev nodes");
}

#[test]
fn under_restrict_exec_every_place_the_program_writes_is_noexec() {
    // The attributes of the writable bind and the flags of each tmpfs the
    // program sees, without and with an execute allowlist.
    let writable_mounts = |plan: &SandboxPlan| {
        let mut k = fake();
        build(&mut k, plan).unwrap();
        let (_, set, _) = attach_of(&k.steps, "/newroot/data");
        let Step::SetAttr { set: bind, .. } = k.steps[set] else {
            unreachable!()
        };
        let readonly = attach_of(&k.steps, "/newroot/usr").1;
        let Step::SetAttr { set: usr, .. } = k.steps[readonly] else {
            unreachable!()
        };
        let tmpfs: Vec<(String, u64)> = tmpfs_mounts(&k.steps)
            .into_iter()
            .filter(|(target, ..)| target.starts_with("/newroot/"))
            .map(|(target, flags, _)| (target, flags))
            .collect();
        (bind, usr, tmpfs)
    };
    let nosuid_nodev = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
    let tmpfs = |flags: u64| {
        ["/newroot/workspace", "/newroot/tmp", "/newroot/dev/shm"].map(|t| (t.to_string(), flags))
    };
    let mut plan = plan();
    let (bind, usr, mounts) = writable_mounts(&plan);
    assert_eq!(bind, nosuid_nodev, "a writable bind may hold programs");
    assert_eq!(usr, nosuid_nodev | m::MOUNT_ATTR_RDONLY);
    assert_eq!(mounts, tmpfs(libc::MS_NOSUID | libc::MS_NODEV));
    plan.security.landlock.execute_only = Some(vec!["/usr/bin/python3".into()]);
    let (bind, usr, mounts) = writable_mounts(&plan);
    assert_eq!(
        bind,
        nosuid_nodev | m::MOUNT_ATTR_NOEXEC,
        "nothing written runs"
    );
    assert_eq!(
        usr,
        nosuid_nodev | m::MOUNT_ATTR_RDONLY,
        "read-only binds as before"
    );
    assert_eq!(
        mounts,
        tmpfs(libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)
    );
}

/// The tmpfs mounts among `steps`: (target, flags, data).
fn tmpfs_mounts(steps: &[Step]) -> Vec<(String, u64, String)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Mount {
                fstype: Some(t),
                target,
                flags,
                data: Some(data),
                ..
            } if t == "tmpfs" => Some((target.clone(), *flags, data.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn tmpfs_mounts_have_their_sizes_modes_and_flags() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let tmpfs = tmpfs_mounts(&k.steps);
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    // The scratch tmpfs holds the sandbox's root and /dev as directories.
    let expected = [
        ("/tmp", nosuid_nodev, "mode=0755,size=1m"),
        ("/newroot/workspace", nosuid_nodev, "mode=755,size=8388608"),
        ("/newroot/tmp", nosuid_nodev, "mode=1777,size=1048576"),
        ("/newroot/dev/shm", nosuid_nodev, "mode=1777,size=1048576"),
    ]
    .map(|(t, f, d)| (t.to_string(), f, d.to_string()));
    assert_eq!(tmpfs, expected);
    // The other mounts: nothing propagates to the host, /proc and
    // /dev/pts are nosuid and noexec.
    let others: Vec<&Step> = k
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Mount { fstype, .. } if fstype.as_deref() != Some("tmpfs")))
        .collect();
    assert_eq!(
        others,
        [
            &Step::Mount {
                source: None,
                target: "/".into(),
                fstype: None,
                flags: libc::MS_REC | libc::MS_PRIVATE,
                data: None,
            },
            // The sandbox's root: a directory of the scratch tmpfs, made a
            // mount point for pivot_root by a (non-recursive) bind onto
            // itself.
            &Step::Mount {
                source: Some("/newroot".into()),
                target: "/newroot".into(),
                fstype: None,
                flags: libc::MS_BIND,
                data: None,
            },
            &Step::Mount {
                source: Some("devpts".into()),
                target: "/newroot/dev/pts".into(),
                fstype: Some("devpts".into()),
                flags: libc::MS_NOSUID | libc::MS_NOEXEC,
                data: Some("newinstance,ptmxmode=0666,mode=620".into()),
            },
            &Step::Mount {
                source: Some("proc".into()),
                target: "/newroot/proc".into(),
                fstype: Some("proc".into()),
                flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data: None,
            },
        ]
    );
    assert_eq!(k.steps[0], *others[0], "/ is made private first");
}

#[test]
fn dev_is_a_directory_of_the_root_sealed_with_it_after_everything_in_it() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    // No filesystem of its own: only /dev/shm and (asked for by this
    // plan) /dev/pts are mounted below /newroot/dev.
    let mounted_in_dev: Vec<&str> = k
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Mount { target, .. } if target.starts_with("/newroot/dev") => {
                Some(target.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(mounted_in_dev, ["/newroot/dev/shm", "/newroot/dev/pts"]);
    let sealed = pos(&k.steps, |s| {
        *s == Step::SetAttr {
            path: "/".into(),
            flags: 0,
            set: ROOT_SEAL,
            clear: 0,
        }
    });
    let last_in_dev = rpos(&k.steps, |s| match s {
        Step::Mount { target, .. } => target.starts_with("/newroot/dev"),
        Step::MoveMount { to, .. } => to.starts_with("/newroot/dev"),
        Step::Symlink { path, .. } => path.starts_with("/newroot/dev"),
        _ => false,
    });
    assert!(last_in_dev < sealed);
}

#[test]
fn denied_paths_are_hidden_after_every_other_mount() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let s = &k.steps;
    let sealed =
        m::MOUNT_ATTR_RDONLY | m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV | m::MOUNT_ATTR_NOEXEC;
    let mut hides = Vec::new();
    for (denied, standin) in [
        ("/newroot/usr/share/secrets", "/empty-dir"),
        ("/newroot/etc/ssl/private.key", "/empty-file"),
    ] {
        let (opened, set, moved) = attach_of(s, denied);
        let Step::OpenTree { path, flags, .. } = &s[opened] else {
            unreachable!()
        };
        assert_eq!(
            (path.as_str(), *flags),
            (standin, m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC),
            "{denied}"
        );
        let Step::SetAttr {
            flags, set: bits, ..
        } = &s[set]
        else {
            unreachable!()
        };
        assert_eq!((*flags, *bits), (EMPTY_PATH, sealed), "{denied}");
        assert!(opened < set && set < moved, "{denied}: clone, seal, hide");
        hides.push(moved);
    }
    // A denied path that does not exist is looked up and left alone.
    assert!(s
        .iter()
        .any(|s| matches!(s, Step::Open { path, .. } if path == "/newroot/nowhere")));
    assert!(!s
        .iter()
        .any(|s| matches!(s, Step::MoveMount { to, .. } if to == "/newroot/nowhere")));
    let first_hide = *hides.iter().min().unwrap();
    let last_other = rpos(s, |st| {
        mounts_into_newroot(st)
            && !matches!(st, Step::MoveMount { to, .. } if to.starts_with("/newroot/usr/share/secrets") || to.starts_with("/newroot/etc/ssl/private.key"))
    });
    assert!(
        last_other < first_hide,
        "every mount (step {last_other}) comes before the first hidden path (step {first_hide})"
    );
    let proc = pos(
        s,
        |st| matches!(st, Step::Mount { target, .. } if target == "/newroot/proc"),
    );
    assert!(proc < first_hide, "/proc is mounted before the denials");
}

#[test]
fn pivot_root_comes_after_every_mount_and_the_host_root_is_detached() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let s = &k.steps;
    let detach = pos(s, |st| *st == Step::Chdir("/newroot".into()));
    // One unmount for the scratch root and the host root parked in it.
    assert_eq!(
        s.iter()
            .filter(|st| matches!(st, Step::Umount { .. }))
            .count(),
        1
    );
    assert_eq!(
        &s[detach..],
        [
            Step::Chdir("/newroot".into()),
            Step::PivotRoot {
                new_root: ".".into(),
                put_old: ".".into(),
            },
            Step::Umount {
                target: ".".into(),
                flags: libc::MNT_DETACH,
            },
            Step::Chdir("/".into()),
            Step::SetAttr {
                path: "/".into(),
                flags: 0,
                set: ROOT_SEAL,
                clear: 0,
            },
        ],
        "pivot, drop the scratch root with the host root in it, seal /"
    );
    let last_mount = rpos(s, mounts_into_newroot);
    assert!(last_mount < detach);
    // The first pivot parks the host root in the scratch tmpfs.
    let scratch = pos(
        s,
        |st| matches!(st, Step::Mount { target, .. } if target == "/tmp"),
    );
    let park = pos(s, |st| {
        *st == Step::PivotRoot {
            new_root: ".".into(),
            put_old: "oldroot".into(),
        }
    });
    assert!(
        scratch < park
            && park
                < pos(
                    s,
                    |st| matches!(st, Step::Mount { target, .. } if target == "/newroot")
                )
    );
}

#[test]
fn generated_files_and_symlinks_are_created_in_the_new_root() {
    let plan = plan();
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let created = pos(&k.steps, |s| {
        *s == Step::CreateFile {
            path: "/newroot/etc/passwd".into(),
            mode: 0o644,
        }
    });
    assert_eq!(
        k.steps[created + 1],
        Step::WriteAll {
            path: "/newroot/etc/passwd".into(),
            contents: plan.files[0].contents.as_bytes().to_vec(),
        }
    );
    assert!(k.steps.contains(&Step::Symlink {
        target: "usr/bin".into(),
        path: "/newroot/bin".into(),
    }));
}

/// How often `path` was opened as a mount point or its directory.
fn opens_of(steps: &[Step], path: &str) -> usize {
    steps
        .iter()
        .filter(|s| matches!(s, Step::Open { path: p, .. } if p == path))
        .count()
}

/// The root built from `plan` with two more file binds of the host's
/// `/etc`, `hosts` and `resolv.conf`, and `mounts` where they go.
fn built_with_file_binds(mut plan: SandboxPlan, mounts: Vec<MountOp>) -> Fake {
    plan.mounts = mounts;
    let mut k = fake();
    k.file("/oldroot/etc/hosts");
    k.file("/oldroot/etc/resolv.conf");
    build(&mut k, &plan).unwrap();
    k
}

#[test]
fn mount_points_in_one_directory_share_one_walk_to_it() {
    let mut mounts = plan().mounts;
    mounts.extend([
        bind("/etc/hosts", "/etc/hosts", false),
        bind("/etc/resolv.conf", "/etc/resolv.conf", false),
    ]);
    let k = built_with_file_binds(plan(), mounts);
    // /etc/passwd, then the two file binds: /etc made and opened once,
    // and the /etc/ssl bind in between does not cover it.
    assert_eq!(opens_of(&k.steps, "/newroot/etc"), 1, "{:#?}", k.steps);
    assert_eq!(
        k.steps
            .iter()
            .filter(|s| matches!(s, Step::Mkdir { path, .. } if path == "/newroot/etc"))
            .count(),
        1
    );
    for file in ["hosts", "resolv.conf"] {
        let target = format!("/newroot/etc/{file}");
        assert!(k.steps.contains(&Step::CreateFile {
            path: target.clone(),
            mode: 0o644,
        }));
        assert!(k.steps.contains(&Step::Open {
            path: target.clone(),
            flags: libc::O_PATH,
            resolve: STRICT,
        }));
        attach_of(&k.steps, &target);
    }
    // The five device nodes: /dev made and opened once for all of them.
    assert_eq!(opens_of(&k.steps, "/newroot/dev"), 1, "{:#?}", k.steps);
}

#[test]
fn a_mount_over_the_open_directory_makes_the_next_mount_point_walk_to_it_again() {
    let mut plan = plan();
    plan.files.clear();
    let k = built_with_file_binds(
        plan,
        vec![
            bind("/etc/hosts", "/etc/hosts", false),
            // Covers the /etc the first bind was made in.
            bind("/srv/etc", "/etc", false),
            bind("/etc/resolv.conf", "/etc/resolv.conf", false),
        ],
    );
    let s = &k.steps;
    let (_, _, covered) = attach_of(s, "/newroot/etc");
    let next = pos(
        s,
        |st| matches!(st, Step::Open { path, .. } if path == "/newroot/etc/resolv.conf"),
    );
    let reopened = rpos(
        s,
        |st| matches!(st, Step::Open { path, .. } if path == "/newroot/etc"),
    );
    assert!(
        covered < reopened && reopened < next,
        "/etc is opened again through the mount that covers it: {s:#?}"
    );
    assert_eq!(
        opens_of(s, "/newroot/etc"),
        3,
        "before, as the target, after"
    );
}

#[test]
fn a_protected_entry_over_the_open_directory_makes_the_next_mount_point_walk_to_it_again() {
    // Out of the planner's order (it sorts by depth), so that the cached
    // /etc would otherwise serve a mount point after the protect over it.
    let k = built_with_file_binds(
        plan(),
        vec![
            bind("/etc/hosts", "/etc/hosts", false),
            MountOp::Protect {
                source: "/etc".into(),
                dest: path("/etc"),
                read_only: true,
                dir: true,
            },
            bind("/etc/resolv.conf", "/etc/resolv.conf", false),
        ],
    );
    // The fake itself fails a step taken through a descriptor a mount
    // covered since it was opened; here, what made /etc/resolv.conf.
    let (_, _, protected) = attach_of(&k.steps, "/newroot/etc");
    let made = pos(
        &k.steps,
        |s| matches!(s, Step::CreateFile { path, .. } if path == "/newroot/etc/resolv.conf"),
    );
    assert!(protected < made);
}

#[test]
fn below_a_mount_each_mount_point_is_walked_to_afresh() {
    // Two mount points in one directory of a host tree: its owner can
    // rename the directory while init works, so the walk is not shared.
    let k = built_with_file_binds(
        plan(),
        vec![
            user_bind("/home/me/proj", "/proj", true),
            bind("/etc/hosts", "/proj/conf/hosts", false),
            bind("/etc/resolv.conf", "/proj/conf/resolv.conf", false),
        ],
    );
    assert_eq!(
        opens_of(&k.steps, "/newroot/proj/conf"),
        2,
        "{:#?}",
        k.steps
    );
}

#[test]
fn protected_entries_are_bound_onto_themselves_after_their_bind() {
    let mut plan = plan();
    let protect = |dest: &str, read_only: bool| MountOp::Protect {
        source: format!("/home/me{dest}"),
        dest: path(dest),
        read_only,
        dir: true,
    };
    plan.mounts.extend([
        protect("/data/.git", false),
        protect("/data/.git/hooks", true),
    ]);
    let mut k = fake();
    build(&mut k, &plan).unwrap();
    let s = &k.steps;
    let (_, _, data) = attach_of(s, "/newroot/data");
    let mut attached = Vec::new();
    for (dest, read_only) in [("/data/.git", false), ("/data/.git/hooks", true)] {
        let target = format!("/newroot{dest}");
        // The entry is opened once, never through a symlink, and the clone
        // of that very object is attached onto it.
        let opened = pos(s, |st| {
            *st == Step::Open {
                path: target.clone(),
                flags: libc::O_PATH | libc::O_NOFOLLOW,
                resolve: STRICT,
            }
        });
        let (cloned, set, moved) = attach_of(s, &target);
        let Step::OpenTree { path, flags, .. } = &s[cloned] else {
            unreachable!()
        };
        assert_eq!(
            (path.as_str(), *flags),
            (
                target.as_str(),
                m::OPEN_TREE_CLONE | m::OPEN_TREE_CLOEXEC | m::AT_RECURSIVE | EMPTY_PATH
            )
        );
        let Step::SetAttr { set: bits, .. } = &s[set] else {
            unreachable!()
        };
        let mut want = m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV;
        if read_only {
            want |= m::MOUNT_ATTR_RDONLY;
        }
        assert_eq!(*bits, want, "{dest}");
        assert!(
            data < opened && opened < cloned && cloned < set && set < moved,
            "{dest}"
        );
        attached.push(moved);
    }
    assert!(attached[0] < attached[1], "the pinned parent first");
}

#[test]
fn an_idmapped_tree_is_attached_nosuid_nodev_without_a_second_clone() {
    let plan = plan();
    let mut k = fake();
    let prepared = vec![(3, FakeFd("prepared:/home/me/data".into()))];
    rootfs::build(&mut k, &plan, prepared).unwrap();
    let s = &k.steps;
    assert!(!s
        .iter()
        .any(|st| matches!(st, Step::OpenTree { path, .. } if path == "/oldroot/home/me/data")));
    let set = pos(s, |st| {
        *st == Step::SetAttr {
            path: "prepared:/home/me/data".into(),
            flags: EMPTY_PATH,
            set: m::MOUNT_ATTR_NOSUID | m::MOUNT_ATTR_NODEV,
            clear: 0,
        }
    });
    let moved = pos(s, |st| {
        *st == Step::MoveMount {
            from: "prepared:/home/me/data".into(),
            to: "/newroot/data".into(),
        }
    });
    assert!(set < moved);
}

/// Runs `run` once on a fake to learn its steps, then once per distinct
/// step with that step failing: the record must stop right at it.
fn assert_each_failure_stops_everything_after_it<T>(
    setup: impl Fn() -> Fake,
    run: impl Fn(&mut Fake) -> Result<T, (FailureKind, String)>,
    skip: impl Fn(&Step) -> bool,
    kind_of: impl Fn(&Step) -> FailureKind,
) -> usize {
    let mut k = setup();
    assert!(run(&mut k).is_ok(), "the unfailed run succeeds");
    let all = k.steps;
    let mut tried = 0;
    for (i, step) in all.iter().enumerate() {
        if skip(step) || all[..i].contains(step) {
            continue;
        }
        let mut k = setup();
        k.fail_step(libc::EPERM, step.clone());
        let Err((kind, message)) = run(&mut k) else {
            panic!("failing {step:?} did not fail the run");
        };
        assert_eq!(k.steps, all[..=i], "nothing after the failed {step:?}");
        assert_eq!(kind, kind_of(step), "{step:?}: {message}");
        // Errno and io::Error name it differently; both say this.
        assert!(
            message.contains("Operation not permitted"),
            "{step:?}: {message}"
        );
        tried += 1;
    }
    tried
}

#[test]
fn any_failing_step_stops_init_there() {
    let plan = plan();
    let tried = assert_each_failure_stops_everything_after_it(
        fake,
        |k| {
            let (mut ctrl, _peer) = control();
            init::setup(k, &plan, Vec::new(), &mut ctrl)
        },
        // The missing denied path already fails (ENOENT, skipped).
        |s| matches!(s, Step::Open { path, .. } if path == "/newroot/nowhere"),
        |s| match s {
            Step::Sethostname(_) | Step::LoopbackUp => FailureKind::Setup,
            Step::SetDumpable(false) | Step::DropBoundingSet => FailureKind::Privileges,
            _ => FailureKind::Mount,
        },
    );
    assert!(tried > 50, "{tried} steps failed one by one");
}

// Init.

#[test]
fn init_builds_the_root_then_hostname_loopback_non_dumpable_and_no_bounding_set() {
    let plan = plan();
    let mut k = fake();
    let (mut ctrl, peer) = control();
    init::setup(&mut k, &plan, Vec::new(), &mut ctrl).unwrap();
    drop(ctrl);
    let n = k.steps.len();
    assert_eq!(
        k.steps[n - 5..],
        [
            Step::SetAttr {
                path: "/".into(),
                flags: 0,
                set: ROOT_SEAL,
                clear: 0,
            },
            Step::Sethostname("corral".into()),
            Step::LoopbackUp,
            Step::SetDumpable(false),
            Step::DropBoundingSet,
        ]
    );
    assert_eq!(
        k.steps
            .iter()
            .filter(|s| **s == Step::DropBoundingSet)
            .count(),
        1
    );
    assert!(
        messages(peer).is_empty(),
        "network `none` hands nothing over"
    );
}

#[test]
fn init_in_network_mode_host_leaves_loopback_alone() {
    let mut plan = plan();
    plan.network = NetworkMode::Host;
    let mut k = fake();
    let (mut ctrl, _peer) = control();
    init::setup(&mut k, &plan, Vec::new(), &mut ctrl).unwrap();
    assert!(!k.steps.contains(&Step::LoopbackUp));
    assert_eq!(
        k.steps[k.steps.len() - 2..],
        [Step::SetDumpable(false), Step::DropBoundingSet]
    );
}

#[test]
fn init_in_network_mode_allow_hands_over_the_listeners_before_non_dumpable() {
    let mut plan = plan();
    plan.network = NetworkMode::Allow;
    let mut k = fake();
    let (mut ctrl, peer) = control();
    init::setup(&mut k, &plan, Vec::new(), &mut ctrl).unwrap();
    drop(ctrl);
    let n = k.steps.len();
    assert_eq!(
        k.steps[n - 5..],
        [
            Step::LoopbackUp,
            Step::ListenLoopback(crate::HTTP_PROXY_PORT),
            Step::ListenLoopback(crate::SOCKS_PROXY_PORT),
            Step::SetDumpable(false),
            Step::DropBoundingSet,
        ]
    );
    assert_eq!(
        messages(peer),
        [(
            HelperMessage::Listeners {
                http_port: crate::HTTP_PROXY_PORT,
                socks_port: crate::SOCKS_PROXY_PORT,
            },
            2
        )]
    );
}

// The program's process.

/// `plan`'s program part, made ready before the fork as init does.
fn ready(plan: &SandboxPlan) -> ProgramArgs {
    ProgramArgs::of(
        &plan.exec_path,
        &plan.argv,
        &plan.env,
        plan.cwd.as_str(),
        &plan.rlimits,
    )
    .unwrap()
}

/// Runs the program's steps for `plan` on `k`; returns the failure (a fake
/// `execve` always returns) and the messages sent.
fn program(k: &mut Fake, plan: &SandboxPlan) -> (Failure, Vec<(HelperMessage, usize)>) {
    program_with(k, plan, Some(ready(plan)))
}

/// [`program`] with the program part `ready` before the fork, or (`None`)
/// received by the process itself, as in a held sandbox. Its bounding set
/// was emptied by init, as in every sandbox with namespaces.
fn program_with(
    k: &mut Fake,
    plan: &SandboxPlan,
    ready: Option<ProgramArgs>,
) -> (Failure, Vec<(HelperMessage, usize)>) {
    program_in(k, plan, ready, true)
}

/// [`program_with`], `bounding_emptied` or not (reduced mode).
fn program_in(
    k: &mut Fake,
    plan: &SandboxPlan,
    ready: Option<ProgramArgs>,
    bounding_emptied: bool,
) -> (Failure, Vec<(HelperMessage, usize)>) {
    let filters = plan.security.filters.to_bpf();
    let last = LastSteps {
        landlock_required: plan.security.landlock.required,
        landlock_full: plan.security.landlock.require_full,
        filters: &filters,
        bounding_emptied,
    };
    let (mut ctrl, peer) = control();
    let failure = init::program_steps(k, &last, (), ready, &mut ctrl);
    drop(ctrl);
    (failure, messages(peer))
}

fn landlock_layers(status: &str, abi: i32) -> (HelperMessage, usize) {
    (
        HelperMessage::Layers {
            landlock: crate::LandlockOutcome {
                abi,
                status: status.into(),
            },
        },
        0,
    )
}

/// The program's steps that need no run, in order: a held sandbox's
/// process takes them before it waits for its program part.
fn needs_no_run() -> Vec<Step> {
    vec![
        Step::ResetSignals,
        Step::Setsid,
        Step::ParentDeathSignal(libc::SIGKILL),
        Step::DropCapabilitySets,
        Step::NoNewPrivs,
        Step::LandlockRestrictSelf,
    ]
}

#[test]
fn program_steps_follow_the_hardening_order() {
    let plan = plan();
    let mut k = fake();
    let (_, sent) = program(&mut k, &plan);
    let s = &k.steps;
    assert_eq!(
        *s,
        [
            needs_no_run().as_slice(),
            &[
                Step::GetRlimit(libc::RLIMIT_CORE),
                Step::SetRlimit {
                    resource: libc::RLIMIT_CORE,
                    soft: 0,
                    hard: 0,
                },
                Step::GetRlimit(libc::RLIMIT_NOFILE),
                Step::SetRlimit {
                    resource: libc::RLIMIT_NOFILE,
                    soft: 1024,
                    hard: 1024,
                },
                Step::Chdir("/workspace".into()),
                Step::SeccompInstall { instructions: 3 },
                Step::SeccompInstall { instructions: 2 },
                Step::Execve,
            ],
        ]
        .concat()
    );
    // The same order, rule by rule (so a failure names the broken rule).
    let at = |step: Step| pos(s, |x| *x == step);
    let last_rlimit = rpos(s, |x| matches!(x, Step::SetRlimit { .. }));
    let caps = at(Step::DropCapabilitySets);
    let nnp = at(Step::NoNewPrivs);
    let landlock = at(Step::LandlockRestrictSelf);
    let chdir = at(Step::Chdir("/workspace".into()));
    let first_seccomp = pos(s, |x| matches!(x, Step::SeccompInstall { .. }));
    assert!(caps < nnp, "capabilities dropped before no_new_privs");
    assert!(nnp < landlock, "no_new_privs before Landlock");
    assert!(last_rlimit < first_seccomp, "rlimits before seccomp");
    assert!(chdir < first_seccomp, "chdir before seccomp");
    assert!(landlock < first_seccomp, "Landlock before seccomp");
    assert_eq!(sent, [landlock_layers("fully_enforced", 6)]);
}

/// A held sandbox forks its program's process ahead of the run: it takes
/// every step that does not depend on the program part, reports its
/// layers, installs seccomp (its attach is then off the run's path), then
/// waits, and only then sets the run's rlimits and working directory (the
/// layers once, not twice).
#[test]
fn a_held_program_waits_for_its_run_after_every_step_that_does_not_need_it() {
    let plan = plan();
    let mut k = fake();
    let mut run = plan.program();
    run.cwd = path("/workspace/sub");
    run.argv = vec!["/bin/true".into(), "--run".into()];
    run.rlimits = vec![Rlimit {
        kind: RlimitKind::CpuTime,
        soft: 7,
        hard: 7,
    }];
    k.program = Some(run);
    let (failure, sent) = program_with(&mut k, &plan, None);
    assert_eq!(
        k.steps,
        [
            needs_no_run().as_slice(),
            &[
                Step::SeccompInstall { instructions: 3 },
                Step::SeccompInstall { instructions: 2 },
                Step::ReceiveProgram,
                // The run's rlimits and directory, not the held plan's.
                Step::GetRlimit(libc::RLIMIT_CPU),
                Step::SetRlimit {
                    resource: libc::RLIMIT_CPU,
                    soft: 7,
                    hard: 7,
                },
                Step::Chdir("/workspace/sub".into()),
                Step::Execve,
            ],
        ]
        .concat()
    );
    assert_eq!(sent, [landlock_layers("fully_enforced", 6)]);
    // The fake's execve "returned": the failure names the run's program.
    assert_eq!(failure.kind, FailureKind::ExecFailed);
}

/// What a held program's process does under its seccomp filters: only
/// what a program may do itself (receive on its socket, set its own
/// rlimits, change directory, execve), never a hardening step.
#[test]
fn after_a_held_programs_seccomp_come_only_steps_a_program_may_take() {
    let plan = plan();
    let mut k = fake();
    let mut run = plan.program();
    run.rlimits = plan.rlimits.clone();
    k.program = Some(run);
    program_with(&mut k, &plan, None);
    let last_seccomp = rpos(&k.steps, |x| matches!(x, Step::SeccompInstall { .. }));
    let after = &k.steps[last_seccomp + 1..];
    assert!(!after.is_empty());
    for step in after {
        assert!(
            matches!(
                step,
                Step::ReceiveProgram
                    | Step::GetRlimit(_)
                    | Step::SetRlimit { .. }
                    | Step::Chdir(_)
                    | Step::Execve
            ),
            "{step:?} after seccomp in {:#?}",
            k.steps
        );
    }
    // And every hardening step comes before the filters.
    for hardening in needs_no_run() {
        assert!(pos(&k.steps, |x| *x == hardening) < last_seccomp);
    }
}

#[test]
fn a_held_program_given_no_valid_program_stops_at_the_receive() {
    let plan = plan();
    let mut k = fake();
    let (failure, sent) = program_with(&mut k, &plan, None);
    assert_eq!(k.steps.last(), Some(&Step::ReceiveProgram));
    assert_eq!(failure.kind, FailureKind::Protocol);
    assert_eq!(failure.status, crate::EXIT_CORRAL_ERROR);
    // The layers went out before the wait (Landlock was in force then),
    // so a run reads them with its start; nothing more after it.
    assert_eq!(sent, [landlock_layers("fully_enforced", 6)]);
    // A program part that cannot be executed (a NUL byte) stops there too.
    let mut k = fake();
    let mut run = plan.program();
    run.argv = vec!["/bin/true".into(), "a\0b".into()];
    k.program = Some(run);
    let (failure, _) = program_with(&mut k, &plan, None);
    assert_eq!(k.steps.last(), Some(&Step::ReceiveProgram));
    assert_eq!(failure.kind, FailureKind::ExecFailed);
}

#[test]
fn nothing_but_execve_follows_the_seccomp_install() {
    let plan = plan();
    let mut k = fake();
    let (failure, _) = program(&mut k, &plan);
    let last_seccomp = rpos(&k.steps, |x| matches!(x, Step::SeccompInstall { .. }));
    assert_eq!(k.steps[last_seccomp + 1..], [Step::Execve]);
    let first_seccomp = pos(&k.steps, |x| matches!(x, Step::SeccompInstall { .. }));
    assert!(k.steps[first_seccomp..last_seccomp]
        .iter()
        .all(|x| matches!(x, Step::SeccompInstall { .. })));
    // The fake's execve "returned" errno 0: reported as an exec failure.
    assert_eq!(failure.kind, FailureKind::ExecFailed);
}

#[test]
fn rlimits_above_the_inherited_hard_limit_are_lowered_to_it() {
    let plan = plan();
    let mut k = fake();
    k.hard_limit = 512;
    program(&mut k, &plan);
    assert!(k.steps.contains(&Step::SetRlimit {
        resource: libc::RLIMIT_NOFILE,
        soft: 512,
        hard: 512,
    }));
}

#[test]
fn no_new_privs_failing_stops_before_landlock() {
    let plan = plan();
    let mut k = fake();
    k.fail_step(libc::EPERM, Step::NoNewPrivs);
    let (failure, sent) = program(&mut k, &plan);
    assert_eq!(k.steps.last(), Some(&Step::NoNewPrivs));
    assert!(!k.steps.contains(&Step::LandlockRestrictSelf));
    assert_eq!(failure.kind, FailureKind::Privileges);
    assert_eq!(failure.status, crate::EXIT_CORRAL_ERROR);
    assert!(
        failure.message.starts_with("PR_SET_NO_NEW_PRIVS: EPERM"),
        "{}",
        failure.message
    );
    assert!(sent.is_empty(), "no layers reported: {sent:?}");
}

#[test]
fn required_landlock_that_enforces_nothing_fails_closed() {
    let plan = plan();
    let mut k = fake();
    k.landlock = Enforcement::None;
    let (failure, sent) = program(&mut k, &plan);
    assert_eq!(k.steps.last(), Some(&Step::LandlockRestrictSelf));
    assert_eq!(failure.kind, FailureKind::Security);
    assert!(
        failure.message.contains("landlock is required"),
        "{}",
        failure.message
    );
    assert!(sent.is_empty(), "no layers reported: {sent:?}");
}

#[test]
fn best_effort_landlock_that_enforces_nothing_goes_on_and_says_so() {
    let mut plan = plan();
    plan.security.landlock.required = false;
    let mut k = fake();
    k.landlock = Enforcement::None;
    let (_, sent) = program(&mut k, &plan);
    assert_eq!(k.steps.last(), Some(&Step::Execve));
    assert_eq!(sent, [landlock_layers("not_enforced", 0)]);
}

#[test]
fn reduced_mode_needs_landlock_fully_enforced() {
    let mut plan = plan();
    plan.security.landlock.require_full = true;
    let mut k = fake();
    k.landlock = Enforcement::Partial;
    let (failure, _) = program(&mut k, &plan);
    assert_eq!(k.steps.last(), Some(&Step::LandlockRestrictSelf));
    assert_eq!(failure.kind, FailureKind::Security);
    assert!(
        failure.message.contains("partially_enforced"),
        "{}",
        failure.message
    );
}

#[test]
fn execve_errors_are_reported_by_kind() {
    let plan = plan();
    for (errno, kind, status) in [
        (
            libc::ENOENT,
            FailureKind::ExecNotFound,
            crate::EXIT_NOT_FOUND,
        ),
        (
            libc::EACCES,
            FailureKind::ExecFailed,
            crate::EXIT_NOT_EXECUTABLE,
        ),
    ] {
        let mut k = fake();
        k.fail_step(errno, Step::Execve);
        let (failure, _) = program(&mut k, &plan);
        assert_eq!((failure.kind, failure.status), (kind, status));
        assert!(
            failure.message.starts_with("cannot execute /bin/true: "),
            "{}",
            failure.message
        );
    }
}

#[test]
fn any_failing_program_step_stops_everything_after_it() {
    let plan = plan();
    let tried = assert_each_failure_stops_everything_after_it(
        fake,
        |k| {
            let (failure, _) = program(k, &plan);
            // Reaching execve is the success of this run.
            if k.steps.last() == Some(&Step::Execve) {
                Ok(())
            } else {
                Err((failure.kind, failure.message))
            }
        },
        |s| *s == Step::Execve,
        |s| match s {
            Step::LandlockRestrictSelf | Step::SeccompInstall { .. } => FailureKind::Security,
            _ => FailureKind::Privileges,
        },
    );
    assert_eq!(tried, 13);
}

// The helper.

#[test]
fn helper_steps_create_the_user_namespace_first_then_the_others() {
    let plan = plan();
    let mut k = fake();
    let next = helper_steps(&mut k, &plan, |k| {
        k.mark("prepare idmapped binds");
        Ok(())
    })
    .unwrap();
    assert!(matches!(next, Next::Namespaces(())));
    assert_eq!(
        k.steps,
        [
            vec![
                Step::CloseFrom(4),
                Step::Mark("prepare idmapped binds"),
                Step::ParentDeathSignal(libc::SIGKILL),
                Step::Getppid,
                Step::Unshare(ns::CLONE_NEWUSER),
            ],
            id_maps(),
            // No nested user namespace, before any other namespace exists.
            user_namespace_limits(),
            vec![
                // The maps written, nothing may read this process's memory.
                Step::SetDumpable(false),
                Step::Unshare(
                    ns::CLONE_NEWNS
                        | ns::CLONE_NEWPID
                        | ns::CLONE_NEWIPC
                        | ns::CLONE_NEWUTS
                        | ns::CLONE_NEWNET
                        | ns::CLONE_NEWCGROUP
                ),
                Step::BlockSignals,
            ],
        ]
        .concat()
    );
}

#[test]
fn helper_as_root_becomes_the_sandbox_user_before_any_namespace() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    let mut k = fake();
    helper_steps(&mut k, &plan, |k| {
        k.mark("prepare idmapped binds");
        Ok(())
    })
    .unwrap();
    assert_eq!(
        k.steps[..6],
        [
            Step::CloseFrom(4),
            Step::Mark("prepare idmapped binds"),
            Step::BecomeUser {
                uid: 1000,
                gid: 1001,
            },
            Step::SetDumpable(true),
            Step::ParentDeathSignal(libc::SIGKILL),
            Step::Getppid,
        ],
        "idmapped clones while root, then the uid change, then PDEATHSIG (which it clears)"
    );
    assert!(!k.steps.contains(&Step::DropBoundingSet));
}

#[test]
fn helper_in_network_mode_host_keeps_the_host_network_namespace() {
    let mut plan = plan();
    plan.network = NetworkMode::Host;
    let mut k = fake();
    helper_steps(&mut k, &plan, |_| Ok(())).unwrap();
    let flags = k
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Unshare(f) if *f != ns::CLONE_NEWUSER => Some(*f),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(flags.len(), 1);
    assert_eq!(flags[0] & ns::CLONE_NEWNET, 0);
    assert_ne!(flags[0] & ns::CLONE_NEWNS, 0);
}

#[test]
fn helper_without_user_namespaces_says_so_and_stops() {
    let plan = plan();
    let mut k = fake();
    k.fail_step(libc::EPERM, Step::Unshare(ns::CLONE_NEWUSER));
    let Err((kind, message)) = helper_steps(&mut k, &plan, |_| Ok(())) else {
        panic!("unshare failed but the helper went on");
    };
    assert_eq!(kind, FailureKind::UserNamespace);
    assert!(message.contains("corral doctor"), "{message}");
    assert_eq!(k.steps.last(), Some(&Step::Unshare(ns::CLONE_NEWUSER)));
}

#[test]
fn helper_whose_parent_is_gone_stops_quietly_before_any_namespace() {
    let plan = plan();
    let mut k = Fake::new(1);
    let next = helper_steps(&mut k, &plan, |_| Ok(())).unwrap();
    assert!(matches!(next, Next::ParentGone));
    assert_eq!(k.steps.last(), Some(&Step::Getppid));
}

#[test]
fn helper_stops_when_idmapped_preparation_fails() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    let mut k = fake();
    let Err((kind, message)) = helper_steps(&mut k, &plan, |_| {
        Err::<(), _>("idmapping /x: EINVAL".into())
    }) else {
        panic!("preparation failed but the helper went on");
    };
    assert_eq!(
        (kind, message.as_str()),
        (FailureKind::Mount, "idmapping /x: EINVAL")
    );
    assert_eq!(
        k.steps,
        [Step::CloseFrom(4)],
        "still root: nothing else ran"
    );
}

#[test]
fn any_failing_helper_step_stops_everything_after_it() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    let tried = assert_each_failure_stops_everything_after_it(
        fake,
        |k| helper_steps(k, &plan, |_| Ok(())).map(drop),
        // PDEATHSIG failing is the quiet exit, tested on its own.
        |s| matches!(s, Step::ParentDeathSignal(_) | Step::Getppid),
        |s| match s {
            Step::BecomeUser { .. } | Step::SetDumpable(true) => FailureKind::Identity,
            Step::SetDumpable(false) => FailureKind::Privileges,
            Step::Unshare(f) if *f == ns::CLONE_NEWUSER => FailureKind::UserNamespace,
            Step::WriteProcFile { .. } => FailureKind::UserNamespace,
            Step::Unshare(_) => FailureKind::Namespace,
            _ => FailureKind::Setup,
        },
    );
    assert_eq!(tried, 13);
}

#[test]
fn a_kernel_without_inotify_has_no_share_to_set_and_goes_on() {
    let plan = plan();
    for (file, value) in crate::INOTIFY_SHARE {
        let mut k = fake();
        k.fail_step(
            libc::ENOENT,
            Step::WriteProcFile {
                path: file.into(),
                contents: value.into(),
            },
        );
        assert!(helper_steps(&mut k, &plan, |_| Ok(())).is_ok(), "{file}");
        assert!(k.steps.contains(&Step::SetDumpable(false)), "{file}");
    }
}

#[test]
fn helper_failing_pdeathsig_stops_quietly() {
    let plan = plan();
    let mut k = fake();
    k.fail_step(libc::EINVAL, Step::ParentDeathSignal(libc::SIGKILL));
    let next = helper_steps(&mut k, &plan, |_| Ok(())).unwrap();
    assert!(matches!(next, Next::ParentGone));
    assert_eq!(
        k.steps.last(),
        Some(&Step::ParentDeathSignal(libc::SIGKILL))
    );
}

// init cloned by corral into the namespaces.

/// No user namespace below the sandbox's, and its share of the host user's
/// inotify budget, as the helper and a cloned init write them.
fn user_namespace_limits() -> Vec<Step> {
    std::iter::once(("/proc/sys/user/max_user_namespaces", "0"))
        .chain(crate::INOTIFY_SHARE)
        .map(|(path, contents)| Step::WriteProcFile {
            path: path.into(),
            contents: contents.into(),
        })
        .collect()
}

/// setgroups deny and the plan's one-id maps, as the helper and a cloned
/// init write them for themselves.
fn id_maps() -> Vec<Step> {
    vec![
        Step::WriteProcFile {
            path: "/proc/self/setgroups".into(),
            contents: "deny".into(),
        },
        Step::WriteProcFile {
            path: "/proc/self/uid_map".into(),
            contents: "1000 1000 1\n".into(),
        },
        Step::WriteProcFile {
            path: "/proc/self/gid_map".into(),
            contents: "1001 1001 1\n".into(),
        },
    ]
}

fn tasks(path: &str) -> FakeFd {
    FakeFd(path.into())
}

/// A join: `0` written to a `tasks` file (moves the writing thread in).
fn moves_in(tasks: &str) -> Step {
    Step::WriteAll {
        path: tasks.into(),
        contents: b"0".to_vec(),
    }
}

#[test]
fn cloned_init_joins_its_group_first_and_unshares_the_cgroup_namespace_after_it() {
    let plan = plan();
    let mut k = fake();
    let join = vec![
        tasks("/cg/memory/corral/r/tasks"),
        tasks("/cg/pids/corral/r/tasks"),
    ];
    cloned_init_steps(&mut k, &plan, join, false, &[7, 9]).unwrap();
    assert_eq!(
        k.steps,
        [
            vec![
                // Contained before anything else, each hierarchy once.
                moves_in("/cg/memory/corral/r/tasks"),
                moves_in("/cg/pids/corral/r/tasks"),
                Step::CloseFromExcept {
                    first: 4,
                    keep: vec![7, 9],
                },
            ],
            id_maps(),
            vec![
                // Dumpable no longer than the maps need.
                Step::SetDumpable(false),
            ],
            user_namespace_limits(),
            vec![
                // After the join: the namespace's root is the sandbox's group.
                Step::Unshare(ns::CLONE_NEWCGROUP),
                Step::BlockSignals,
            ],
        ]
        .concat()
    );
}

#[test]
fn cloned_init_whose_group_comes_later_joins_after_its_root_and_before_anything_else() {
    let plan = plan();
    let mut k = fake();
    cloned_init_steps(&mut k, &plan, Vec::new(), true, &[7]).unwrap();
    // Neither the join nor the cgroup namespace yet: the group does not
    // exist while corral clones init.
    assert!(!k.steps.iter().any(|s| matches!(s, Step::WriteAll { .. })));
    assert!(!k.steps.contains(&Step::Unshare(ns::CLONE_NEWCGROUP)));
    assert_eq!(k.steps.last(), Some(&Step::BlockSignals));
    // Then, once the root stands: the files corral sends, each written,
    // and only then the cgroup namespace, rooted at the sandbox's group.
    let mut k = fake();
    k.join = vec![
        tasks("/cg/memory/corral/r/tasks"),
        tasks("/cg/pids/corral/r/tasks"),
    ];
    let (mut ctrl, _peer) = control();
    crate::init_joins_late(&mut k, &mut ctrl).unwrap();
    assert_eq!(
        k.steps,
        [
            Step::ReceiveJoin,
            moves_in("/cg/memory/corral/r/tasks"),
            moves_in("/cg/pids/corral/r/tasks"),
            Step::Unshare(ns::CLONE_NEWCGROUP),
        ]
    );
    // A message without files is not a join: init stops.
    let mut k = fake();
    let err = crate::init_joins_late(&mut k, &mut ctrl).unwrap_err();
    assert_eq!(err.0, FailureKind::Protocol);
    assert!(!k.steps.contains(&Step::Unshare(ns::CLONE_NEWCGROUP)));
    // A failed join stops before the namespace.
    let mut k = fake();
    k.join = vec![tasks("/cg/memory/corral/r/tasks")];
    k.fail(libc::EACCES, |s| matches!(s, Step::WriteAll { .. }));
    let err = crate::init_joins_late(&mut k, &mut ctrl).unwrap_err();
    assert_eq!(err.0, FailureKind::Setup);
    assert!(!k.steps.contains(&Step::Unshare(ns::CLONE_NEWCGROUP)));
}

#[test]
fn cloned_init_as_root_drops_the_saved_host_root_right_after_its_maps() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    let mut k = fake();
    cloned_init_steps(&mut k, &plan, Vec::new(), false, &[5]).unwrap();
    assert_eq!(
        k.steps[..7],
        [
            vec![
                Step::CloseFromExcept {
                    first: 4,
                    keep: vec![5],
                },
                // corral's uid change for the clone left it non-dumpable.
                Step::SetDumpable(true),
            ],
            id_maps(),
            vec![
                // Dumpable only while the maps are written.
                Step::SetDumpable(false),
                // Every id the sandbox identity, the saved uid 0 included.
                Step::SetIds {
                    uid: 1000,
                    gid: 1001,
                },
            ],
        ]
        .concat()
    );
    assert_eq!(
        k.steps[7..],
        [
            user_namespace_limits(),
            vec![Step::Unshare(ns::CLONE_NEWCGROUP), Step::BlockSignals],
        ]
        .concat()
    );
    // setgroups(2) is denied by now; corral emptied the groups itself.
    assert!(!k.steps.iter().any(|s| matches!(s, Step::BecomeUser { .. })));
}

#[test]
fn any_failing_cloned_init_step_stops_everything_after_it() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    let tried = assert_each_failure_stops_everything_after_it(
        fake,
        |k| {
            cloned_init_steps(
                k,
                &plan,
                vec![tasks("/cg/memory/corral/r/tasks")],
                false,
                &[],
            )
        },
        |_| false,
        |s| match s {
            Step::SetIds { .. } | Step::SetDumpable(true) => FailureKind::Identity,
            Step::SetDumpable(false) => FailureKind::Privileges,
            Step::WriteProcFile { .. } => FailureKind::UserNamespace,
            Step::Unshare(_) => FailureKind::Namespace,
            _ => FailureKind::Setup,
        },
    );
    assert_eq!(tried, 13);
}

#[test]
fn cloned_init_gets_every_namespace_of_the_helper_but_the_cgroup_one() {
    let mut plan = plan();
    let all = ns::CLONE_NEWUSER
        | ns::CLONE_NEWNS
        | ns::CLONE_NEWPID
        | ns::CLONE_NEWIPC
        | ns::CLONE_NEWUTS
        | ns::CLONE_NEWNET;
    assert_eq!(cloned_init_namespaces(&plan), all);
    plan.network = NetworkMode::Host;
    assert_eq!(cloned_init_namespaces(&plan), all & !ns::CLONE_NEWNET);
}

#[test]
fn reduced_mode_as_root_empties_the_bounding_set_and_creates_no_namespace() {
    let mut plan = plan();
    plan.identity.drop_from_root = true;
    plan.reduced = Some(ReducedPlan {
        workdir: "/home/me/project".into(),
    });
    let mut k = fake();
    let next = helper_steps(&mut k, &plan, |k| {
        k.mark("prepare idmapped binds");
        Ok(())
    })
    .unwrap();
    assert!(matches!(next, Next::Reduced(())));
    assert_eq!(
        k.steps,
        [
            Step::CloseFrom(4),
            Step::DropBoundingSet,
            Step::Mark("prepare idmapped binds"),
            Step::BecomeUser {
                uid: 1000,
                gid: 1001,
            },
            Step::SetDumpable(true),
            Step::ParentDeathSignal(libc::SIGKILL),
            Step::Getppid,
        ]
    );
    let mut k = fake();
    reduced::setup(&mut k).unwrap();
    assert_eq!(
        k.steps,
        [
            Step::ChildSubreaper,
            Step::BlockSignals,
            Step::SetDumpable(false)
        ]
    );
}

// Init once the program runs.

/// Two one-instruction "programs" standing for the reaper's filters.
fn reaper_filters() -> Vec<seccompiler::BpfProgram> {
    let allow = || seccompiler::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0x7fff_0000,
    };
    vec![vec![allow()], vec![allow(), allow()]]
}

/// init's bounding set is empty since `setup`: giving up its privileges
/// leaves it be. The filter comes once the program's process exists.
#[test]
fn init_gives_up_capabilities_then_new_privileges_and_installs_its_filter_last() {
    let mut k = fake();
    init::give_up_privileges(&mut k).unwrap();
    init::harden_reaper(&mut k, &reaper_filters()).unwrap();
    assert_eq!(
        k.steps,
        [
            Step::DropCapabilitySets,
            Step::NoNewPrivs,
            Step::SeccompInstall { instructions: 1 },
            Step::SeccompInstall { instructions: 2 },
        ]
    );
}

#[test]
fn init_that_cannot_give_up_its_capabilities_stops_there() {
    let mut k = fake();
    k.fail_step(libc::EPERM, Step::DropCapabilitySets);
    let (kind, message) = init::give_up_privileges(&mut k).unwrap_err();
    assert_eq!(kind, FailureKind::Privileges);
    assert!(message.contains("EPERM"), "{message}");
    assert_eq!(k.steps, [Step::DropCapabilitySets]);

    let mut k = fake();
    k.fail_step(libc::EINVAL, Step::NoNewPrivs);
    let (kind, _) = init::give_up_privileges(&mut k).unwrap_err();
    assert_eq!(kind, FailureKind::Privileges);
    assert_eq!(k.steps, [Step::DropCapabilitySets, Step::NoNewPrivs]);

    let mut k = fake();
    k.fail_step(libc::EINVAL, Step::SeccompInstall { instructions: 2 });
    let (kind, _) = init::harden_reaper(&mut k, &reaper_filters()).unwrap_err();
    assert_eq!(kind, FailureKind::Security);
}

/// init holds every capability of its user namespace: a bounding set it
/// cannot empty is an error (its setup fails, so no program starts), not
/// a sandbox with a weaker layer than it reports.
#[test]
fn init_whose_bounding_set_stays_fails_its_setup() {
    let plan = plan();
    let mut k = fake();
    k.bounding_stays = true;
    let (mut ctrl, _peer) = control();
    let (kind, message) = init::setup(&mut k, &plan, Vec::new(), &mut ctrl).unwrap_err();
    assert_eq!(kind, FailureKind::Privileges);
    assert!(message.contains("bounding set"), "{message}");
    // What to look at: what refuses the drops around corral.
    assert!(message.contains("PR_CAPBSET_DROP"), "{message}");
    assert_eq!(k.steps.last(), Some(&Step::DropBoundingSet));
}

/// Without init (reduced mode) nothing emptied the program's bounding set:
/// it drops every set itself, the bounding set included.
#[test]
fn a_program_whose_bounding_set_init_did_not_empty_drops_it_itself() {
    let plan = plan();
    let mut k = fake();
    program_in(&mut k, &plan, Some(ready(&plan)), false);
    assert!(k.steps.contains(&Step::DropCapabilities));
    assert!(!k.steps.contains(&Step::DropCapabilitySets));
    // With init, only the other sets.
    let mut k = fake();
    program(&mut k, &plan);
    assert!(k.steps.contains(&Step::DropCapabilitySets));
    assert!(!k.steps.contains(&Step::DropCapabilities));
}
