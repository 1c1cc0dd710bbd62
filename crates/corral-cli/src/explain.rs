//! `corral explain`: the effective sandbox of a profile, for review.

use std::path::Path;

use corral_launcher::{CommandTable, Resolution};
use corral_policy::env::{ALWAYS_BLOCKED, BASE_ENV};
use serde_json::json;

/// Prints the profile; returns the exit status.
pub fn explain(name: Option<&str>, config: Option<&Path>, as_json: bool) -> i32 {
    let config = match crate::load_config(config) {
        Ok(c) => c,
        Err(e) => {
            crate::say(&e.to_string());
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
    };
    let name = name.unwrap_or(corral_policy::builtin::DEFAULT_PROFILE);
    let profile = match config.profile(name) {
        Ok(p) => p,
        Err(e) => {
            crate::say(&e.to_string());
            return corral_launcher::EXIT_CORRAL_ERROR;
        }
    };
    // What runs of this profile would be refused for here, as `corral
    // check` names it, and where its commands resolve: both look at the
    // host, so neither may hold the review on a filesystem that does not
    // answer.
    let looked = {
        let (profile, path) = (profile.clone(), std::env::var("PATH").ok());
        let name = name.to_string();
        crate::within_host_wait(move || {
            (
                CommandTable::resolve(&profile, path.as_deref()),
                corral_launcher::missing_for_profile(&name, &profile),
            )
        })
    };
    let (commands, warnings): (Vec<(String, String)>, _) = match looked {
        Some((table, warnings)) => (
            table
                .entries()
                .iter()
                .map(|(n, r)| {
                    let where_ = match r {
                        Resolution::Found(p) => p.clone(),
                        Resolution::Missing(dirs) => {
                            format!("NOT FOUND (searched {})", dirs.join(", "))
                        }
                    };
                    (n.clone(), where_)
                })
                .collect(),
            warnings,
        ),
        // In the table's order: sorted, each name once.
        None => (
            profile
                .commands
                .allow
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|n| (n.clone(), "NOT RESOLVED (the host did not answer)".into()))
                .collect(),
            vec![crate::host_unanswered(
                "the commands and the bind sources were",
            )],
        ),
    };
    // What init holds once the program runs, from the filter it installs.
    let init_layer = format!(
        "corral's init: reaps, forwards signals, non-dumpable, empty environment; kills the whole tree when the program ends. \
         Once the program runs it holds no capability (every set empty), has no_new_privs, and a seccomp allowlist: {} (anything else EPERM)",
        corral_launcher::INIT_SYSCALLS
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let layers = [
        ("namespaces", match profile.network.mode {
            corral_policy::NetworkMode::Host => "user, mount, pid, ipc, uts, cgroup; NOT net (network mode host)",
            _ => "user, mount, pid, ipc, uts, net (see network), cgroup",
        }),
        ("root", "pivot_root into a fresh read-only tmpfs; host root detached"),
        ("privileges", "all capabilities dropped (bounding, ambient, effective, permitted, inheritable), no_new_privs, setsid, die-with-parent, fds beyond 0-2 closed"),
        ("identity", "the invoking user; when corral runs as root, the profile's unprivileged uid/gid"),
        ("pid 1", init_layer.as_str()),
        ("seccomp", match profile.security.seccomp {
            corral_policy::SeccompProfile::Default => "default deny-list (rules below), installed last before execve",
            corral_policy::SeccompProfile::Strict => "strict allowlist (rules below), installed last before execve",
        }),
        ("landlock", match profile.security.landlock {
            corral_policy::LandlockMode::Required => "required: read/execute on read-only mounts, all rights on writable ones, devices in /dev, listing of /; TCP and signal/abstract-socket scoping",
            corral_policy::LandlockMode::BestEffort => "best effort: same rules where the kernel has Landlock, reported otherwise",
        }),
    ];
    let seccomp_rules =
        corral_launcher::seccomp_rules(profile.security.seccomp, profile.security.unix_sockets);
    for w in &warnings {
        crate::say(&format!("warning: {}", w.message));
    }
    if as_json {
        let v = json!({
            "profile": profile,
            "commands": commands.iter().map(|(n, p)| json!({"name": n, "path": p})).collect::<Vec<_>>(),
            "env_base": BASE_ENV.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>(),
            "env_always_blocked": ALWAYS_BLOCKED.iter().map(|(p, why)| json!({"pattern": p, "why": why})).collect::<Vec<_>>(),
            "layers": layers.iter().map(|(k, v)| json!({"layer": k, "state": v})).collect::<Vec<_>>(),
            "seccomp_rules": seccomp_rules,
            "warnings": warnings,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return 0;
    }
    let fs = &profile.filesystem;
    println!("profile {}: {}", profile.name, profile.description);
    println!("hostname: {}", profile.hostname);
    println!("\nfilesystem (root is a read-only tmpfs; everything else is listed):");
    for p in &fs.system {
        let state = match std::fs::symlink_metadata(p.as_path()) {
            Ok(m) if m.file_type().is_symlink() => "symlink, recreated",
            Ok(_) => "read-only bind",
            Err(_) => "absent on this host, skipped",
        };
        println!("  {p:<28} {state}");
    }
    let refused = |source: &corral_policy::SandboxPath| {
        warnings
            .iter()
            .find(|w| w.path == source.as_str())
            .map(|w| format!(" (runs refused here: {})", w.code))
            .unwrap_or_default()
    };
    for m in &fs.read_only {
        println!(
            "  {:<28} read-only bind of {}{}",
            m.dest.as_str(),
            m.source,
            refused(&m.source)
        );
    }
    for m in &fs.read_write {
        println!(
            "  {:<28} read-WRITE bind of {}{}",
            m.dest.as_str(),
            m.source,
            refused(&m.source)
        );
    }
    println!(
        "  {:<28} read-write: --workdir, or a {} tmpfs",
        "/workspace", fs.workspace_size
    );
    println!("  {:<28} tmpfs, {}", "/tmp", fs.tmp_size);
    println!(
        "  {:<28} procfs of the sandbox's own pid namespace",
        "/proc"
    );
    println!(
        "  {:<28} null zero full random urandom, fd/stdin/stdout/stderr links, shm{}",
        "/dev",
        if fs.dev_pts { ", pts + ptmx" } else { "" }
    );
    println!(
        "  {:<28} generated: passwd, group, hosts, hostname",
        "/etc/*"
    );
    for d in &fs.deny {
        println!("  {d:<28} DENIED (empty, mode 000, read-only)");
    }
    if fs.protect.is_empty() {
        println!("  protected entries:           none (the sandbox may change anything in writable binds)");
    } else {
        let (home, project): (Vec<_>, Vec<_>) = fs.protect.iter().partition(|e| e.home_only());
        let names = |v: &[&corral_policy::ProtectEntry]| {
            v.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "  protected entries:           read-only in the workdir and every --rw bind; while missing, an empty \
             placeholder stands in for the run so they cannot be created; --no-protect turns this off"
        );
        println!("    in every writable bind:    {}", names(&project));
        if !home.is_empty() {
            println!("    in binds of a home dir:    {}", names(&home));
        }
    }
    println!("\nenvironment (starts empty):");
    for (k, v) in BASE_ENV {
        if !profile.env.set.contains_key(*k) {
            println!("  {k}={v}  (base)");
        }
    }
    for (k, v) in &profile.env.set {
        println!("  {k}={v}  (set)");
    }
    for k in &profile.env.pass {
        println!("  {k}  (passed from the caller when present)");
    }
    let blocked: Vec<&str> = ALWAYS_BLOCKED
        .iter()
        .map(|(p, _)| *p)
        .chain(profile.env.block.iter().map(String::as_str))
        .collect();
    println!("  always stripped: {}", blocked.join(" "));
    println!(
        "\ncommands (resolved once; requests name these, never paths{}):",
        if profile.commands.allow_paths {
            " — except: this profile ALLOWS absolute paths"
        } else {
            ""
        }
    );
    for (n, p) in &commands {
        println!("  {n:<12} {p}");
    }
    if profile.commands.restrict_exec {
        println!(
            "  execve restricted: only the commands above, the program a request names and their \
             interpreters (#! lines, the ELF loader) may be executed, by anyone in the sandbox \
             (Landlock execute right; anything else fails with EACCES); no file the sandbox writes \
             runs, by execve or through the loader (writable places mounted noexec, no memfd)"
        );
    } else {
        println!("  execve unrestricted: the program may execute any file it can read (commands.restrict_exec = false)");
    }
    if let Some(tree) = &profile.filesystem.runtime {
        println!("  runtime tree: {tree} (read-only at its own path, its commands first)");
    }
    for rule in &profile.commands.deny_args {
        println!("  deny args matching: {rule}");
    }
    print_limits(&profile.limits);
    print_network(&profile.network);
    println!(
        "\nidentity when corral runs as root: uid {} gid {}",
        profile.identity.uid, profile.identity.gid
    );
    println!("\nlayers:");
    for (k, v) in layers {
        println!("  {k:<11} {v}");
    }
    println!("\nseccomp rules:");
    for r in &seccomp_rules {
        let action = match r.action {
            corral_launcher::RuleAction::Eperm => "EPERM",
            corral_launcher::RuleAction::Enosys => "ENOSYS",
            corral_launcher::RuleAction::Allow => "allow",
            corral_launcher::RuleAction::Kill => "KILL",
        };
        println!(
            "  {:<20} {:<7} when {:<40} {}",
            r.syscall, action, r.when, r.reason
        );
    }
    let s = &profile.security;
    println!(
        "\nlandlock TCP: bind {:?}, connect {:?} (everything else refused)",
        s.tcp_bind, s.tcp_connect
    );
    0
}

/// The network mode and, in mode `allow`, every rule the proxy applies.
fn print_network(n: &corral_policy::NetworkPolicy) {
    use corral_policy::NetworkMode;
    println!("\nnetwork:");
    match n.mode {
        NetworkMode::None => {
            println!("  mode none: own network namespace, loopback only; no resolver");
            return;
        }
        NetworkMode::Host => {
            println!(
                "  mode HOST: shares the host's network, UNFILTERED (reported as net.host on every run); the host's /etc/resolv.conf is copied in"
            );
            return;
        }
        NetworkMode::Allow => println!(
            "  mode allow: own network namespace; the only way out is corral's proxy (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY set); no resolver inside, the proxy resolves"
        ),
    }
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "none".to_string()
        } else {
            items.join(" ")
        }
    };
    let rules = |r: &[corral_policy::DomainRule]| list(r.iter().map(|d| d.to_string()).collect());
    println!("  allowed domains:   {}", rules(&n.allow_domains));
    println!(
        "  denied domains:    {} (every port; deny wins)",
        list(n.deny_domains.iter().map(|d| d.pattern.clone()).collect())
    );
    println!(
        "  allowed networks:  {} (private, loopback, link-local and IP literals are refused unless listed)",
        list(n.allow_cidrs.iter().map(|c| c.to_string()).collect())
    );
    println!(
        "  static hosts:      {}",
        list(n.hosts.iter().map(|(k, v)| format!("{k}={v}")).collect())
    );
    println!(
        "  TLS name check:    {}",
        if n.sni_check {
            "on: CONNECT to 443 must carry a matching SNI"
        } else {
            "off"
        }
    );
    println!(
        "  connections:       at most {} at once, closed after {}s idle",
        n.max_connections, n.idle_timeout_secs
    );
}

fn print_limits(l: &corral_policy::Limits) {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    println!("\nlimits:");
    println!(
        "  wall timeout:      {}",
        opt(l.timeout_secs.map(|t| format!("{t}s")))
    );
    println!(
        "  memory (+swap):    {}  (cgroup)",
        opt(l.memory_bytes.map(|m| m.to_string()))
    );
    println!(
        "  pids:              {}  (cgroup)",
        opt(l.pids.map(|p| p.to_string()))
    );
    println!(
        "  cpu:               {}  (cgroup)",
        opt(l.cpu_millicores.map(|c| format!("{c} millicores")))
    );
    println!(
        "  cpu time:          {}  (RLIMIT_CPU)",
        opt(l.cpu_time_secs.map(|t| format!("{t}s")))
    );
    println!(
        "  address space:     {}  (RLIMIT_AS)",
        opt(l.address_space_bytes.map(|m| m.to_string()))
    );
    println!(
        "  file size:         {}  (RLIMIT_FSIZE)",
        opt(l.file_size_bytes.map(|m| m.to_string()))
    );
    println!("  open files:        {}  (RLIMIT_NOFILE)", l.open_files);
    println!(
        "  processes:         {}  (RLIMIT_NPROC, per sandbox user namespace)",
        opt(l.processes.map(|p| p.to_string()))
    );
    println!("  core dumps:        off (RLIMIT_CORE 0)");
    println!(
        "  queued signals:    {}  (RLIMIT_SIGPENDING; a budget every sandbox of the host user shares)",
        corral_launcher::PENDING_SIGNALS
    );
    println!(
        "  output kept:       {} per stream (head and tail)",
        l.output_bytes
    );
    println!(
        "  output kill:       {}",
        opt(l
            .output_kill_bytes
            .map(|k| format!("past {k} in total on one stream")))
    );
    println!(
        "  unenforceable:     {}",
        if l.allow_unenforced {
            "run anyway and report (allow_unenforced)"
        } else {
            "refuse to run (fail closed)"
        }
    );
}
