//! Built-in profiles. A config file may extend or override them.

use std::collections::BTreeMap;

use crate::path::SandboxPath;
use crate::profile::{
    CommandPolicy, EnvPolicy, Filesystem, Identity, LandlockMode, Limits, Profile, SeccompProfile,
    Security,
};
use crate::size::ByteSize;

/// The profile used when none is named.
pub const DEFAULT_PROFILE: &str = "code";

/// System paths bound read-only by default. Only the `/etc` files programs
/// need are listed: never `/etc/shadow`, `/etc/passwd` (corral writes its
/// own) or anything with host secrets.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/mime.types",
];

/// Directories searched for allowlisted commands.
pub const SEARCH_PATH: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

fn paths(list: &[&str]) -> Vec<SandboxPath> {
    list.iter()
        .filter_map(|p| SandboxPath::new(p).ok())
        .collect()
}

/// The starting point of every profile: the system paths, no commands, the
/// base environment, no limits beyond the defaults.
pub fn base(name: &str) -> Profile {
    Profile {
        name: name.to_string(),
        description: String::new(),
        hostname: String::from("corral"),
        filesystem: Filesystem {
            system: paths(SYSTEM_PATHS),
            read_only: vec![],
            read_write: vec![],
            deny: vec![],
            tmp_size: ByteSize(64 << 20),
            workspace_size: ByteSize(256 << 20),
            dev_pts: false,
        },
        env: EnvPolicy {
            pass: vec![],
            set: BTreeMap::new(),
            block: vec![],
        },
        commands: CommandPolicy {
            allow: vec![],
            allow_paths: false,
            deny_args: vec![],
            search_path: paths(SEARCH_PATH),
        },
        limits: Limits {
            timeout_secs: None,
            memory_bytes: None,
            pids: None,
            cpu_millicores: None,
            cpu_time_secs: None,
            address_space_bytes: None,
            file_size_bytes: Some(ByteSize(1 << 30)),
            open_files: 1024,
            processes: Some(1024),
            output_bytes: ByteSize(1 << 20),
            output_kill_bytes: Some(ByteSize(64 << 20)),
            allow_unenforced: false,
        },
        identity: Identity::default(),
        security: Security {
            seccomp: SeccompProfile::Default,
            landlock: LandlockMode::Required,
            tcp_bind: vec![],
            tcp_connect: vec![],
            unix_sockets: false,
        },
        network: crate::network::NetworkPolicy::default(),
    }
}

/// `code`: run a snippet in python3, node, sh or bash with no network.
pub fn code() -> Profile {
    let mut p = base("code");
    p.description = String::from("snippets in python3, node, sh or bash; no network");
    p.commands.allow = ["python3", "node", "sh", "bash"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    p.env.set.insert("PYTHONUNBUFFERED".into(), "1".into());
    p.limits.timeout_secs = Some(300);
    p.limits.memory_bytes = Some(ByteSize(1 << 30));
    p.limits.pids = Some(512);
    p.env
        .set
        .insert("PYTHONDONTWRITEBYTECODE".into(), "1".into());
    p
}

/// Every built-in profile, by name.
pub fn all() -> BTreeMap<String, Profile> {
    [code()].into_iter().map(|p| (p.name.clone(), p)).collect()
}
