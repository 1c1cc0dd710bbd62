//! What every request shares: configuration, tenants with their quotas,
//! commands resolved once at start-up, the audit store, metrics.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use corral_policy::{Config, Tenant};
use tokio::sync::Semaphore;

use crate::audit::AuditStore;
use crate::error::ServerError;

/// A tenant and its execution slots.
pub struct TenantState {
    /// The configured tenant.
    pub tenant: Tenant,
    /// Its quota of concurrent executions.
    pub slots: Arc<Semaphore>,
    /// Its budget of answer bytes in flight (see `api::answers`).
    pub answers: Arc<Semaphore>,
    /// That budget's size in bytes (`server.tenant_answer_bytes`).
    pub answer_bytes: u64,
}

impl TenantState {
    /// A tenant with as many slots as its quota and `answer_bytes` of
    /// answers in flight.
    pub fn new(tenant: Tenant, answer_bytes: u64) -> TenantState {
        TenantState {
            slots: Arc::new(Semaphore::new(tenant.max_concurrent as usize)),
            answers: crate::api::answer_budget(answer_bytes),
            answer_bytes,
            tenant,
        }
    }
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    /// Executions accepted.
    pub started: AtomicU64,
    /// Executions finished (any outcome).
    pub finished: AtomicU64,
    /// Requests answered 429.
    pub busy: AtomicU64,
    /// Executions that timed out.
    pub timed_out: AtomicU64,
    /// Executions killed by the OOM killer.
    pub oom_killed: AtomicU64,
    /// Requests refused (4xx other than 429).
    pub refused: AtomicU64,
    /// Recorded executions by (tenant, profile, outcome), and their
    /// durations by profile: label sets bounded by the config (tenants and
    /// profiles) and five outcomes.
    pub by_label: std::sync::Mutex<Labelled>,
    /// MCP sessions open at `/mcp` (one handler each).
    pub mcp_sessions: AtomicU64,
}

/// Upper bounds (seconds) of the execution duration histogram.
pub const DURATION_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// Counters with labels.
#[derive(Default)]
pub struct Labelled {
    /// Executions by (tenant, profile, outcome).
    pub executions: std::collections::BTreeMap<(String, String, &'static str), u64>,
    /// Per profile: counts per bucket of [`DURATION_BUCKETS`] then +Inf,
    /// and the sum of seconds.
    pub durations: std::collections::BTreeMap<String, ([u64; DURATION_BUCKETS.len() + 1], f64)>,
    /// By where the execution came from (`http`, `mcp`): time from the
    /// request's acceptance to its execution slots, as `durations`.
    pub queue_waits:
        std::collections::BTreeMap<&'static str, ([u64; DURATION_BUCKETS.len() + 1], f64)>,
}

/// Counts `secs` into a histogram of [`DURATION_BUCKETS`].
fn observe(h: &mut ([u64; DURATION_BUCKETS.len() + 1], f64), secs: f64) {
    let i = DURATION_BUCKETS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(DURATION_BUCKETS.len());
    h.0[i] += 1;
    h.1 += secs;
}

impl Metrics {
    /// Counts one recorded execution.
    pub fn execution(&self, tenant: &str, profile: &str, outcome: &'static str, secs: f64) {
        let mut l = self.by_label.lock().unwrap_or_else(|p| p.into_inner());
        *l.executions
            .entry((tenant.to_string(), profile.to_string(), outcome))
            .or_default() += 1;
        observe(l.durations.entry(profile.to_string()).or_default(), secs);
    }

    /// Counts how long an execution from `via` (`http`, `mcp`) waited
    /// between its request's acceptance and its execution slots.
    pub fn queue_wait(&self, via: &'static str, waited: std::time::Duration) {
        let mut l = self.by_label.lock().unwrap_or_else(|p| p.into_inner());
        observe(l.queue_waits.entry(via).or_default(), waited.as_secs_f64());
    }
}

/// Shared server state.
pub struct AppState {
    /// Profiles and `[server]`.
    pub config: Config,
    /// Tenants (one anonymous tenant when none is configured).
    pub tenants: Vec<Arc<TenantState>>,
    /// Allowlisted commands of every profile, resolved once at start-up
    /// (a table the host holds back arrives later: see [`crate::host`]).
    pub commands: crate::host::CommandTables,
    /// Profiles whose plans were given up and still wait on the host.
    pub stalls: Arc<crate::host::Stalls>,
    /// Executions running at once, all tenants together.
    pub global: Arc<Semaphore>,
    /// Sandboxes in existence, answered or still being torn down, all
    /// tenants together (`max_concurrent` of them). An execution takes one
    /// (waiting, after its slot in `global`) before its sandbox starts and
    /// gives it back once the sandbox is gone: executions are answered
    /// before the teardown, and this keeps that from letting more
    /// sandboxes exist than the server allows.
    pub sandboxes: Arc<Semaphore>,
    /// The cancel flags of the executions in flight (weak: an ended
    /// execution's goes away with it), so that a server that stops kills
    /// them before it waits for their sandboxes ([`AppState::cancel_all`]).
    pub in_flight: std::sync::Mutex<Vec<std::sync::Weak<std::sync::atomic::AtomicBool>>>,
    /// Audit records.
    pub audit: Arc<AuditStore>,
    /// Audit events (refusals, the supervisor's decisions).
    pub events: crate::supervisor::Audit,
    /// Per-peer rate limit on recorded authentication refusals.
    pub refusals: crate::api::RefusalLimiter,
    /// Supervised MCP servers.
    pub supervisor: Arc<crate::supervisor::Supervisor>,
    /// Counters.
    pub metrics: Metrics,
    /// This server's own directory: `<work_dir>/corral-serve-<pid>`, so a
    /// later server can tell what a killed one left behind.
    pub work_dir: std::path::PathBuf,
    /// Where workspaces are made: [`WORKSPACES_DIR`] in `work_dir`, a
    /// tmpfs of the server's own when it has its own mount namespace (see
    /// [`crate::mounts::mount_workspace_base`]).
    pub workspaces: std::path::PathBuf,
    /// Whether `workspaces` is that tmpfs (detached before removal).
    workspaces_mounted: bool,
    anonymous: bool,
}

impl AppState {
    /// A new execution's cancel flag, known to [`AppState::cancel_all`].
    pub fn cancel_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Ok(mut flags) = self.in_flight.lock() {
            flags.retain(|f| f.strong_count() > 0);
            flags.push(Arc::downgrade(&flag));
        }
        flag
    }

    /// Kills every execution in flight (a stopping server): each ends as a
    /// cancelled one, is answered if its client is still there, and tears
    /// its sandbox down.
    pub fn cancel_all(&self) {
        let flags = match self.in_flight.lock() {
            Ok(flags) => flags.iter().filter_map(std::sync::Weak::upgrade).collect(),
            Err(_) => Vec::new(),
        };
        for flag in flags {
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Waits for room for one more sandbox (see [`AppState::sandboxes`]):
    /// only ever for an answered execution's teardown, milliseconds.
    pub async fn sandbox_permit(
        &self,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, crate::error::ApiError> {
        self.sandboxes
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| crate::error::ApiError::internal("the server is shutting down"))
    }

    /// Builds the state: resolves commands, opens the audit store, resolves
    /// the supervised servers (`config_file` is where `config` came from:
    /// their sandboxes read a private copy of it).
    pub fn new(
        config: Config,
        config_file: Option<&std::path::Path>,
    ) -> Result<AppState, ServerError> {
        let commands = crate::host::CommandTables::resolve(
            &config.profiles,
            std::env::var("PATH").ok(),
            crate::host::START_WAIT,
        );
        let s = &config.server;
        let anonymous = s.tenants.is_empty();
        let tenants: Vec<Tenant> = if anonymous {
            vec![Tenant {
                name: "anonymous".into(),
                token_sha256: String::new(),
                profiles: anonymous_profiles(&config),
                max_concurrent: s.max_concurrent,
            }]
        } else {
            s.tenants.clone()
        };
        let tenants: Vec<Arc<TenantState>> = tenants
            .into_iter()
            .map(|t| Arc::new(TenantState::new(t, s.tenant_answer_bytes)))
            .collect();
        let audit = AuditStore::open(&s.audit_db, s.audit_jsonl.as_deref(), s.retention_days)?;
        check_traversable(&s.work_dir)?;
        sweep_stale_work_dirs(&s.work_dir);
        let work_dir = s
            .work_dir
            .join(format!("corral-serve-{}", std::process::id()));
        create_own_dir(&work_dir)?;
        let workspaces = work_dir.join(WORKSPACES_DIR);
        create_own_dir(&workspaces)?;
        // Only the mount points' cost rides on it (each workspace is a
        // bounded tmpfs of its own either way): a failure is a warning.
        let workspaces_mounted = crate::mounts::mount_workspace_base(&workspaces)
            .unwrap_or_else(|e| {
                tracing::warn!(
                    path = %workspaces.display(),
                    error = %e,
                    "workspaces are mounted on directories of the host disk (mounting a tmpfs for them failed)"
                );
                false
            });
        let audit = Arc::new(audit);
        let snapshot = match config_file {
            Some(f) if !config.server.mcp_servers.is_empty() => {
                Some(snapshot_config(f, &work_dir, &config)?)
            }
            _ => None,
        };
        let tenant_names = tenants.iter().map(|t| t.tenant.name.clone()).collect();
        let events = crate::supervisor::Audit::start(audit.clone());
        let supervisor = Arc::new(crate::supervisor::Supervisor::new(
            &config,
            snapshot.as_deref(),
            events.clone(),
            &work_dir,
            tenant_names,
            anonymous,
        ));
        Ok(AppState {
            supervisor,
            events,
            refusals: crate::api::RefusalLimiter::default(),
            global: Arc::new(Semaphore::new(s.max_concurrent as usize)),
            sandboxes: Arc::new(Semaphore::new(s.max_concurrent as usize)),
            in_flight: std::sync::Mutex::new(Vec::new()),
            commands,
            stalls: Arc::default(),
            tenants,
            audit,
            metrics: Metrics::default(),
            work_dir,
            workspaces,
            workspaces_mounted,
            anonymous,
            config,
        })
    }

    /// Whether the server runs without tenants (loopback only).
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }
}

/// A private copy of the config file in the server's own directory, for
/// the sandboxes of supervised servers (`corral run --config`): an edit of
/// the original while the server runs changes nothing under it. The copy
/// must say what the server loaded.
fn snapshot_config(
    file: &std::path::Path,
    work_dir: &std::path::Path,
    loaded: &Config,
) -> Result<std::path::PathBuf, ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let copy = work_dir.join("config.toml");
    let io = |source| ServerError::ConfigSnapshot {
        path: file.to_path_buf(),
        message: format!("{source}"),
    };
    let text = std::fs::read_to_string(file).map_err(io)?;
    let same = Config::parse(&text, Some(file))
        .map(|c| c.server.mcp_servers == loaded.server.mcp_servers && c.profiles == loaded.profiles)
        .unwrap_or(false);
    if !same {
        return Err(ServerError::ConfigSnapshot {
            path: file.to_path_buf(),
            message: "the file changed while corral was starting; start it again".into(),
        });
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&copy)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io)?;
    Ok(copy)
}

/// The profiles of a tenant that may use them all (the anonymous one):
/// `code` first, as it is the default profile everywhere else in corral
/// (`corral run`), then the others in alphabetical order. The first is the
/// default for requests that name none.
pub fn anonymous_profiles(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config.profiles.keys().cloned().collect();
    if let Some(i) = names
        .iter()
        .position(|n| n == corral_policy::builtin::DEFAULT_PROFILE)
    {
        let code = names.remove(i);
        names.insert(0, code);
    }
    names
}

/// The directory of workspaces in a server's own directory.
pub const WORKSPACES_DIR: &str = "workspaces";

/// Removes `corral-serve-<pid>` directories whose server is gone (killed
/// before it could clean up). `remove_dir_all` never follows the symlinks a
/// sandbox may have planted (CVE-2022-21658 fixed it in Rust 1.58.1).
fn sweep_stale_work_dirs(base: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("corral-serve-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = i32::try_from(std::process::id()) == Ok(pid)
            || std::path::Path::new(&format!("/proc/{pid}")).exists();
        // Only our own directories: in a shared /tmp anyone can create a
        // name that looks like ours.
        let ours = std::fs::symlink_metadata(entry.path()).is_ok_and(|m| {
            m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == corral_sys::process::uids().1
        });
        if !alive && ours {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for AppState {
    fn drop(&mut self) {
        if self.workspaces_mounted {
            crate::mounts::unmount_workspace_base(&self.workspaces);
        }
        let _ = std::fs::remove_dir_all(&self.work_dir);
    }
}

/// When corral runs as root, sandboxes run as an unprivileged uid that must
/// be able to pass through every directory above its workspace.
fn check_traversable(work_dir: &std::path::Path) -> Result<(), ServerError> {
    use std::os::unix::fs::MetadataExt;
    if corral_sys::process::uids().1 != 0 {
        return Ok(());
    }
    let full = std::fs::canonicalize(work_dir).map_err(|source| ServerError::WorkDir {
        path: work_dir.to_path_buf(),
        source,
    })?;
    for dir in full.ancestors() {
        let meta = std::fs::metadata(dir).map_err(|source| ServerError::Stat {
            path: dir.to_path_buf(),
            source,
        })?;
        if meta.mode() & 0o001 == 0 {
            return Err(ServerError::NotTraversable {
                work_dir: work_dir.to_path_buf(),
                dir: dir.to_path_buf(),
                mode: meta.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// Creates this server's own directory, mode 0711 (others may pass through
/// to their workspace, not list it). It must not exist yet: in a shared
/// `/tmp` a local user could have planted the name, or a symlink, to make
/// corral chmod or fill a directory of theirs.
pub(crate) fn create_own_dir(dir: &std::path::Path) -> Result<(), ServerError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .mode(0o711)
        .create(dir)
        .map_err(|source| ServerError::OwnDir {
            path: dir.to_path_buf(),
            source,
        })?;
    // The mode as asked, whatever the umask; the directory is ours and new.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(|source| {
        ServerError::Chmod {
            path: dir.to_path_buf(),
            source,
        }
    })
}
