//! `corral doctor`: what this host supports, and what each gap means.

use corral_launcher::{
    build_plan, launch, sandbox_identity, CommandTable, LaunchOptions, OutputMode, RunCgroup,
    RunRequest,
};

/// One check; `--json` prints them as they are.
#[derive(serde::Serialize)]
struct Finding {
    ok: bool,
    feature: &'static str,
    detail: String,
    /// What a miss means and what to do.
    meaning: &'static str,
}

/// `corral doctor --json`: its own object, never a run result.
#[derive(serde::Serialize)]
struct Report<'a> {
    kernel: &'a str,
    uid: u32,
    /// Whether a full sandbox starts here (the exit status is 0 then).
    ok: bool,
    findings: &'a [Finding],
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Runs every check; returns 0 when the full sandbox works here. With
/// `json`, prints one object (kernel, uid, ok, findings) instead of text.
pub fn doctor(json: bool) -> i32 {
    let mut findings = Vec::new();
    let kernel = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into());
    let (_, euid) = corral_sys::process::uids();
    if !json {
        println!(
            "kernel {kernel}; running as uid {euid}{}",
            if euid == 0 {
                " (root: sandboxes run as uid 65534)"
            } else {
                ""
            }
        );
    }

    // User namespaces: the sysctls that commonly block them, then a real
    // sandbox start, which is the only conclusive test.
    let max = read("/proc/sys/user/max_user_namespaces");
    findings.push(Finding {
        ok: max.as_deref() != Some("0"),
        feature: "user.max_user_namespaces",
        detail: max.clone().unwrap_or_else(|| "unreadable".into()),
        meaning: "0 forbids user namespaces: `sysctl -w user.max_user_namespaces=15000`",
    });
    if let Some(v) = read("/proc/sys/kernel/unprivileged_userns_clone") {
        findings.push(Finding {
            ok: v != "0",
            feature: "kernel.unprivileged_userns_clone",
            detail: v,
            meaning: "0 (Debian/older Ubuntu) forbids unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1`",
        });
    }
    if let Some(v) = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
        findings.push(Finding {
            ok: v != "1" || euid == 0,
            feature: "kernel.apparmor_restrict_unprivileged_userns",
            detail: v,
            meaning: "1 (Ubuntu 24.04 default) strips capabilities in new user namespaces: add an AppArmor profile granting `userns,` to the corral binary, or `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`",
        });
    }
    let (ok, detail) = probe_sandbox();
    findings.push(Finding {
        ok,
        feature: "full sandbox start",
        detail,
        meaning: "corral refuses to run without its namespaces; fix the findings above, or accept a weaker sandbox explicitly with `corral run --without-namespaces` (Landlock ABI 6+, seccomp, rlimits, output bounds)",
    });
    let landlock = corral_sys::probe::landlock_abi();
    findings.push(Finding {
        ok: landlock.is_ok(),
        feature: "landlock",
        detail: match landlock {
            Ok(v) => format!("ABI {v}"),
            Err(e) => format!("unavailable: {e}"),
        },
        meaning: "the second filesystem layer needs Landlock (boot with lsm=...,landlock)",
    });
    let seccomp = read("/proc/sys/kernel/seccomp/actions_avail");
    findings.push(Finding {
        ok: seccomp.is_some(),
        feature: "seccomp filters",
        detail: seccomp.unwrap_or_else(|| "unavailable".into()),
        meaning: "the syscall layer needs CONFIG_SECCOMP_FILTER",
    });
    let v2 = read("/sys/fs/cgroup/cgroup.controllers")
        .or_else(|| read("/sys/fs/cgroup/unified/cgroup.controllers"));
    let v1: Vec<&str> = ["memory", "pids", "cpu", "freezer"]
        .into_iter()
        .filter(|c| std::path::Path::new(&format!("/sys/fs/cgroup/{c}/tasks")).exists())
        .collect();
    findings.push(Finding {
        ok: v2.as_deref().is_some_and(|c| !c.is_empty()) || !v1.is_empty(),
        feature: "cgroups",
        detail: format!(
            "v2 controllers: [{}]; v1 controllers: [{}]",
            v2.unwrap_or_default(),
            v1.join(" ")
        ),
        meaning: "memory/pids limits need cgroup controllers delegated to corral",
    });
    // Whether the default profile's cgroup limits can be enforced here, by
    // creating (and removing) a real group the way `corral run` would.
    let code = corral_policy::builtin::code();
    let (ok, detail) = match RunCgroup::for_limits(&code.limits) {
        Ok(c) => {
            let detail = c
                .enforced()
                .and_then(|e| serde_json::to_string(&e).ok())
                .map(|v| format!("default limits enforceable: {v}"))
                .unwrap_or_else(|| "no cgroup limits requested".into());
            c.finish();
            (true, detail)
        }
        Err(e) => (false, e.to_string()),
    };
    findings.push(Finding {
        ok,
        feature: "cgroup limits of the default profile",
        detail,
        meaning: "`corral run` with the default profile is refused here (fail closed): run as root, delegate a cgroup to this user, or pass --allow-unenforced-limits",
    });
    findings.push(cgroup_start_cost(
        corral_cgroup_version().as_ref(),
        &read("/proc/self/mountinfo").unwrap_or_default(),
    ));
    let all_ok = findings
        .iter()
        .all(|f| f.ok || !matches!(f.feature, "full sandbox start"));
    if json {
        let report = Report {
            kernel: &kernel,
            uid: euid,
            ok: all_ok,
            findings: &findings,
        };
        match serde_json::to_string(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => crate::say(&format!("cannot encode the report: {e}")),
        }
    }
    for f in findings.iter().filter(|_| !json) {
        println!(
            "{} {:<46} {}",
            if f.ok { "ok  " } else { "MISS" },
            f.feature,
            f.detail
        );
        if !f.ok {
            println!("     -> {}", f.meaning);
        }
    }
    if all_ok {
        0
    } else {
        corral_launcher::EXIT_CORRAL_ERROR
    }
}

/// Starts a real sandbox running `sh -c 'exit 0'`.
fn probe_sandbox() -> (bool, String) {
    let profile = corral_policy::builtin::code();
    let table = CommandTable::resolve(&profile, std::env::var("PATH").ok().as_deref());
    let request = RunRequest {
        argv: vec!["sh".into(), "-c".into(), "exit 0".into()],
        ..Default::default()
    };
    let identity = sandbox_identity(&profile);
    let plan = match build_plan(&profile, &table, &request, identity, &|_| None) {
        Ok((p, _)) => p,
        Err(e) => return (false, format!("cannot plan a probe: {e}")),
    };
    let opts = LaunchOptions {
        output: OutputMode::Capture,
        output_bytes: 4096,
        output_kill_bytes: Some(1 << 20),
        timeout: Some(std::time::Duration::from_secs(10)),
        forward_signals: false,
        helper: corral_launcher::HelperStart::ReExec,
        cancel: None,
        stdin: None,
        tap: None,
    };
    match launch(&plan, &opts, None, None, None) {
        Ok(o) if o.failure.is_none() && o.exit_code == 0 => {
            (true, format!("works ({} ms)", o.wall.as_millis()))
        }
        Ok(o) => (
            false,
            o.failure
                .map(|(_, m)| m)
                .unwrap_or_else(|| format!("exit {}", o.exit_code)),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// The cgroup version corral would put its sandboxes in here, if any.
fn corral_cgroup_version() -> Option<corral_launcher::CgroupVersion> {
    corral_launcher::CgroupHost::detect()
        .ok()
        .map(|h| h.version().clone())
}

/// What moving each sandbox into its cgroup costs on this host, and what
/// an operator can do about it (issue 17). On cgroup v2 a process is moved
/// by pid (`cgroup.procs`), which write-locks the kernel's
/// `cgroup_threadgroup_rwsem` and so waits for an RCU grace period on
/// every sandbox start, unless cgroup2 is mounted with `favordynmods`
/// (cgroup-v2.rst, "favordynmods"). On v1 `corral run`'s helper joins its
/// groups itself, which takes no such lock. Advice only: it never changes
/// the exit status.
fn cgroup_start_cost(version: Option<&corral_launcher::CgroupVersion>, mountinfo: &str) -> Finding {
    const FEATURE: &str = "cgroup move per sandbox start";
    match version {
        Some(corral_launcher::CgroupVersion::V2 { mount, .. }) => {
            let options = cgroup2_super_options(mountinfo, mount);
            let favored = options
                .as_deref()
                .is_some_and(|o| o.split(',').any(|x| x == "favordynmods"));
            Finding {
                ok: favored,
                feature: FEATURE,
                detail: format!(
                    "cgroup v2 at {} ({})",
                    mount.display(),
                    match (&options, favored) {
                        (_, true) => "favordynmods: moves are cheap".to_string(),
                        (Some(o), false) => format!("mounted with {o}, without favordynmods"),
                        (None, false) => "mount options not found".to_string(),
                    }
                ),
                meaning: "each sandbox start waits for an RCU grace period (milliseconds) when corral moves its helper into the sandbox's cgroup: remount with `mount -o remount,favordynmods /sys/fs/cgroup` or boot with cgroup_favordynmods=true",
            }
        }
        Some(corral_launcher::CgroupVersion::V1 { .. }) => Finding {
            ok: true,
            feature: FEATURE,
            detail: "cgroup v1: `corral run`'s helper joins its groups itself (no grace-period wait); `corral serve` moves its warm helpers before requests arrive".into(),
            meaning: "",
        },
        None => Finding {
            ok: true,
            feature: FEATURE,
            detail: "no cgroup hierarchy corral can use (see the cgroup findings above)".into(),
            meaning: "",
        },
    }
}

/// The super options (the last field) of the cgroup2 mount at `mount` in
/// a `/proc/self/mountinfo` text, e.g. `rw,nsdelegate,favordynmods`.
fn cgroup2_super_options(mountinfo: &str, mount: &std::path::Path) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mount_point = before.split(' ').nth(4)?;
        let mut fields = after.split(' ');
        let fstype = fields.next()?;
        let options = fields.nth(1)?;
        (fstype == "cgroup2" && std::path::Path::new(mount_point) == mount)
            .then(|| options.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
35 25 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods
";

    fn v2(at: &str) -> corral_launcher::CgroupVersion {
        corral_launcher::CgroupVersion::V2 {
            mount: PathBuf::from(at),
            controllers: vec!["memory".into(), "pids".into()],
        }
    }

    #[test]
    fn cgroup_v2_without_favordynmods_is_flagged_with_the_remedy() {
        let f = cgroup_start_cost(Some(&v2("/sys/fs/cgroup")), MOUNTINFO);
        assert!(!f.ok);
        assert!(
            f.detail.contains("rw,nsdelegate,memory_recursiveprot"),
            "{}",
            f.detail
        );
        assert!(f.meaning.contains("favordynmods"), "{}", f.meaning);
    }

    #[test]
    fn cgroup_v2_with_favordynmods_passes() {
        // The options of the mount corral uses count, not another one's.
        let f = cgroup_start_cost(Some(&v2("/sys/fs/cgroup/unified")), MOUNTINFO);
        assert!(f.ok, "{}", f.detail);
    }

    #[test]
    fn cgroup_v1_and_no_cgroups_need_nothing() {
        let v1 = corral_launcher::CgroupVersion::V1 {
            mounts: Default::default(),
        };
        assert!(cgroup_start_cost(Some(&v1), MOUNTINFO).ok);
        assert!(cgroup_start_cost(None, MOUNTINFO).ok);
        // A cgroup2 mount missing from mountinfo is not taken as favoured.
        assert!(!cgroup_start_cost(Some(&v2("/elsewhere")), MOUNTINFO).ok);
    }
}
