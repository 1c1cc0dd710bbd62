//! Planning: from a profile and a request to the exact list of steps the
//! helper performs. Pure apart from looking at the host filesystem (which
//! paths exist, which are symlinks), so it is unit-tested without root.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use corral_policy::commands::{self, CommandDecision, CommandRejection};
use corral_policy::config::reserved_destination;
use corral_policy::env::{self, EnvError, EnvRequest};
use corral_policy::path::is_at_or_below;
use corral_policy::{AuditEvent, Level, MountSpec, Profile, ReasonCode, SandboxPath};
use corral_policy::{LandlockMode, NetworkMode, SeccompProfile};

use corral_helper::{
    rlimit_resource, GeneratedFile, LandlockPlan, MountOp, ProgramPlan, ReducedPlan, Rlimit,
    RlimitKind, SandboxIdentity, SandboxPlan, SecurityPlan, HTTP_PROXY_PORT, SOCKS_PROXY_PORT,
};

use crate::resolve::{CommandTable, Resolution};

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

/// What the caller asks to run.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// Host directory bound read-write at `/workspace`; `None` gives a
    /// fresh tmpfs that disappears with the sandbox.
    pub workdir: Option<PathBuf>,
    /// Extra read-only binds.
    pub read_only: Vec<MountSpec>,
    /// Extra read-write binds.
    pub read_write: Vec<MountSpec>,
    /// Extra environment.
    pub env: EnvRequest,
    /// Run without namespaces (reduced mode): Landlock, seccomp, rlimits,
    /// the environment scrub and output bounds only. Needs `workdir`.
    pub without_namespaces: bool,
    /// `workdir` is corral's own scratch directory (a service workspace)
    /// that no host tool runs anything from: the profile's `protect` list
    /// is not applied to it (it still is to `read_write` binds).
    pub scratch_workdir: bool,
}

/// The identity the program runs as, decided by who runs corral: corral's
/// own uid and gid when unprivileged, the profile's unprivileged identity
/// when root.
pub fn sandbox_identity(profile: &Profile) -> SandboxIdentity {
    let (_, euid) = corral_sys::process::uids();
    if euid == 0 {
        SandboxIdentity {
            uid: profile.identity.uid,
            gid: profile.identity.gid,
            drop_from_root: true,
        }
    } else {
        SandboxIdentity {
            uid: euid,
            gid: corral_sys::process::getegid(),
            drop_from_root: false,
        }
    }
}

/// `RLIMIT_SIGPENDING` of every program: signals queued at once to the
/// sandbox's processes (real-time ones, and `sigqueue(3)`'s).
///
/// The kernel counts queued signals per user in each user namespace up
/// the chain, and at the host's level every sandbox root starts is the
/// same user (65534, the owner of each sandbox's user namespace), held
/// to one limit (about 96k here). Unbounded, one sandbox could queue them
/// all and every other sandbox's `sigqueue` would fail with EAGAIN (found
/// by a review's attack pass). A program rarely has more than a handful
/// queued; 1024 per sandbox leaves the shared budget to 90 sandboxes at
/// once. Standard signals sent by `kill(2)` are queued whatever this limit
/// (at most one per signal and process) and still counted: many blocked
/// processes in several sandboxes can fill the budget all the same, which
/// only distinct host uids per sandbox would prevent (docs/SECURITY.md).
pub const PENDING_SIGNALS: u64 = 1024;

/// The rlimits a profile asks for, each clamped to the hard limit corral
/// itself inherited (raising one needs CAP_SYS_RESOURCE in the initial user
/// namespace, which the sandbox never has), so the result reports what the
/// program really gets. Core dumps are always off: a dump can hold secrets
/// and fill the disk. Queued signals are always
/// bounded ([`PENDING_SIGNALS`]).
pub fn rlimits(limits: &corral_policy::Limits) -> Vec<Rlimit> {
    let clamp = |kind: RlimitKind, soft: u64, hard: u64| {
        let inherited = corral_sys::process::get_rlimit(rlimit_resource(kind))
            .map(|(_, h)| h)
            .unwrap_or(u64::MAX);
        Rlimit {
            kind,
            soft: soft.min(inherited),
            hard: hard.min(inherited),
        }
    };
    let mut out = vec![
        clamp(RlimitKind::Core, 0, 0),
        clamp(RlimitKind::OpenFiles, limits.open_files, limits.open_files),
        clamp(RlimitKind::PendingSignals, PENDING_SIGNALS, PENDING_SIGNALS),
    ];
    if let Some(v) = limits.address_space_bytes {
        out.push(clamp(RlimitKind::AddressSpace, v.bytes(), v.bytes()));
    }
    if let Some(v) = limits.file_size_bytes {
        out.push(clamp(RlimitKind::FileSize, v.bytes(), v.bytes()));
    }
    if let Some(v) = limits.processes {
        out.push(clamp(RlimitKind::Processes, v, v));
    }
    if let Some(v) = limits.cpu_time_secs {
        // SIGXCPU at the soft limit lets the program notice; SIGKILL one
        // second later (setrlimit(2)).
        out.push(clamp(RlimitKind::CpuTime, v, v + 1));
    }
    out
}

/// The variables that point clients at corral's proxy, both cases (curl,
/// pip, npm, uv and git read one or the other).
pub fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PROXY_PORT}");
    let mut out = Vec::new();
    for (name, value) in [
        ("HTTP_PROXY", http.as_str()),
        ("HTTPS_PROXY", http.as_str()),
        ("ALL_PROXY", socks.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1,::1"),
    ] {
        out.push((name.to_string(), value.to_string()));
        out.push((name.to_ascii_lowercase(), value.to_string()));
    }
    out
}

/// Landlock rules mirroring the mounts: read (and execute) where the mount
/// is read-only, everything where it is writable, devices in `/dev`, and a
/// listing of `/`. Anything else, a path a mount mistake might expose
/// included, stays out of reach.
pub fn landlock_plan(profile: &Profile, mounts: &[MountOp]) -> LandlockPlan {
    let mut plan = LandlockPlan {
        required: profile.security.landlock == LandlockMode::Required,
        require_full: false,
        list: vec!["/".into()],
        read: vec!["/etc".into(), "/proc".into()],
        write: vec!["/tmp".into(), "/dev/shm".into()],
        devices: vec!["/dev".into()],
        tcp_bind: profile.security.tcp_bind.clone(),
        tcp_connect: profile.security.tcp_connect.clone(),
        // The host's network is the point of mode `host`.
        restrict_tcp: profile.network.mode != NetworkMode::Host,
        execute_only: None,
    };
    if profile.network.mode == NetworkMode::Allow {
        plan.tcp_connect.extend([HTTP_PROXY_PORT, SOCKS_PROXY_PORT]);
    }
    for op in mounts {
        match op {
            MountOp::Bind {
                dest,
                writable: true,
                ..
            }
            | MountOp::Tmpfs { dest, .. } => plan.write.push(dest.to_string()),
            MountOp::Bind { dest, .. } => plan.read.push(dest.to_string()),
            // Inside a writable bind, whose rule already covers them; the
            // mount makes the read-only ones read-only.
            MountOp::Protect { .. } | MountOp::Symlink { .. } => {}
        }
    }
    plan
}

/// `commands.restrict_exec`: the files the program may execute are the
/// allowed commands as resolved and the program itself (the helper adds
/// their interpreters inside the sandbox); Landlock becomes required, as
/// nothing else could enforce this. None of them may lie where the
/// sandbox can write: the program could replace it with anything and run
/// that under the allowed name (the full sandbox mounts those places
/// `noexec` as well, see the helper's rootfs).
///
/// `mounts` are the full sandbox's; `None` is reduced mode, which cannot
/// mount its workdir `noexec` and so cannot hold `restrict_exec` at all:
/// refused there. A read-only bind whose host source overlaps a writable
/// one's (a runtime tree inside the workdir, a workdir below a system
/// tree) would show files the sandbox can change at a path where they run:
/// refused too.
fn restrict_exec(
    profile: &Profile,
    commands: &CommandTable,
    exec_path: &str,
    mut plan: LandlockPlan,
    mounts: Option<&[MountOp]>,
) -> Result<LandlockPlan, PlanError> {
    if !profile.commands.restrict_exec {
        return Ok(plan);
    }
    let refuse = |why: String| {
        Err(PlanError::Security(format!(
            "commands.restrict_exec: {why}; or turn restrict_exec off in a profile that extends this one"
        )))
    };
    let Some(mounts) = mounts else {
        return refuse(
            "it cannot be enforced without namespaces (a file the program writes in its workdir could be \
             run through the dynamic loader, as nothing can mount the workdir noexec); run with namespaces"
                .into(),
        );
    };
    let sources = |writable: bool| {
        mounts.iter().filter_map(move |op| match op {
            MountOp::Bind {
                source,
                writable: w,
                ..
            } if *w == writable => Some(std::path::Path::new(source.as_str())),
            _ => None,
        })
    };
    for w in sources(true) {
        if let Some(r) = sources(false).find(|r| r.starts_with(w) || w.starts_with(r)) {
            return refuse(format!(
                "the read-only bind of {} and the writable bind of {} share files, which the sandbox could \
                 change through the one and run through the other; keep a runtime tree or program out of \
                 the directories the sandbox may write (e.g. --runtime /opt/srv/.venv --workdir /var/lib/srv)",
                r.display(),
                w.display()
            ));
        }
    }
    let mut files: Vec<String> = commands
        .entries()
        .values()
        .filter_map(|r| match r {
            Resolution::Found(path) => Some(path.clone()),
            Resolution::Missing(_) => None,
        })
        .collect();
    files.push(exec_path.to_string());
    files.sort();
    files.dedup();
    for file in &files {
        if let Some(dir) = plan.write.iter().find(|d| is_at_or_below(file, d)) {
            return refuse(format!(
                "{file} may be executed, but it lies in {dir}, which the sandbox can write (it could \
                 replace the file and run anything under that name); put it in a read-only bind \
                 (--ro SRC:DEST)"
            ));
        }
    }
    plan.required = true;
    plan.execute_only = Some(files);
    Ok(plan)
}

/// The program's seccomp filters for `profile`: the profile's own, with
/// reduced mode's and `commands.restrict_exec`'s before it.
fn program_filters(
    profile: &Profile,
    reduced: bool,
) -> Result<corral_helper::CompiledFilters, PlanError> {
    let (seccomp, unix) = (profile.security.seccomp, profile.security.unix_sockets);
    let filters = if reduced {
        crate::seccomp::compile_reduced(seccomp, unix)
    } else {
        crate::seccomp::compile(seccomp, unix)
    };
    filters
        .and_then(|f| crate::seccomp::restrict_exec(f, profile.commands.restrict_exec))
        .map_err(|e| PlanError::Security(e.to_string()))
}

/// Why a run was refused before anything started.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The command was refused by the profile.
    #[error("{rejection}")]
    Rejected {
        /// The reason.
        rejection: CommandRejection,
        /// The audit event recording it.
        event: Box<AuditEvent>,
    },
    /// The command is allowed but not installed where the sandbox sees it.
    #[error("command `{command}` is allowed but was not found in the sandbox's search path ({searched})")]
    NotFound {
        /// The name.
        command: String,
        /// Directories searched.
        searched: String,
        /// The audit event recording it.
        event: Box<AuditEvent>,
    },
    /// An environment entry is malformed.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// A mount request is unusable.
    #[error("{0}")]
    Mount(String),
    /// A bind source passes through a symlink.
    #[error(
        "cannot bind {path}: {link} is a symlink (to {target}). corral binds only paths without symlinks, \
         so that a link a sandbox planted in a directory it could write cannot redirect a later bind; \
         give the path the link points to, if that is the directory you mean"
    )]
    Symlink {
        /// The source as given.
        path: String,
        /// The component that is a link.
        link: String,
        /// Where it points.
        target: String,
    },
    /// A protected entry of a writable bind is a symlink.
    #[error(
        "cannot protect {entry} in a writable bind: {link} is a symlink (to {target}). A protected entry \
         must not be a link (a sandbox may have planted it): remove the link, or turn protection off with \
         `--no-protect` or `protect = []` in the profile's [filesystem]"
    )]
    ProtectedSymlink {
        /// The protect entry.
        entry: String,
        /// The host path that is a link.
        link: String,
        /// Where it points.
        target: String,
    },
    /// A security layer could not be prepared.
    #[error("{0}")]
    Security(String),
}

impl PlanError {
    /// The process exit status this error maps to.
    pub fn exit_code(&self) -> i32 {
        match self {
            PlanError::NotFound { .. } => crate::EXIT_NOT_FOUND,
            _ => crate::EXIT_CORRAL_ERROR,
        }
    }

    /// The audit event, for refusals.
    pub fn event(&self) -> Option<&AuditEvent> {
        match self {
            PlanError::Rejected { event, .. } | PlanError::NotFound { event, .. } => Some(event),
            _ => None,
        }
    }

    /// A stable code for JSON error objects.
    pub fn code(&self) -> &'static str {
        match self {
            PlanError::Rejected { event, .. } | PlanError::NotFound { event, .. } => {
                event.code.as_str()
            }
            PlanError::Env(_) => "env.invalid",
            PlanError::Mount(_) => "mount.invalid",
            PlanError::Symlink { .. } => "mount.symlink",
            PlanError::ProtectedSymlink { .. } => "mount.protect_symlink",
            PlanError::Security(_) => "security.invalid",
        }
    }
}

/// Builds the plan. Returns it with the audit events of the decisions taken
/// (stripped variables).
pub fn build_plan(
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    identity: SandboxIdentity,
    lookup_env: &dyn Fn(&str) -> Option<String>,
) -> Result<(SandboxPlan, Vec<AuditEvent>), PlanError> {
    let (exec_path, env, events) = program_basics(profile, commands, request, lookup_env)?;
    if profile.security.seccomp == SeccompProfile::Strict
        && profile.network.mode != NetworkMode::None
    {
        return Err(PlanError::Security(
            "the strict seccomp profile allows only AF_UNIX sockets, so the program could never use the network: \
             use the default seccomp profile with network modes allow or host"
                .into(),
        ));
    }
    if request.without_namespaces && profile.network.mode != NetworkMode::None {
        return Err(PlanError::Security(
            "network modes other than `none` need namespaces (the proxy lives in the sandbox's own network namespace)".into(),
        ));
    }
    if request.without_namespaces {
        let plan = reduced_plan(profile, commands, request, identity, exec_path, env)?;
        return Ok((plan, events));
    }
    let mounts = plan_mounts(profile, request, identity)?;
    let landlock = landlock_for(profile, commands, &exec_path, &mounts)?;
    let program = program_of(profile, request, exec_path, env)?;
    let mut plan = SandboxPlan {
        parent_pid: corral_sys::process::getpid(),
        identity,
        hostname: profile.hostname.clone(),
        tmp_size: profile.filesystem.tmp_size.bytes(),
        dev_pts: profile.filesystem.dev_pts,
        mounts,
        deny: profile.filesystem.deny.clone(),
        files: generated_files(&profile.hostname, identity, host_resolv_conf(profile)),
        // The program part is set just below.
        cwd: program.cwd.clone(),
        exec_path: String::new(),
        argv: Vec::new(),
        env: Vec::new(),
        rlimits: Vec::new(),
        security: SecurityPlan {
            seccomp_profile: profile.security.seccomp,
            filters: program_filters(profile, false)?,
            init_filters: crate::seccomp::compile_init()
                .map_err(|e| PlanError::Security(e.to_string()))?,
            landlock,
        },
        reduced: None,
        network: profile.network.mode,
        hold: false,
        cgroup_join: Vec::new(),
    };
    plan.set_program(program);
    Ok((plan, events))
}

/// The program part of the plan [`build_plan`] would make for `request`,
/// made for `held`, the plan of a sandbox built ahead for the same
/// profile, identity and sandbox inputs ([`SandboxInputs`]): the command
/// checked and resolved, the environment, rlimits, with its events.
/// [`with_program`] puts it into `held` (the sandbox part stays `held`'s:
/// the host filesystem as it was when that sandbox was built, which is
/// what the sandbox holds anyway). `None` when the run must plan its
/// sandbox too (the caller then builds the whole plan): when
/// [`plans_only_the_program`] says paths a run can write shape it, or when
/// the program changes it after all (under `commands.restrict_exec` an
/// executable outside the allowed commands changes the Landlock rules).
pub(crate) fn program_for_held(
    held: &SandboxPlan,
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    lookup_env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(ProgramPlan, Vec<AuditEvent>)>, PlanError> {
    if held.reduced.is_some() || !plans_only_the_program(profile, request) {
        return Ok(None);
    }
    let (exec_path, env, events) = program_basics(profile, commands, request, lookup_env)?;
    if profile.commands.restrict_exec
        && landlock_for(profile, commands, &exec_path, &held.mounts)? != held.security.landlock
    {
        return Ok(None);
    }
    Ok(Some((
        program_of(profile, request, exec_path, env)?,
        events,
    )))
}

/// `held`, the plan of the sandbox built ahead that a run takes, with the
/// run's `program` ([`program_for_held`]) in place of its own: the plan
/// [`build_plan`] would make for the run. Takes the plan rather than copy
/// it (its mounts, seccomp programs and Landlock rules), on every
/// execution's path.
pub(crate) fn with_program(mut held: SandboxPlan, program: ProgramPlan) -> SandboxPlan {
    held.set_program(program);
    held.hold = false;
    held.cgroup_join.clear();
    held
}

/// Whether a run may take its sandbox part from a sandbox built ahead
/// ([`plan_from_held`]) rather than plan it now. Not when the profile
/// denies paths or the run has writable binds: then the sandbox part
/// depends on what exists in paths a run can write (the pins of denied
/// paths inside the workspace or a writable bind, the protected entries
/// of a writable bind), which may have changed since the sandbox was
/// built, by its own input files among others. Such a run plans
/// everything and uses the held sandbox only when the plans match.
fn plans_only_the_program(profile: &Profile, request: &RunRequest) -> bool {
    profile.filesystem.deny.is_empty()
        && profile.filesystem.read_write.is_empty()
        && request.read_write.is_empty()
}

/// What of a request and its profile shapes the sandbox (as opposed to
/// the program run in it): a sandbox built ahead from equal inputs is the
/// sandbox [`build_plan`] would plan now, the host filesystem aside.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SandboxInputs {
    profile: Profile,
    identity: SandboxIdentity,
    workdir: Option<PathBuf>,
    read_only: Vec<MountSpec>,
    read_write: Vec<MountSpec>,
    without_namespaces: bool,
    scratch_workdir: bool,
}

impl SandboxInputs {
    /// The inputs of `request` under `profile`.
    pub(crate) fn of(profile: &Profile, identity: SandboxIdentity, request: &RunRequest) -> Self {
        SandboxInputs {
            profile: profile.clone(),
            identity,
            workdir: request.workdir.clone(),
            read_only: request.read_only.clone(),
            read_write: request.read_write.clone(),
            without_namespaces: request.without_namespaces,
            scratch_workdir: request.scratch_workdir,
        }
    }

    /// Whether `request` under `profile` has these inputs (compared in
    /// place, without a copy).
    pub(crate) fn matches(
        &self,
        profile: &Profile,
        identity: SandboxIdentity,
        request: &RunRequest,
    ) -> bool {
        let RunRequest {
            workdir,
            read_only,
            read_write,
            without_namespaces,
            scratch_workdir,
            // The program's.
            argv: _,
            env: _,
        } = request;
        self.identity == identity
            && self.workdir == *workdir
            && self.read_only == *read_only
            && self.read_write == *read_write
            && self.without_namespaces == *without_namespaces
            && self.scratch_workdir == *scratch_workdir
            && self.profile == *profile
    }
}

/// The command checked against the profile and resolved, and the
/// environment (the proxy's variables set last in network mode `allow`),
/// with the events of the environment's decisions.
fn program_basics(
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    lookup_env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, env::EnvVars, Vec<AuditEvent>), PlanError> {
    let exec_path = match commands::check(&profile.commands, &profile.name, &request.argv) {
        Ok(CommandDecision::Path(path)) => path.to_string(),
        Ok(CommandDecision::Named(name)) => match commands.get(&name) {
            Some(Resolution::Found(path)) => path.clone(),
            other => {
                let searched = match other {
                    Some(Resolution::Missing(dirs)) => dirs.join(", "),
                    _ => String::from("(not resolved for this profile)"),
                };
                let event = AuditEvent::new(
                    Level::Error,
                    ReasonCode::CommandNotFound,
                    format!("command `{name}` not found in {searched}"),
                )
                .with("command", name.as_str());
                return Err(PlanError::NotFound {
                    command: name,
                    searched,
                    event: Box::new(event),
                });
            }
        },
        Err(rejection) => {
            let event = Box::new(rejection.audit_event(&request.argv));
            return Err(PlanError::Rejected { rejection, event });
        }
    };
    let (mut env, events) = env::build(&profile.env, &request.env, lookup_env)?;
    if profile.network.mode == NetworkMode::Allow {
        // Set last: a request cannot point clients elsewhere.
        env.retain(|(k, _)| !proxy_env().iter().any(|(p, _)| p == k));
        env.extend(proxy_env());
        env.sort();
    }
    Ok((exec_path, env, events))
}

/// The program part of a plan with namespaces: run in the workspace.
fn program_of(
    profile: &Profile,
    request: &RunRequest,
    exec_path: String,
    env: env::EnvVars,
) -> Result<ProgramPlan, PlanError> {
    Ok(ProgramPlan {
        cwd: SandboxPath::new(WORKSPACE).map_err(|e| PlanError::Mount(e.to_string()))?,
        exec_path,
        argv: request.argv.clone(),
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        rlimits: rlimits(&profile.limits),
    })
}

/// The Landlock rules of a plan with namespaces and `mounts`.
fn landlock_for(
    profile: &Profile,
    commands: &CommandTable,
    exec_path: &str,
    mounts: &[MountOp],
) -> Result<LandlockPlan, PlanError> {
    restrict_exec(
        profile,
        commands,
        exec_path,
        landlock_plan(profile, mounts),
        Some(mounts),
    )
}

/// The plan for reduced mode: the host filesystem seen through Landlock
/// only (read/execute on the system paths and read-only binds, everything
/// on the workdir and read-write binds, the five harmless devices), a
/// seccomp filter that also refuses network sockets and SysV IPC (there is
/// no network or IPC namespace), and the workdir as home and temp dir.
fn reduced_plan(
    profile: &Profile,
    commands: &CommandTable,
    request: &RunRequest,
    identity: SandboxIdentity,
    exec_path: String,
    env: env::EnvVars,
) -> Result<SandboxPlan, PlanError> {
    let workdir = request.workdir.as_ref().ok_or_else(|| {
        PlanError::Mount(
            "running without namespaces needs a host workdir (there is no tmpfs workspace)".into(),
        )
    })?;
    let workdir = std::fs::canonicalize(workdir)
        .map_err(|e| PlanError::Mount(format!("workdir {}: {e}", workdir.display())))?;
    if !workdir.is_dir() {
        return Err(PlanError::Mount(format!(
            "workdir {} is not a directory",
            workdir.display()
        )));
    }
    let writable_bind = !request.scratch_workdir
        || profile.filesystem.read_write.len() + request.read_write.len() > 0;
    if let (Some(entry), true) = (profile.filesystem.protect.first(), writable_bind) {
        return Err(PlanError::Mount(format!(
            "filesystem.protect ({entry}, ...) needs mount namespaces: Landlock only grants, so reduced mode \
             cannot keep an entry of the writable workdir read-only; run with namespaces, or turn protection \
             off with `--no-protect` (or `protect = []` in the profile's [filesystem])"
        )));
    }
    if let Some(d) = profile.filesystem.deny.first() {
        return Err(PlanError::Mount(format!(
            "filesystem.deny ({d}) needs mount namespaces: Landlock only grants, so reduced mode cannot hide a path \
             inside an allowed tree; remove the deny rules or run with namespaces"
        )));
    }
    let workdir = workdir
        .to_str()
        .ok_or_else(|| PlanError::Mount("workdir is not UTF-8".into()))?
        .to_string();
    let explicit = explicit_mounts(profile, request);
    let mut landlock = LandlockPlan {
        required: true,
        require_full: true,
        devices: ["null", "zero", "full", "random", "urandom"]
            .iter()
            .map(|d| format!("/dev/{d}"))
            .collect(),
        write: vec![workdir.clone()],
        tcp_bind: profile.security.tcp_bind.clone(),
        tcp_connect: profile.security.tcp_connect.clone(),
        restrict_tcp: true,
        ..Default::default()
    };
    landlock.read = profile
        .filesystem
        .system
        .iter()
        .map(|p| p.to_string())
        .collect();
    for (m, writable) in explicit {
        if m.source != m.dest {
            return Err(PlanError::Mount(format!(
                "{m}: showing a host path at another place needs namespaces; without them use PATH only"
            )));
        }
        if writable {
            landlock.write.push(m.source.to_string());
        } else {
            landlock.read.push(m.source.to_string());
        }
    }
    let landlock = restrict_exec(profile, commands, &exec_path, landlock, None)?;
    let mut env: std::collections::BTreeMap<String, String> = env.into_iter().collect();
    env.insert("HOME".into(), workdir.clone());
    env.insert("TMPDIR".into(), workdir.clone());
    Ok(SandboxPlan {
        parent_pid: corral_sys::process::getpid(),
        identity,
        hostname: profile.hostname.clone(),
        tmp_size: 0,
        dev_pts: false,
        mounts: Vec::new(),
        deny: Vec::new(),
        files: Vec::new(),
        cwd: SandboxPath::new(&workdir).map_err(|e| PlanError::Mount(e.to_string()))?,
        exec_path,
        argv: request.argv.clone(),
        env: env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        rlimits: rlimits(&profile.limits),
        security: SecurityPlan {
            seccomp_profile: profile.security.seccomp,
            filters: program_filters(profile, true)?,
            // No init in reduced mode: the helper supervises on the host.
            init_filters: corral_helper::CompiledFilters::default(),
            landlock,
        },
        reduced: Some(ReducedPlan { workdir }),
        network: NetworkMode::None,
        hold: false,
        cgroup_join: Vec::new(),
    })
}

/// The profile's and the request's binds, each with whether it is
/// writable.
fn explicit_mounts<'a>(
    profile: &'a Profile,
    request: &'a RunRequest,
) -> Vec<(&'a MountSpec, bool)> {
    let fs = &profile.filesystem;
    let ro = fs
        .read_only
        .iter()
        .chain(&request.read_only)
        .map(|m| (m, false));
    let rw = fs
        .read_write
        .iter()
        .chain(&request.read_write)
        .map(|m| (m, true));
    ro.chain(rw).collect()
}

/// Orders the filesystem steps: system paths (symlinks recreated, missing
/// ones skipped), then the profile's and the request's binds, then the
/// workspace; parents always before children.
fn plan_mounts(
    profile: &Profile,
    request: &RunRequest,
    identity: SandboxIdentity,
) -> Result<Vec<MountOp>, PlanError> {
    let mut ops = Vec::new();
    for path in &profile.filesystem.system {
        match std::fs::symlink_metadata(path.as_path()) {
            Err(_) => continue,
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(path.as_path())
                    .map_err(|e| PlanError::Mount(format!("cannot read symlink {path}: {e}")))?;
                let target = target
                    .to_str()
                    .ok_or_else(|| {
                        PlanError::Mount(format!("symlink {path} has a non-UTF-8 target"))
                    })?
                    .to_string();
                ops.push(MountOp::Symlink {
                    target,
                    dest: path.clone(),
                });
            }
            // The host's own system trees: symlinks in them are the
            // administrator's and resolve inside the host root.
            Ok(_) => ops.push(MountOp::Bind {
                source: path.to_string(),
                dest: path.clone(),
                writable: false,
                idmap_from: None,
                no_symlinks: false,
            }),
        }
    }
    let explicit = explicit_mounts(profile, request);
    for (spec, writable) in explicit {
        if let Some(why) = reserved_destination(&spec.dest) {
            let name = spec
                .dest
                .as_path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("data");
            let hint = if profile.filesystem.runtime.as_ref() == Some(&spec.dest) {
                "a runtime tree is bound at its own path (its scripts name it): create it elsewhere, e.g. under /opt"
                    .to_string()
            } else {
                format!(
                    "show it at another place with SRC:DEST, e.g. `{}`",
                    corral_policy::shell::word(&format!("{}:/opt/{name}", spec.source))
                )
            };
            return Err(PlanError::Mount(format!(
                "cannot mount {spec}: {why}; {hint}"
            )));
        }
        if let Some(other) = ops.iter().find(|op| op.dest() == &spec.dest) {
            if !matches!(other, MountOp::Bind { source, .. } if profile.filesystem.system.iter().any(|s| s.as_str() == source))
            {
                return Err(PlanError::Mount(format!(
                    "{} is mounted twice; mount each destination once",
                    spec.dest
                )));
            }
            // An explicit bind replaces the system bind of the same path.
            ops.retain(|op| op.dest() != &spec.dest);
        }
        refuse_symlinks(spec.source.as_path())?;
        let meta = std::fs::metadata(spec.source.as_path()).map_err(|e| {
            PlanError::Mount(format!(
                "cannot mount {spec}: {} does not exist or is unreadable ({e})",
                spec.source
            ))
        })?;
        ops.push(MountOp::Bind {
            source: spec.source.to_string(),
            dest: spec.dest.clone(),
            writable,
            idmap_from: if writable {
                idmap_owner(identity, spec.source.as_path(), &meta)?
            } else {
                None
            },
            no_symlinks: true,
        });
    }
    let workspace = SandboxPath::new(WORKSPACE).map_err(|e| PlanError::Mount(e.to_string()))?;
    match &request.workdir {
        Some(dir) => {
            let canonical = std::path::absolute(dir)
                .map_err(|e| PlanError::Mount(format!("workdir {}: {e}", dir.display())))?;
            refuse_symlinks(&canonical)?;
            if !canonical.is_dir() {
                return Err(PlanError::Mount(format!(
                    "workdir {} is not a directory",
                    dir.display()
                )));
            }
            let source = canonical
                .to_str()
                .ok_or_else(|| PlanError::Mount(format!("workdir {} is not UTF-8", dir.display())))?
                .to_string();
            let meta = std::fs::metadata(&canonical)
                .map_err(|e| PlanError::Mount(format!("workdir {}: {e}", dir.display())))?;
            let idmap_from = idmap_owner(identity, &canonical, &meta)?;
            ops.push(MountOp::Bind {
                source,
                dest: workspace,
                writable: true,
                idmap_from,
                no_symlinks: true,
            });
        }
        None => ops.push(MountOp::Tmpfs {
            dest: workspace,
            size: profile.filesystem.workspace_size.bytes(),
            mode: 0o755,
        }),
    }
    let protected = protect_steps(profile, request, &ops)?;
    let pins = deny_pins(profile, &ops, &protected)?;
    ops.extend(protected);
    ops.extend(pins);
    // Parents first: a bind at /a must not land on top of one at /a/b.
    ops.sort_by_key(|op| op.dest().as_str().matches('/').count());
    Ok(ops)
}

/// The writable binds the caller asked for (the workdir, `--rw`, profile
/// `read_write`): (host source, sandbox destination).
fn caller_writable_binds(ops: &[MountOp]) -> impl Iterator<Item = (&str, &SandboxPath)> {
    ops.iter().filter_map(|op| match op {
        MountOp::Bind {
            source,
            dest,
            writable: true,
            no_symlinks: true,
            ..
        } => Some((source.as_str(), dest)),
        _ => None,
    })
}

/// Whether `path`, inside the bind at `root`, lies in another bind of
/// `ops` nested below `root`: that bind decides what happens there.
fn in_nested_bind(ops: &[MountOp], root: &SandboxPath, path: &SandboxPath) -> bool {
    ops.iter().any(|other| {
        other.dest() != root && other.dest().starts_with(root) && path.starts_with(other.dest())
    })
}

/// The [`MountOp::Protect`] steps for every writable bind of the caller's
/// (the workdir unless it is corral's scratch directory), leaving out
/// entries another bind covers: that bind decides what the sandbox may do
/// there.
fn protect_steps(
    profile: &Profile,
    request: &RunRequest,
    ops: &[MountOp],
) -> Result<Vec<MountOp>, PlanError> {
    let entries = &profile.filesystem.protect;
    let mut steps = Vec::new();
    if entries.is_empty() {
        return Ok(steps);
    }
    for (source, dest) in caller_writable_binds(ops) {
        if request.scratch_workdir && request.workdir.is_some() && dest.as_str() == WORKSPACE {
            continue;
        }
        let root = std::path::Path::new(source);
        // Reading /etc/passwd only matters when a `~/` entry is listed.
        let home = entries.iter().any(|e| e.home_only()) && crate::protect::is_home_directory(root);
        let planned = crate::protect::plan_protect(root, dest, entries, home)?;
        steps.extend(
            planned
                .into_iter()
                .filter(|s| !in_nested_bind(ops, dest, s.dest())),
        );
    }
    Ok(steps)
}

/// Pins (read-write [`MountOp::Protect`] self-binds) for every existing
/// directory between a writable bind of the caller's and a `deny` path
/// below it. A mount point cannot be renamed or removed (`EBUSY`), so the
/// sandbox cannot move a denied file's parent aside and create a new file
/// at the denied host path (the stand-in would move along, hiding the
/// secret, but the host path would then hold the sandbox's file). The walk
/// stops at a missing component or one that is not a plain directory (a
/// symlink there makes the helper refuse the deny anyway). Directories
/// `protected` already binds, or that lie below one of its read-only
/// entries or inside another bind, are left to those.
fn deny_pins(
    profile: &Profile,
    ops: &[MountOp],
    protected: &[MountOp],
) -> Result<Vec<MountOp>, PlanError> {
    let mut pins: Vec<MountOp> = Vec::new();
    for (source, dest) in caller_writable_binds(ops) {
        for denied in &profile.filesystem.deny {
            if denied == dest || !denied.starts_with(dest) {
                continue;
            }
            let rest = denied.as_str()[dest.as_str().trim_end_matches('/').len()..]
                .trim_start_matches('/')
                .to_string();
            let parts: Vec<&str> = rest.split('/').collect();
            let mut host = std::path::PathBuf::from(source);
            let mut at = dest.as_str().trim_end_matches('/').to_string();
            for part in &parts[..parts.len().saturating_sub(1)] {
                host.push(part);
                at.push('/');
                at.push_str(part);
                match std::fs::symlink_metadata(&host) {
                    Ok(meta) if meta.is_dir() => {}
                    _ => break,
                }
                let pin_dest =
                    SandboxPath::new(&at).map_err(|e| PlanError::Mount(e.to_string()))?;
                let inner_bind = in_nested_bind(ops, dest, &pin_dest);
                let handled = protected.iter().chain(pins.iter()).any(|p| {
                    p.dest() == &pin_dest
                        || matches!(p, MountOp::Protect { read_only: true, .. }
                            if pin_dest.starts_with(p.dest()))
                });
                if inner_bind {
                    break;
                }
                if handled {
                    continue;
                }
                let source = host
                    .to_str()
                    .ok_or_else(|| PlanError::Mount(format!("{} is not UTF-8", host.display())))?
                    .to_string();
                pins.push(MountOp::Protect {
                    source,
                    dest: pin_dest,
                    read_only: false,
                    dir: true,
                });
            }
        }
    }
    Ok(pins)
}

/// Refuses a bind source any component of which, the last included, is a
/// symlink, or which holds `.` or `..` (where `..` after a link would leave
/// the directory the caller named). A sandbox that can write a directory
/// can plant a link there that a later run's bind would pass through: to
/// another user's home as root, or to the caller's own files. The helper
/// opens the source with `RESOLVE_NO_SYMLINKS` as well, so a link planted
/// after this check is refused by the kernel.
pub(crate) fn refuse_symlinks(path: &std::path::Path) -> Result<(), PlanError> {
    use std::path::Component;
    let mut prefix = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => prefix.push("/"),
            Component::Normal(name) => {
                prefix.push(name);
                if let Ok(meta) = std::fs::symlink_metadata(&prefix) {
                    if meta.file_type().is_symlink() {
                        let target = std::fs::read_link(&prefix)
                            .map(|t| t.display().to_string())
                            .unwrap_or_else(|_| "?".into());
                        return Err(PlanError::Symlink {
                            path: path.display().to_string(),
                            link: prefix.display().to_string(),
                            target,
                        });
                    }
                }
            }
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(PlanError::Mount(format!(
                    "cannot bind {}: `.` and `..` are not allowed in a bind source; give the path without them",
                    path.display()
                )));
            }
        }
    }
    Ok(())
}

/// For a writable bind when corral runs as root (and the program as an
/// unprivileged uid): the on-disk owner to show as the program's identity
/// through an idmapped mount, so the invoking user's directory is writable
/// inside without chowning host files.
///
/// A directory owned by host root is refused: through the idmap, files the
/// program creates there would be owned by root on the host, and a
/// `chmod 4755` inside would plant a setuid-root binary outside.
fn idmap_owner(
    identity: SandboxIdentity,
    path: &std::path::Path,
    meta: &std::fs::Metadata,
) -> Result<Option<(u32, u32)>, PlanError> {
    let owner = (meta.uid(), meta.gid());
    if !identity.drop_from_root || owner == (identity.uid, identity.gid) {
        return Ok(None);
    }
    if owner.0 == 0 || owner.1 == 0 {
        let shown = path.display().to_string();
        let instead = if corral_policy::shell::is_system_path(path) {
            "; never change the owner of a system or top-level directory: bind it read-only (`--ro`), or \
             give the sandbox a directory of its own (a subdirectory owned by an unprivileged user)"
                .to_string()
        } else {
            format!(
                ", e.g. `chown {}:{} {}`",
                identity.uid,
                identity.gid,
                corral_policy::shell::word(&shown)
            )
        };
        return Err(PlanError::Mount(format!(
            "{shown} is owned by root (user or group) and would be writable by the sandbox: files it creates would be \
             root-owned on the host (a setuid- or setgid-root plant). Use a directory owned by an unprivileged user \
             and group (its files then stay theirs){instead}"
        )));
    }
    Ok(Some(owner))
}

/// Largest host `/etc/resolv.conf` copied into a `host`-mode sandbox.
const MAX_RESOLV_CONF: u64 = 64 * 1024;

/// The host's `/etc/resolv.conf` (symlinks followed: it is trusted host
/// configuration, often a link into /run) for network mode `host`, where
/// the program resolves names itself. The other modes get none: in `none`
/// there is nothing to ask and in `allow` the proxy resolves, so a
/// nameserver inside would only be a DNS-tunnelling channel. Missing or
/// unreadable means no resolver inside, as on a host without one.
fn host_resolv_conf(profile: &Profile) -> Option<String> {
    use std::io::Read;
    if profile.network.mode != NetworkMode::Host {
        return None;
    }
    let mut contents = String::new();
    std::fs::File::open("/etc/resolv.conf")
        .ok()?
        .take(MAX_RESOLV_CONF)
        .read_to_string(&mut contents)
        .ok()?;
    Some(contents)
}

/// `/etc/passwd`, `/etc/group`, `/etc/hosts` and `/etc/hostname` written by
/// corral: programs that look up their own user or `localhost` work, and
/// nothing of the host's account database leaks in. `resolv_conf` becomes
/// `/etc/resolv.conf` (network mode `host` only).
fn generated_files(
    hostname: &str,
    id: SandboxIdentity,
    resolv_conf: Option<String>,
) -> Vec<GeneratedFile> {
    let mut passwd = String::new();
    let mut group = String::new();
    if id.uid != 65534 {
        passwd.push_str(&format!(
            "sandbox:x:{}:{}:corral sandbox:{WORKSPACE}:/bin/sh\n",
            id.uid, id.gid
        ));
    }
    if id.gid != 65534 {
        group.push_str(&format!("sandbox:x:{}:\n", id.gid));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    let files = [
        ("/etc/passwd", passwd),
        ("/etc/group", group),
        ("/etc/hostname", format!("{hostname}\n")),
        (
            "/etc/hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
    ];
    files
        .into_iter()
        .chain(resolv_conf.map(|r| ("/etc/resolv.conf", r)))
        .filter_map(|(path, contents)| {
            SandboxPath::new(path)
                .ok()
                .map(|path| GeneratedFile { path, contents })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> SandboxIdentity {
        SandboxIdentity {
            uid: 1000,
            gid: 1000,
            drop_from_root: false,
        }
    }

    fn request(argv: &[&str]) -> RunRequest {
        RunRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn plan_for(
        profile: &Profile,
        req: &RunRequest,
    ) -> Result<(SandboxPlan, Vec<AuditEvent>), PlanError> {
        build_plan(
            profile,
            &CommandTable::resolve(profile, None),
            req,
            identity(),
            &|_| None,
        )
    }

    fn protected(plan: &SandboxPlan) -> Vec<String> {
        plan.mounts
            .iter()
            .filter(|op| matches!(op, MountOp::Protect { .. }))
            .map(|op| op.dest().to_string())
            .collect()
    }

    #[test]
    fn the_directories_above_a_denied_path_in_a_writable_bind_are_pinned() {
        let mut profile = corral_policy::builtin::code();
        profile.filesystem.protect = Vec::new();
        let work = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(work.path().join("a/b")).expect("mkdir");
        std::fs::write(work.path().join("a/b/secret"), "s").expect("write");
        std::os::unix::fs::symlink("a", work.path().join("link")).expect("symlink");
        profile.filesystem.deny = [
            "/workspace/a/b/secret",
            "/workspace/link/b/x",
            "/workspace/top",
        ]
        .iter()
        .map(|d| SandboxPath::new(d).expect("path"))
        .collect();
        let mut req = request(&["sh", "-c", "true"]);
        req.workdir = Some(work.path().to_path_buf());
        let (plan, _) = plan_for(&profile, &req).expect("plan");
        let pins: Vec<(String, bool)> = plan
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::Protect {
                    dest, read_only, ..
                } => Some((dest.to_string(), *read_only)),
                _ => None,
            })
            .collect();
        // Not the symlink (the helper refuses that deny), nothing for a
        // path directly in the root (the root is a mount point already).
        assert_eq!(
            pins,
            [
                ("/workspace/a".to_string(), false),
                ("/workspace/a/b".to_string(), false)
            ]
        );
        let bind = plan
            .mounts
            .iter()
            .position(|op| op.dest().as_str() == "/workspace")
            .expect("workspace bind");
        let first_pin = plan
            .mounts
            .iter()
            .position(|op| matches!(op, MountOp::Protect { .. }))
            .expect("pin");
        assert!(bind < first_pin);
    }

    #[test]
    fn protect_covers_the_workdir_and_rw_binds_but_not_a_scratch_workdir() {
        let profile = corral_policy::builtin::code();
        let work = tempfile::tempdir().expect("tempdir");
        let data = tempfile::tempdir().expect("tempdir");
        let config = tempfile::tempdir().expect("tempdir");
        let mut req = request(&["sh", "-c", "true"]);
        req.workdir = Some(work.path().to_path_buf());
        req.read_write = vec![
            MountSpec::parse(&format!("{}:/data", data.path().display()), None).expect("spec"),
        ];
        // A bind the caller placed on an entry decides for itself.
        req.read_only = vec![MountSpec::parse(
            &format!("{}:/workspace/.vscode", config.path().display()),
            None,
        )
        .expect("spec")];
        let (plan, _) = plan_for(&profile, &req).expect("plan");
        let got = protected(&plan);
        for want in [
            "/workspace/.git",
            "/workspace/.mcp.json",
            "/data/.git",
            "/data/.claude",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} in {got:?}");
        }
        assert!(!got.iter().any(|g| g == "/workspace/.vscode"), "{got:?}");
        // After every bind they sit in: parents first.
        let last_bind = plan
            .mounts
            .iter()
            .rposition(|op| matches!(op, MountOp::Bind { dest, .. } if dest.as_str() == "/workspace" || dest.as_str() == "/data"))
            .expect("binds");
        let first_protect = plan
            .mounts
            .iter()
            .position(|op| matches!(op, MountOp::Protect { .. }))
            .expect("protect");
        assert!(last_bind < first_protect);

        req.scratch_workdir = true;
        let (plan, _) = plan_for(&profile, &req).expect("plan");
        let got = protected(&plan);
        assert!(!got.iter().any(|g| g.starts_with("/workspace/")), "{got:?}");
        assert!(got.iter().any(|g| g == "/data/.git"), "{got:?}");
    }

    #[test]
    fn restrict_exec_lists_the_resolved_commands_and_requires_landlock() {
        let mut profile = corral_policy::builtin::code();
        profile.security.landlock = LandlockMode::BestEffort;
        let (plan, _) = plan_for(&profile, &request(&["sh", "-c", "true"])).expect("plan");
        assert_eq!(plan.security.landlock.execute_only, None);
        assert!(!plan.security.landlock.required);
        profile.commands.restrict_exec = true;
        let (plan, _) = plan_for(&profile, &request(&["sh", "-c", "true"])).expect("plan");
        let files = plan
            .security
            .landlock
            .execute_only
            .expect("an execute allowlist");
        assert!(files.contains(&plan.exec_path), "{files:?}");
        assert!(files.iter().any(|f| f.contains("python3")), "{files:?}");
        assert!(
            plan.security.landlock.required,
            "nothing else could enforce it"
        );
    }

    /// A fresh directory that may be bound at its own path (not under
    /// /tmp, which the sandbox reserves).
    fn bindable_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("corral-plan-")
            .tempdir_in("/var/tmp")
            .expect("tempdir")
    }

    #[test]
    fn restrict_exec_refuses_an_executable_the_sandbox_could_rewrite() {
        use std::os::unix::fs::PermissionsExt;
        let tools = bindable_dir();
        let tool = tools.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut profile = corral_policy::builtin::code();
        profile.commands.allow_paths = true;
        let dir = tools.path().display().to_string();
        let argv = [tool.to_str().expect("utf-8")];
        let mut req = request(&argv);
        req.read_only = vec![MountSpec::parse(&dir, None).expect("spec")];
        // Read-only: it stays what it is, with or without restrict_exec.
        profile.commands.restrict_exec = true;
        assert!(plan_for(&profile, &req).is_ok());
        // Writable: without restrict_exec anything may run anyway...
        req.read_only.clear();
        req.read_write = vec![MountSpec::parse(&dir, None).expect("spec")];
        profile.commands.restrict_exec = false;
        assert!(plan_for(&profile, &req).is_ok());
        // ...with it, the sandbox could put anything under the allowed name.
        profile.commands.restrict_exec = true;
        let err = plan_for(&profile, &req).expect_err("refused");
        assert_eq!(err.code(), "security.invalid");
        let message = err.to_string();
        assert!(
            message.contains(&format!("lies in {dir}")) && message.contains("--ro"),
            "{message}"
        );
    }

    #[test]
    fn restrict_exec_refuses_files_writable_through_another_bind_and_reduced_mode() {
        let work = bindable_dir();
        let tree = work.path().join("node_modules");
        std::fs::create_dir(&tree).expect("mkdir");
        let mut profile = corral_policy::builtin::code();
        profile.commands.restrict_exec = true;
        let mut req = request(&["sh", "-c", "true"]);
        req.workdir = Some(work.path().to_path_buf());
        assert!(plan_for(&profile, &req).is_ok());
        // The tree read-only at its own path, writable through the workdir.
        req.read_only = vec![MountSpec::parse(tree.to_str().expect("utf-8"), None).expect("spec")];
        let err = plan_for(&profile, &req).expect_err("refused");
        assert_eq!(err.code(), "security.invalid");
        assert!(err.to_string().contains("share files"), "{err}");
        // Without restrict_exec the same binds are fine.
        profile.commands.restrict_exec = false;
        assert!(plan_for(&profile, &req).is_ok());
        // Reduced mode cannot mount its workdir noexec (nor protect).
        profile.commands.restrict_exec = true;
        profile.filesystem.protect.clear();
        req.read_only.clear();
        req.without_namespaces = true;
        let err = plan_for(&profile, &req).expect_err("refused");
        assert_eq!(err.code(), "security.invalid", "{err}");
        assert!(err.to_string().contains("without namespaces"), "{err}");
    }

    /// `program_for_held` and `with_program` on a held plan (`hold` and a
    /// cgroup join set, as a prepared sandbox has them), to compare with
    /// `build_plan` for the run.
    fn from_held(
        profile: &Profile,
        template: &RunRequest,
        run: &RunRequest,
    ) -> Option<(SandboxPlan, Vec<AuditEvent>)> {
        let commands = CommandTable::resolve(profile, None);
        let (mut held, _) = plan_for(profile, template).expect("template plan");
        held.hold = true;
        held.cgroup_join = vec!["/sys/fs/cgroup/pids/corral/x/tasks".into()];
        let (program, events) =
            program_for_held(&held, profile, &commands, run, &|_| None).expect("program part")?;
        Some((with_program(held, program), events))
    }

    #[test]
    fn a_held_plan_with_the_runs_program_is_the_plan_built_for_the_run() {
        let template = request(&["python3", "-c", "pass"]);
        let mut with_env = request(&["sh", "-c", "echo $A"]);
        with_env.env.set = vec![("A".into(), "1".into()), ("LD_PRELOAD".into(), "x".into())];
        let runs = [
            request(&["python3", "-c", "print(1)"]),
            request(&["sh", "-c", "true"]),
            with_env,
        ];
        let code = corral_policy::builtin::code();
        let mut allow = code.clone();
        allow.network.mode = NetworkMode::Allow;
        let mut restricted = code.clone();
        restricted.commands.restrict_exec = true;
        for profile in [code, allow, restricted] {
            for run in &runs {
                let built = plan_for(&profile, run).expect("plan");
                let (plan, events) = from_held(&profile, &template, run).expect("held fits");
                assert_eq!(plan, built.0, "{:?} under {}", run.argv, profile.name);
                assert_eq!(events.len(), built.1.len(), "{:?}", run.argv);
            }
        }
    }

    #[test]
    fn a_held_plan_refuses_what_build_plan_refuses_and_leaves_other_landlock_rules() {
        let profile = corral_policy::builtin::code();
        let template = request(&["python3", "-c", "pass"]);
        let commands = CommandTable::resolve(&profile, None);
        let (held, _) = plan_for(&profile, &template).unwrap();
        let refused = program_for_held(&held, &profile, &commands, &request(&["perl"]), &|_| None);
        assert_eq!(refused.unwrap_err().code(), "command.not_allowed");
        // Under restrict_exec an executable outside the allowed commands
        // changes the Landlock rules: the held sandbox is not for it.
        let mut restricted = profile;
        restricted.commands.restrict_exec = true;
        restricted.commands.allow_paths = true;
        let outside = request(&["/usr/bin/env"]);
        assert!(from_held(&restricted, &template, &outside).is_none());
        assert!(from_held(&restricted, &template, &request(&["sh", "-c", "true"])).is_some());
    }

    #[test]
    fn what_a_run_writes_keeps_a_profile_with_deny_rules_off_the_held_plan() {
        // The default profile: nothing a run writes shapes its sandbox.
        let code = corral_policy::builtin::code();
        let work = tempfile::tempdir().expect("tempdir");
        let mut req = request(&["sh", "-c", "true"]);
        req.workdir = Some(work.path().to_path_buf());
        req.scratch_workdir = true;
        assert!(plans_only_the_program(&code, &req));
        // A denied path inside the workspace: the input files written
        // after the sandbox was built can create it, and the plan for
        // the run then pins its directory, which the held plan does not.
        let mut deny = code.clone();
        deny.filesystem.deny = vec![SandboxPath::new("/workspace/a/secret").expect("path")];
        assert!(!plans_only_the_program(&deny, &req));
        assert!(
            from_held(&deny, &req, &req).is_none(),
            "a held plan for a profile with deny rules"
        );
        let (held, _) = plan_for(&deny, &req).expect("held plan");
        std::fs::create_dir(work.path().join("a")).expect("mkdir");
        std::fs::write(work.path().join("a/secret"), "s").expect("input file");
        let (now, _) = plan_for(&deny, &req).expect("plan");
        assert!(!held.same_sandbox(&now), "the pin went unnoticed");
        // Writable binds: their protected entries and pins, likewise.
        let mut rw = code.clone();
        rw.filesystem.read_write = vec![MountSpec::parse("/tmp", None).expect("bind")];
        assert!(!plans_only_the_program(&rw, &req));
        let mut bound = req.clone();
        bound.read_write = rw.filesystem.read_write.clone();
        assert!(!plans_only_the_program(&code, &bound));
    }

    #[test]
    fn sandbox_inputs_ignore_the_program_and_notice_everything_else() {
        let profile = corral_policy::builtin::code();
        let base = RunRequest {
            workdir: Some(PathBuf::from("/tmp/ws")),
            scratch_workdir: true,
            ..request(&["python3"])
        };
        let inputs = SandboxInputs::of(&profile, identity(), &base);
        let mut other_program = request(&["sh", "-c", "true"]);
        other_program.env.set = vec![("A".into(), "1".into())];
        other_program.workdir = base.workdir.clone();
        other_program.scratch_workdir = true;
        assert!(inputs.matches(&profile, identity(), &other_program));
        let bind = MountSpec::parse("/srv", None).expect("a bind");
        let change = |i: usize| {
            let mut r = base.clone();
            match i {
                0 => r.workdir = Some(PathBuf::from("/tmp/other")),
                1 => r.workdir = None,
                2 => r.read_only.push(bind.clone()),
                3 => r.read_write.push(bind.clone()),
                4 => r.without_namespaces = true,
                _ => r.scratch_workdir = false,
            }
            r
        };
        for i in 0..6 {
            assert!(
                !inputs.matches(&profile, identity(), &change(i)),
                "change {i} went unnoticed"
            );
        }
        let mut root = identity();
        root.uid = 0;
        assert!(!inputs.matches(&profile, root, &base));
        let mut other_profile = profile.clone();
        other_profile.hostname = "other".into();
        assert!(!inputs.matches(&other_profile, identity(), &base));
    }

    #[test]
    fn plans_a_snippet() {
        let profile = corral_policy::builtin::code();
        let (plan, events) = plan_for(&profile, &request(&["sh", "-c", "echo hi"])).unwrap();
        assert!(events.is_empty());
        assert!(
            plan.exec_path.ends_with("sh")
                || plan.exec_path.contains("dash")
                || plan.exec_path.contains("bash")
        );
        assert_eq!(plan.argv[0], "sh");
        assert_eq!(plan.cwd.as_str(), "/workspace");
        assert!(plan.env.iter().any(|e| e == "HOME=/workspace"));
        // /usr is bound read-only, the workspace is a tmpfs, and parents
        // come before children.
        assert!(plan.mounts.iter().any(
            |m| matches!(m, MountOp::Bind { dest, writable: false, .. } if dest.as_str() == "/usr")
        ));
        assert!(
            matches!(plan.mounts.last(), Some(MountOp::Tmpfs { .. }))
                || plan.mounts.iter().any(
                    |m| matches!(m, MountOp::Tmpfs { dest, .. } if dest.as_str() == "/workspace")
                )
        );
        let depths: Vec<usize> = plan
            .mounts
            .iter()
            .map(|m| m.dest().as_str().matches('/').count())
            .collect();
        assert!(depths.windows(2).all(|w| w[0] <= w[1]));
        assert!(plan.files.iter().any(
            |f| f.path.as_str() == "/etc/passwd" && f.contents.contains("sandbox:x:1000:1000")
        ));
        assert!(!plan
            .mounts
            .iter()
            .any(|m| m.dest().as_str() == "/etc/shadow" || m.dest().as_str() == "/etc/passwd"));
    }

    #[test]
    fn refusals_carry_events_and_exit_codes() {
        let profile = corral_policy::builtin::code();
        let err = plan_for(&profile, &request(&["/bin/sh"])).unwrap_err();
        assert_eq!(err.exit_code(), 125);
        assert_eq!(err.event().unwrap().code, ReasonCode::CommandPathRejected);
        let err = plan_for(&profile, &request(&["perl"])).unwrap_err();
        assert_eq!(err.code(), "command.not_allowed");
        let mut missing = profile.clone();
        missing
            .commands
            .allow
            .push("definitely-not-installed-xyz".into());
        let err = plan_for(&missing, &request(&["definitely-not-installed-xyz"])).unwrap_err();
        assert_eq!(err.exit_code(), 127);
    }

    #[test]
    fn bad_mounts_are_refused() {
        let profile = corral_policy::builtin::code();
        let mut req = request(&["sh"]);
        req.read_only
            .push(MountSpec::parse("/usr:/proc/x", None).unwrap());
        assert!(matches!(plan_for(&profile, &req), Err(PlanError::Mount(_))));
        let mut req = request(&["sh"]);
        req.read_only
            .push(MountSpec::parse("/nonexistent-corral-path", None).unwrap());
        assert!(matches!(plan_for(&profile, &req), Err(PlanError::Mount(_))));
        let mut req = request(&["sh"]);
        req.read_only
            .push(MountSpec::parse("/usr/share:/data", None).unwrap());
        req.read_write
            .push(MountSpec::parse("/usr/lib:/data", None).unwrap());
        assert!(matches!(plan_for(&profile, &req), Err(PlanError::Mount(_))));
    }
}
