//! A recording [`Kernel`] for unit tests: every call is stored as a
//! [`Step`] with its arguments, nothing reaches the kernel, and any step
//! can be made to fail with an errno.
//!
//! Descriptors are labels: the path an `open_at` resolved to (joined onto
//! its directory's label), or `treeN:SOURCE` for the N-th detached mount
//! tree, so the record reads like the real sequence.

use std::ffi::CStr;
use std::io;
use std::os::fd::OwnedFd;

use corral_sys::exec::ExecArgs;

use crate::plan::ProgramPlan;
use corral_sys::{Errno, SysResult};

use super::{At, Enforcement, Kernel, LandlockStatus};

/// A fake descriptor: the label of what it refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FakeFd(pub(crate) String);

/// One recorded call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A mark the test itself recorded (e.g. where `prepare` ran).
    Mark(&'static str),
    CloseFrom(u32),
    CloseFromExcept {
        first: u32,
        keep: Vec<i32>,
    },
    DropBoundingSet,
    BecomeUser {
        uid: u32,
        gid: u32,
    },
    SetIds {
        uid: u32,
        gid: u32,
    },
    SetDumpable(bool),
    ParentDeathSignal(i32),
    Getppid,
    Unshare(i32),
    WriteProcFile {
        path: String,
        contents: String,
    },
    BlockSignals,
    ChildSubreaper,
    Mount {
        source: Option<String>,
        target: String,
        fstype: Option<String>,
        flags: u64,
        data: Option<String>,
    },
    Umount {
        target: String,
        flags: i32,
    },
    PivotRoot {
        new_root: String,
        put_old: String,
    },
    Chdir(String),
    Mkdir {
        path: String,
        mode: u32,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    CreateFile {
        path: String,
        mode: u32,
    },
    WriteAll {
        path: String,
        contents: Vec<u8>,
    },
    Open {
        path: String,
        flags: i32,
        resolve: u64,
    },
    IsDir(String),
    OpenTree {
        path: String,
        flags: u32,
        tree: String,
    },
    SetAttr {
        path: String,
        flags: u32,
        set: u64,
        clear: u64,
    },
    MoveMount {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Sethostname(String),
    LoopbackUp,
    ListenLoopback(u16),
    ResetSignals,
    Setsid,
    GetRlimit(libc::__rlimit_resource_t),
    SetRlimit {
        resource: libc::__rlimit_resource_t,
        soft: u64,
        hard: u64,
    },
    DropCapabilities,
    DropCapabilitySets,
    NoNewPrivs,
    LandlockRestrictSelf,
    SeccompInstall {
        instructions: usize,
    },
    ReceiveProgram,
    /// `receive_join`.
    ReceiveJoin,
    Execve,
}

type Predicate = Box<dyn Fn(&Step) -> bool>;

/// The recording kernel.
pub(crate) struct Fake {
    /// Every call so far, in order.
    pub(crate) steps: Vec<Step>,
    failures: Vec<(i32, Predicate)>,
    files: Vec<String>,
    trees: usize,
    /// What `getppid` answers.
    pub(crate) ppid: i32,
    /// The hard limit `get_rlimit` reports for every resource.
    pub(crate) hard_limit: u64,
    /// How much Landlock `landlock_restrict_self` reports in force.
    pub(crate) landlock: Enforcement,
    /// What `receive_program` hands over (`None`: a protocol error).
    pub(crate) program: Option<ProgramPlan>,
    /// The files `receive_join` hands over.
    pub(crate) join: Vec<FakeFd>,
    /// Whether `drop_bounding_set` reports capabilities it could not drop
    /// (an unprivileged process without a user namespace).
    pub(crate) bounding_stays: bool,
}

fn text(s: &CStr) -> String {
    s.to_string_lossy().into_owned()
}

/// `name` resolved against the label `base`. Leading slashes are dropped:
/// every relative resolution the helper makes is confined to its
/// directory (`RESOLVE_BENEATH` / `RESOLVE_IN_ROOT`).
fn join(base: &str, name: &CStr) -> String {
    let name = text(name);
    let name = name.trim_start_matches('/');
    if name.is_empty() || name == "." {
        base.to_string()
    } else {
        format!("{}/{name}", base.trim_end_matches('/'))
    }
}

impl Fake {
    /// A fake whose every call succeeds, whose parent is `ppid`, and whose
    /// bind sources are directories except the host's device files.
    pub(crate) fn new(ppid: i32) -> Fake {
        Fake {
            steps: Vec::new(),
            failures: Vec::new(),
            files: ["null", "zero", "full", "random", "urandom"]
                .iter()
                .map(|d| format!("/oldroot/dev/{d}"))
                .collect(),
            trees: 0,
            ppid,
            hard_limit: libc::RLIM_INFINITY,
            landlock: Enforcement::Full,
            program: None,
            join: Vec::new(),
            bounding_stays: false,
        }
    }

    /// Makes every step `when` matches fail with `errno` (the step is still
    /// recorded: it was attempted).
    pub(crate) fn fail(&mut self, errno: i32, when: impl Fn(&Step) -> bool + 'static) {
        self.failures.push((errno, Box::new(when)));
    }

    /// Makes `step` (every call equal to it) fail with `errno`.
    pub(crate) fn fail_step(&mut self, errno: i32, step: Step) {
        self.fail(errno, move |s| *s == step);
    }

    /// Makes `is_dir` answer "regular file" for the object labelled `path`.
    pub(crate) fn file(&mut self, path: &str) {
        self.files.push(path.to_string());
    }

    /// Records a mark (for code the test runs between kernel steps).
    pub(crate) fn mark(&mut self, what: &'static str) {
        self.steps.push(Step::Mark(what));
    }

    fn label(&self, dir: &At<'_, FakeFd>, name: &CStr) -> String {
        match dir {
            At::Cwd => text(name),
            At::Fd(fd) => {
                self.assert_fresh(fd);
                join(&fd.0, name)
            }
        }
    }

    /// Fails the test when `fd` was opened before something was mounted
    /// at its path or above it: a real descriptor would still refer to
    /// the covered object, and whatever is made or mounted through it would
    /// land under the mount, out of the sandbox's sight. (Descriptors are
    /// told apart by their labels: the check compares the last `Open` of
    /// the label with the last mount over it.)
    fn assert_fresh(&self, fd: &FakeFd) {
        let label = fd.0.as_str();
        let covers = |at: &str| corral_policy::path::is_at_or_below(label, at);
        let opened = self
            .steps
            .iter()
            .rposition(|s| matches!(s, Step::Open { path, .. } if path == label));
        let mounted = self.steps.iter().rposition(|s| match s {
            // A mount with a source puts something there; one without
            // (`MS_PRIVATE` on `/`) only changes propagation.
            Step::Mount {
                source: Some(_),
                target,
                ..
            } => covers(target),
            Step::MoveMount { to, .. } => covers(to),
            _ => false,
        });
        if let (Some(opened), Some(mounted)) = (opened, mounted) {
            assert!(
                opened > mounted,
                "{label} is used through a descriptor opened at step {opened}, before the mount \
                 over it at step {mounted}: {:#?}",
                self.steps
            );
        }
    }

    fn record(&mut self, step: Step) -> SysResult<()> {
        let failed = self
            .failures
            .iter()
            .find(|(_, when)| when(&step))
            .map(|(errno, _)| Errno(*errno));
        self.steps.push(step);
        failed.map_or(Ok(()), Err)
    }
}

impl Kernel for Fake {
    type Fd = FakeFd;
    type Ruleset = ();
    type LandlockError = io::Error;

    fn close_from(&mut self, first: u32) -> SysResult<()> {
        self.record(Step::CloseFrom(first))
    }
    fn close_from_except(&mut self, first: u32, keep: &[i32]) -> SysResult<()> {
        self.record(Step::CloseFromExcept {
            first,
            keep: keep.to_vec(),
        })
    }
    fn drop_bounding_set(&mut self) -> SysResult<bool> {
        self.record(Step::DropBoundingSet)
            .map(|()| !self.bounding_stays)
    }
    fn become_user(&mut self, uid: u32, gid: u32) -> SysResult<()> {
        self.record(Step::BecomeUser { uid, gid })
    }
    fn set_ids(&mut self, uid: u32, gid: u32) -> SysResult<()> {
        self.record(Step::SetIds { uid, gid })
    }
    fn set_dumpable(&mut self, dumpable: bool) -> SysResult<()> {
        self.record(Step::SetDumpable(dumpable))
    }
    fn set_parent_death_signal(&mut self, sig: i32) -> SysResult<()> {
        self.record(Step::ParentDeathSignal(sig))
    }
    fn getppid(&mut self) -> i32 {
        self.steps.push(Step::Getppid);
        self.ppid
    }
    fn unshare(&mut self, flags: i32) -> SysResult<()> {
        self.record(Step::Unshare(flags))
    }
    fn write_proc_file(&mut self, path: &str, contents: &str) -> io::Result<()> {
        Ok(self.record(Step::WriteProcFile {
            path: path.into(),
            contents: contents.into(),
        })?)
    }
    fn block_signals(&mut self) -> SysResult<()> {
        self.record(Step::BlockSignals)
    }
    fn set_child_subreaper(&mut self) -> SysResult<()> {
        self.record(Step::ChildSubreaper)
    }

    fn mount(
        &mut self,
        source: Option<&CStr>,
        target: &CStr,
        fstype: Option<&CStr>,
        flags: u64,
        data: Option<&CStr>,
    ) -> SysResult<()> {
        self.record(Step::Mount {
            source: source.map(text),
            target: text(target),
            fstype: fstype.map(text),
            flags,
            data: data.map(text),
        })
    }
    fn umount(&mut self, target: &CStr, flags: i32) -> SysResult<()> {
        self.record(Step::Umount {
            target: text(target),
            flags,
        })
    }
    fn pivot_root(&mut self, new_root: &CStr, put_old: &CStr) -> SysResult<()> {
        self.record(Step::PivotRoot {
            new_root: text(new_root),
            put_old: text(put_old),
        })
    }
    fn chdir(&mut self, path: &CStr) -> SysResult<()> {
        self.record(Step::Chdir(text(path)))
    }
    fn mkdir_at(&mut self, dir: At<'_, FakeFd>, name: &CStr, mode: u32) -> SysResult<()> {
        let path = self.label(&dir, name);
        self.record(Step::Mkdir { path, mode })
    }
    fn chmod(&mut self, path: &str, mode: u32) -> io::Result<()> {
        Ok(self.record(Step::Chmod {
            path: path.into(),
            mode,
        })?)
    }
    fn create_file_at(&mut self, dir: At<'_, FakeFd>, name: &CStr, mode: u32) -> SysResult<FakeFd> {
        let path = self.label(&dir, name);
        self.record(Step::CreateFile {
            path: path.clone(),
            mode,
        })?;
        Ok(FakeFd(path))
    }
    fn write_all(&mut self, file: FakeFd, contents: &[u8]) -> io::Result<()> {
        Ok(self.record(Step::WriteAll {
            path: file.0,
            contents: contents.to_vec(),
        })?)
    }
    fn open_at(
        &mut self,
        dir: At<'_, FakeFd>,
        path: &CStr,
        flags: i32,
        resolve: u64,
    ) -> SysResult<FakeFd> {
        let path = self.label(&dir, path);
        self.record(Step::Open {
            path: path.clone(),
            flags,
            resolve,
        })?;
        Ok(FakeFd(path))
    }
    fn is_dir(&mut self, fd: &FakeFd) -> SysResult<bool> {
        self.record(Step::IsDir(fd.0.clone()))?;
        Ok(!self.files.contains(&fd.0))
    }
    fn open_tree(&mut self, dir: At<'_, FakeFd>, path: &CStr, flags: u32) -> SysResult<FakeFd> {
        let path = self.label(&dir, path);
        self.trees += 1;
        let tree = format!("tree{}:{path}", self.trees);
        self.record(Step::OpenTree {
            path,
            flags,
            tree: tree.clone(),
        })?;
        Ok(FakeFd(tree))
    }
    fn mount_setattr(
        &mut self,
        dir: At<'_, FakeFd>,
        path: &CStr,
        flags: u32,
        set: u64,
        clear: u64,
    ) -> SysResult<()> {
        let path = self.label(&dir, path);
        self.record(Step::SetAttr {
            path,
            flags,
            set,
            clear,
        })
    }
    fn move_mount(&mut self, from: &FakeFd, to: &FakeFd) -> SysResult<()> {
        self.assert_fresh(to);
        self.record(Step::MoveMount {
            from: from.0.clone(),
            to: to.0.clone(),
        })
    }
    fn symlink_at(&mut self, target: &CStr, dir: At<'_, FakeFd>, name: &CStr) -> SysResult<()> {
        let path = self.label(&dir, name);
        self.record(Step::Symlink {
            target: text(target),
            path,
        })
    }

    fn sethostname(&mut self, name: &str) -> SysResult<()> {
        self.record(Step::Sethostname(name.into()))
    }
    fn loopback_up(&mut self) -> SysResult<()> {
        self.record(Step::LoopbackUp)
    }
    fn listen_loopback(&mut self, port: u16) -> io::Result<OwnedFd> {
        self.record(Step::ListenLoopback(port))?;
        // A real descriptor (nothing listens), so it can be passed on the
        // control socket like the real listener.
        std::fs::File::open("/dev/null").map(OwnedFd::from)
    }

    fn reset_signals(&mut self) -> SysResult<()> {
        self.record(Step::ResetSignals)
    }
    fn setsid(&mut self) -> SysResult<()> {
        self.record(Step::Setsid)
    }
    fn get_rlimit(&mut self, resource: libc::__rlimit_resource_t) -> SysResult<(u64, u64)> {
        self.record(Step::GetRlimit(resource))?;
        Ok((self.hard_limit, self.hard_limit))
    }
    fn set_rlimit(
        &mut self,
        resource: libc::__rlimit_resource_t,
        soft: u64,
        hard: u64,
    ) -> SysResult<()> {
        self.record(Step::SetRlimit {
            resource,
            soft,
            hard,
        })
    }
    fn drop_capabilities(&mut self) -> SysResult<bool> {
        self.record(Step::DropCapabilities).map(|()| true)
    }
    fn drop_capability_sets(&mut self) -> SysResult<()> {
        self.record(Step::DropCapabilitySets)
    }
    fn set_no_new_privs(&mut self) -> SysResult<()> {
        self.record(Step::NoNewPrivs)
    }
    fn landlock_restrict_self(&mut self, (): ()) -> Result<LandlockStatus, io::Error> {
        self.record(Step::LandlockRestrictSelf)?;
        Ok(LandlockStatus {
            enforced: self.landlock,
            abi: if self.landlock == Enforcement::None {
                0
            } else {
                6
            },
        })
    }
    fn seccomp_install(
        &mut self,
        program: &seccompiler::BpfProgram,
    ) -> Result<(), seccompiler::Error> {
        self.record(Step::SeccompInstall {
            instructions: program.len(),
        })
        .map_err(|e| seccompiler::Error::Seccomp(e.into()))
    }
    /// Returns the errno of a matching failure, else 0: a fake cannot
    /// replace the process, and a real `execve` returns only on failure.
    fn receive_join(&mut self, _ctrl: &mut crate::Control) -> Result<Vec<FakeFd>, String> {
        self.record(Step::ReceiveJoin)
            .map_err(|e| format!("reading the cgroup join message: {e}"))?;
        Ok(self.join.clone())
    }
    fn receive_program(&mut self, _ctrl: &mut crate::Control) -> Result<ProgramPlan, String> {
        self.record(Step::ReceiveProgram)
            .map_err(|e| format!("reading the program message: {e}"))?;
        self.program
            .clone()
            .ok_or_else(|| "the program message is not one corral sends".to_string())
    }

    fn execve(&mut self, _exec: &ExecArgs) -> Errno {
        self.record(Step::Execve).err().unwrap_or(Errno(0))
    }
}
