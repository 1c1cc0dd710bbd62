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
            runtime: None,
            protect: crate::protect::default_protect(),
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
            restrict_exec: false,
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

fn set_env(p: &mut Profile, vars: &[(&str, &str)]) {
    for (k, v) in vars {
        p.env.set.insert((*k).to_string(), (*v).to_string());
    }
}

fn allow(p: &mut Profile, names: &[&str]) {
    p.commands.allow = names.iter().map(|s| s.to_string()).collect();
}

/// What every long-running MCP server profile shares: no wall timeout (a
/// server runs for days), bounded instead by a CPU share, memory and
/// process limits; no network unless an allowlist is given; the workdir
/// (or the workspace tmpfs) as its state directory and HOME, with caches
/// under it; and only the allowed commands may be executed at all.
fn mcp_server(name: &str, description: &str) -> Profile {
    let mut p = base(name);
    p.description = description.to_string();
    p.limits.timeout_secs = None;
    // Output is a pipe to the client: no lifetime ceiling on a stream.
    p.limits.output_kill_bytes = None;
    p.limits.cpu_millicores = Some(1000);
    p.limits.memory_bytes = Some(ByteSize(1 << 30));
    p.limits.pids = Some(256);
    p.commands.restrict_exec = true;
    set_env(
        &mut p,
        &[
            ("XDG_CACHE_HOME", "/workspace/.cache"),
            ("XDG_CONFIG_HOME", "/workspace/.config"),
            ("XDG_DATA_HOME", "/workspace/.local/share"),
        ],
    );
    p
}

/// `mcp-python`: a long-running MCP server in Python over stdio.
pub fn mcp_python() -> Profile {
    let mut p = mcp_server(
        "mcp-python",
        "a long-running MCP server in Python (stdio): no wall timeout, no network unless allowed, only python3 may run",
    );
    allow(&mut p, &["python3", "python"]);
    set_env(
        &mut p,
        &[
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            ("UV_CACHE_DIR", "/workspace/.cache/uv"),
        ],
    );
    p
}

/// `mcp-node`: a long-running MCP server in Node.js over stdio.
pub fn mcp_node() -> Profile {
    let mut p = mcp_server(
        "mcp-node",
        "a long-running MCP server in Node.js (stdio): no wall timeout, no network unless allowed, only node may run",
    );
    allow(&mut p, &["node"]);
    set_env(
        &mut p,
        &[
            ("NPM_CONFIG_CACHE", "/workspace/.npm"),
            ("NPM_CONFIG_UPDATE_NOTIFIER", "false"),
            ("NO_UPDATE_NOTIFIER", "1"),
        ],
    );
    p
}

/// The package registries the `install` profile reaches, HTTPS only.
pub const PACKAGE_REGISTRIES: &[&str] = &[
    "pypi.org:443",
    "files.pythonhosted.org:443",
    "registry.npmjs.org:443",
];

/// `install`: the install phase of a source tree (`pip install`, `npm
/// ci`, `uv sync`): network only to the package registries (a config
/// names its own, such as a local mirror, in `network.allow_domains`), no
/// secrets (the environment starts empty as always), the workdir as the
/// writable target tree.
pub fn install() -> Profile {
    let mut p = base("install");
    p.description =
        "install dependencies into the workdir: network only to the package registries, no secrets"
            .into();
    allow(
        &mut p,
        &[
            "pip", "pip3", "python3", "python", "uv", "npm", "npx", "node", "sh", "bash",
        ],
    );
    p.limits.timeout_secs = Some(1800);
    p.limits.memory_bytes = Some(ByteSize(2 << 30));
    p.limits.pids = Some(512);
    p.network.mode = crate::network::NetworkMode::Allow;
    p.network.allow_domains = PACKAGE_REGISTRIES
        .iter()
        .filter_map(|d| crate::network::DomainRule::parse(d).ok())
        .collect();
    set_env(
        &mut p,
        &[
            ("CI", "true"),
            ("PYTHONUNBUFFERED", "1"),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            ("PIP_NO_CACHE_DIR", "1"),
            ("UV_CACHE_DIR", "/workspace/.cache/uv"),
            ("NPM_CONFIG_CACHE", "/workspace/.npm"),
            ("NPM_CONFIG_UPDATE_NOTIFIER", "false"),
            ("NO_UPDATE_NOTIFIER", "1"),
        ],
    );
    p
}

/// `build`: the build phase (`npm run build`, `make`, `python -m build`):
/// no network at all, the workdir writable.
pub fn build() -> Profile {
    let mut p = base("build");
    p.description = "build a source tree in the workdir: no network".into();
    allow(
        &mut p,
        &[
            "sh", "bash", "make", "python3", "python", "node", "npm", "npx", "uv", "cc", "gcc",
        ],
    );
    p.limits.timeout_secs = Some(3600);
    p.limits.memory_bytes = Some(ByteSize(2 << 30));
    p.limits.pids = Some(1024);
    set_env(
        &mut p,
        &[
            ("CI", "true"),
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("NPM_CONFIG_CACHE", "/workspace/.npm"),
            ("NPM_CONFIG_UPDATE_NOTIFIER", "false"),
            ("NPM_CONFIG_OFFLINE", "true"),
            ("NO_UPDATE_NOTIFIER", "1"),
        ],
    );
    p
}

/// The names of the built-in profiles, sorted.
pub const NAMES: &[&str] = &["build", "code", "install", "mcp-node", "mcp-python"];

/// The built-in profile called `name`, built now, or `None` when no
/// built-in has that name. Building one costs a few tens of thousands of
/// instructions, so callers that need one profile build only that one.
pub fn by_name(name: &str) -> Option<Profile> {
    match name {
        "build" => Some(build()),
        "code" => Some(code()),
        "install" => Some(install()),
        "mcp-node" => Some(mcp_node()),
        "mcp-python" => Some(mcp_python()),
        _ => None,
    }
}

/// Every built-in profile, by name.
pub fn all() -> BTreeMap<String, Profile> {
    NAMES
        .iter()
        .filter_map(|name| by_name(name))
        .map(|p| (p.name.clone(), p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exactly_the_profiles_by_name_builds() {
        let mut sorted = NAMES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, NAMES, "NAMES is sorted, without repeats");
        for name in NAMES {
            let p = by_name(name).expect("every name builds");
            assert_eq!(&p.name, name, "by_name({name:?}) builds that profile");
        }
        assert_eq!(all().keys().collect::<Vec<_>>(), NAMES.to_vec());
        assert_eq!(by_name("nope"), None);
        assert_eq!(by_name("base"), None, "base() is no profile of its own");
    }
}
