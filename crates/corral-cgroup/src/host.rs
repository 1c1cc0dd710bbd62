//! The host's cgroup layout: detection from mountinfo, which limits can be
//! enforced and why not, creating groups, and the sweep of stale ones.

use super::*;

/// Where cgroups live on this host and who is asking.
#[derive(Debug, Clone)]
pub struct CgroupHost {
    pub(crate) version: Version,
    /// Mount points (full paths) mounted read-only.
    pub(crate) read_only: BTreeSet<PathBuf>,
    /// This process's own cgroups from `/proc/self/cgroup`: controller list
    /// (empty for v2) -> path. For messages.
    pub(crate) own: Vec<(String, String)>,
    pub(crate) euid: u32,
    pub(crate) egid: u32,
    pub(crate) groups: Vec<u32>,
    pub(crate) backend: Backend,
}

/// One cgroup filesystem mount from mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    pub(crate) mount_point: PathBuf,
    v2: bool,
    /// v1: the controllers corral uses that this hierarchy carries.
    controllers: Vec<Controller>,
    read_only: bool,
}

/// Decodes mountinfo's octal escapes (`\040` for a space, ...).
pub(crate) fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(b) = u8::try_from(v) {
                    out.push(b);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A mountinfo path, unescaped; borrowed when it has no escape (almost
/// always), so no line costs an allocation.
pub(crate) fn mount_path(s: &str) -> std::borrow::Cow<'_, str> {
    if s.as_bytes().contains(&b'\\') {
        std::borrow::Cow::Owned(unescape_mount_path(s))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// `text` split at every `sep` byte, as `str::split(char)` does for an
/// ASCII `sep`, by a plain byte scan: mountinfo's fields are a few bytes
/// long, shorter than `str::split`'s searcher takes to set up.
pub(crate) fn split_at_byte(text: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let s = rest?;
        match s.bytes().position(|b| b == sep) {
            Some(i) => {
                rest = Some(&s[i + 1..]);
                Some(&s[..i])
            }
            None => {
                rest = None;
                Some(s)
            }
        }
    })
}

/// The cgroup mounts in `mountinfo` that are visible: not hidden by a later
/// mount on the same path or on an ancestor path (one that is not itself
/// below it in the mount tree).
pub(crate) fn parse_mountinfo(mountinfo: &str) -> Result<Vec<CgroupMount>, CgroupError> {
    // Every mount: (id, parent id, mount point); and the cgroup ones.
    let mut all: Vec<(u64, u64, std::borrow::Cow<'_, str>)> = Vec::new();
    let mut cgroups: Vec<(usize, CgroupMount)> = Vec::new();
    for (i, line) in mountinfo.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let malformed = || CgroupError::Parse {
            file: "/proc/self/mountinfo",
            line: i + 1,
            text: line.chars().take(200).collect(),
        };
        let (left, right) = line.split_once(" - ").ok_or_else(malformed)?;
        // Fields are taken as they come (no Vec per line: this runs on
        // every `corral run` with limits).
        let mut fields = split_at_byte(left, b' ');
        let mut field = || fields.next().ok_or_else(malformed);
        let id: u64 = field()?.parse().map_err(|_| malformed())?;
        let parent: u64 = field()?.parse().map_err(|_| malformed())?;
        let (_major_minor, _root) = (field()?, field()?);
        let mount_point = mount_path(field()?);
        let mount_opts = field()?;
        let mut rest = split_at_byte(right, b' ');
        let (fstype, _source, super_opts) = match (rest.next(), rest.next(), rest.next()) {
            (Some(t), Some(src), Some(o)) => (t, src, o),
            _ => return Err(malformed()),
        };
        let v2 = fstype == "cgroup2";
        if !v2 && fstype != "cgroup" {
            all.push((id, parent, mount_point));
            continue;
        }
        let point = PathBuf::from(mount_point.as_ref());
        all.push((id, parent, mount_point));
        let controllers = if v2 {
            Vec::new()
        } else {
            split_at_byte(super_opts, b',')
                .filter_map(Controller::from_name)
                .collect()
        };
        let read_only = split_at_byte(mount_opts, b',').any(|o| o == "ro")
            || split_at_byte(super_opts, b',').any(|o| o == "ro");
        cgroups.push((
            all.len() - 1,
            CgroupMount {
                mount_point: point,
                v2,
                controllers,
                read_only,
            },
        ));
    }
    // The ids of the mounts a mount sits on, up to the root.
    let ancestors = |pos: usize| {
        let mut ids = Vec::new();
        let mut parent = all[pos].1;
        while ids.len() < all.len() && !ids.contains(&parent) {
            ids.push(parent);
            match all.iter().find(|(id, _, _)| *id == parent) {
                Some((_, next, _)) => parent = *next,
                None => break,
            }
        }
        ids
    };
    // A later mount hides `m` if its point is `m`'s or an ancestor of it.
    // The byte comparison first: a path-component prefix of a mountinfo
    // path (absolute, normalised) is always a byte prefix too, and most
    // later mounts fail it at once.
    let covers = |m: &CgroupMount, point: &str| {
        m.mount_point
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(point.as_bytes())
            && m.mount_point.starts_with(point)
    };
    Ok(cgroups
        .into_iter()
        .filter(|(pos, m)| {
            let mut later = all[pos + 1..]
                .iter()
                .filter(|(_, _, point)| covers(m, point))
                .peekable();
            if later.peek().is_none() {
                return true;
            }
            let below = ancestors(*pos);
            !later.any(|(id, _, _)| !below.contains(id))
        })
        .map(|(_, m)| m)
        .collect())
}

/// `/proc/self/cgroup` as (controller list, path) pairs.
pub(crate) fn parse_self_cgroup(text: &str) -> Result<Vec<(String, String)>, CgroupError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(_), Some(ctrls), Some(path)) => out.push((ctrls.to_string(), path.to_string())),
            _ => {
                return Err(CgroupError::Parse {
                    file: "/proc/self/cgroup",
                    line: i + 1,
                    text: line.chars().take(200).collect(),
                })
            }
        }
    }
    Ok(out)
}

/// `path` with `root` prepended (`root` is `/` outside tests).
pub(crate) fn under_root(root: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix("/") {
        Ok(rel) => root.join(rel),
        Err(_) => root.join(path),
    }
}

/// A `/proc` file's whole text. `/proc` files report a size of 0, so
/// `std::fs::read_to_string` starts from a 32-byte probe and grows (a dozen
/// `read` calls for `mountinfo`); a buffer of a page or more first takes
/// one or two.
fn read_proc_text(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(8192);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The effective gid and supplementary groups of this process, from
/// `/proc/self/status` (no syscall wrapper needed).
pub(crate) fn own_groups() -> (u32, Vec<u32>) {
    let status = read_proc_text("/proc/self/status").unwrap_or_default();
    let mut egid = u32::MAX;
    let mut groups = Vec::new();
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Gid:") {
            egid = rest
                .split_whitespace()
                .nth(1)
                .and_then(|g| g.parse().ok())
                .unwrap_or(u32::MAX);
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = rest
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        }
    }
    (egid, groups)
}

impl CgroupHost {
    /// Discovers the host's cgroups from `/proc/self/mountinfo` and
    /// `/proc/self/cgroup`.
    pub fn detect() -> Result<CgroupHost, CgroupError> {
        let read = |p: &str| {
            read_proc_text(p).map_err(|source| CgroupError::Read {
                path: PathBuf::from(p),
                source,
            })
        };
        let mountinfo = read("/proc/self/mountinfo")?;
        let self_cgroup = read("/proc/self/cgroup")?;
        CgroupHost::from_mountinfo(&mountinfo, &self_cgroup)
    }

    /// Like [`CgroupHost::detect`], from given file contents. Reads the
    /// cgroup2 root's `cgroup.controllers`.
    pub fn from_mountinfo(
        mountinfo: &str,
        proc_self_cgroup: &str,
    ) -> Result<CgroupHost, CgroupError> {
        CgroupHost::from_mountinfo_at(Path::new("/"), mountinfo, proc_self_cgroup)
    }

    /// Like [`CgroupHost::from_mountinfo`], with every mount point taken
    /// relative to `root` (a directory that fakes the host in tests).
    pub fn from_mountinfo_at(
        root: &Path,
        mountinfo: &str,
        proc_self_cgroup: &str,
    ) -> Result<CgroupHost, CgroupError> {
        let mounts = parse_mountinfo(mountinfo)?;
        let own = parse_self_cgroup(proc_self_cgroup)?;
        let mut read_only = BTreeSet::new();
        // cgroup2: prefer the one at /sys/fs/cgroup, then /sys/fs/cgroup/unified.
        let mut v2: Option<&CgroupMount> = None;
        let mut v1: BTreeMap<Controller, &CgroupMount> = BTreeMap::new();
        for m in &mounts {
            if m.v2 {
                let rank = |p: &Path| match p.to_str() {
                    Some("/sys/fs/cgroup") => 0,
                    Some("/sys/fs/cgroup/unified") => 1,
                    _ => 2,
                };
                if v2.is_none_or(|cur| rank(&m.mount_point) < rank(&cur.mount_point)) {
                    v2 = Some(m);
                }
            } else {
                for c in &m.controllers {
                    v1.entry(*c).or_insert(m);
                }
            }
        }
        let limiting = [Controller::Memory, Controller::Pids, Controller::Cpu];
        let v2_version = match v2 {
            Some(m) => {
                let mount = under_root(root, &m.mount_point);
                let file = mount.join("cgroup.controllers");
                let text = std::fs::read_to_string(&file)
                    .map_err(|source| CgroupError::Read { path: file, source })?;
                let controllers: Vec<String> =
                    text.split_whitespace().map(str::to_string).collect();
                let covered = limiting
                    .iter()
                    .filter(|c| controllers.iter().any(|n| n == c.name()))
                    .count();
                if m.read_only {
                    read_only.insert(mount.clone());
                }
                Some((covered, Version::V2 { mount, controllers }))
            }
            None => None,
        };
        let v1_covered = limiting.iter().filter(|c| v1.contains_key(c)).count();
        // Whichever version carries more of memory, pids and cpu; v2 on a tie.
        let version = match v2_version {
            Some((covered, version)) if covered >= v1_covered => version,
            _ if v1_covered > 0 => {
                let mut map = BTreeMap::new();
                for (c, m) in v1 {
                    let path = under_root(root, &m.mount_point);
                    if m.read_only {
                        read_only.insert(path.clone());
                    }
                    map.insert(c, path);
                }
                Version::V1 { mounts: map }
            }
            _ => return Err(CgroupError::NotMounted),
        };
        let (_, euid) = corral_sys::process::uids();
        // Only a non-root corral's write access depends on its groups
        // (`write_access`): root skips reading /proc/self/status.
        let (egid, groups) = if euid == 0 {
            (0, Vec::new())
        } else {
            own_groups()
        };
        Ok(CgroupHost {
            version,
            read_only,
            own,
            euid,
            egid,
            groups,
            backend: Backend::Kernel,
        })
    }

    /// The version in use and where it is mounted.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The cgroup this process is in, as `/proc/self/cgroup` shows it for
    /// the hierarchy corral uses for `controller` (v2: the unified one).
    pub fn own_cgroup(&self, controller: Controller) -> Option<&str> {
        let wanted = match self.version {
            Version::V2 { .. } => None,
            Version::V1 { .. } => Some(controller.name()),
        };
        self.own
            .iter()
            .find(|(ctrls, _)| match wanted {
                None => ctrls.is_empty(),
                Some(w) => ctrls.split(',').any(|c| c == w),
            })
            .map(|(_, p)| p.as_str())
    }

    /// Whether the current user may create groups below `mount`: the
    /// mount is writable and so is `corral/` (or the mount root, when
    /// `corral/` does not exist yet). On v2, `cgroup.subtree_control` must
    /// be writable too. A failure reason otherwise.
    pub(crate) fn write_access(&self, mount: &Path, controller: Controller) -> Result<(), String> {
        let v2 = matches!(self.version, Version::V2 { .. });
        if self.read_only.contains(mount) {
            return Err(format!("{} is mounted read-only", mount.display()));
        }
        if self.euid == 0 {
            return Ok(());
        }
        let base = mount.join(BASE_DIR);
        let dir = if base.exists() {
            base.clone()
        } else {
            mount.to_path_buf()
        };
        let mut needed = vec![dir.clone()];
        if v2 {
            needed.push(dir.join("cgroup.subtree_control"));
        }
        for p in needed {
            if !self.may_write(&p) {
                let where_ = self
                    .own_cgroup(controller)
                    .map(|p| format!("; corral runs in cgroup {p}"))
                    .unwrap_or_default();
                return Err(format!(
                    "corral cannot write {} (not root, no delegation{where_})",
                    base.display()
                ));
            }
        }
        Ok(())
    }

    /// Permission-bit check of write access for the current (non-root) user.
    pub(crate) fn may_write(&self, path: &Path) -> bool {
        let Ok(md) = std::fs::metadata(path) else {
            return false;
        };
        let mode = md.mode();
        if md.uid() == self.euid {
            mode & 0o200 != 0
        } else if md.gid() == self.egid || self.groups.contains(&md.gid()) {
            mode & 0o020 != 0
        } else {
            mode & 0o002 != 0
        }
    }

    /// Whether this host can enforce every limit in `limits` for the
    /// current user: the controller exists (v2: offered by the mount root;
    /// v1: its hierarchy is mounted) and the hierarchy is writable (root,
    /// or a delegated `corral/`). The error names the limit, the
    /// controller and why.
    pub fn can_enforce(&self, limits: &CgroupLimits) -> Result<(), CgroupError> {
        limits.validate()?;
        for (limit, controller, _) in limits.requested() {
            let unavailable = |reason: String| CgroupError::Unavailable {
                limit,
                controller: controller.name(),
                reason,
            };
            match &self.version {
                Version::V2 { mount, controllers } => {
                    let offered = controllers.iter().any(|c| c == controller.name());
                    let access = self.write_access(mount, controller);
                    if offered && access.is_ok() {
                        continue;
                    }
                    let mut reason = format!(
                        "cgroup v2 at {} has controllers [{}]",
                        mount.display(),
                        controllers.join(" ")
                    );
                    if let Err(why) = access {
                        reason.push_str(" and ");
                        reason.push_str(&why);
                    }
                    return Err(unavailable(reason));
                }
                Version::V1 { mounts } => match mounts.get(&controller) {
                    None => {
                        let have: Vec<&str> = mounts.keys().map(|c| c.name()).collect();
                        return Err(unavailable(format!(
                            "cgroup v1 has no {} hierarchy mounted (mounted: [{}])",
                            controller.name(),
                            have.join(" ")
                        )));
                    }
                    Some(mount) => {
                        if let Err(why) = self.write_access(mount, controller) {
                            return Err(unavailable(format!("cgroup v1: {why}")));
                        }
                    }
                },
            }
        }
        Ok(())
    }

    /// Creates the sandbox's group(s) `corral/<name>` and writes `limits`.
    ///
    /// v2: one directory, with memory and pids (when offered) and cpu (when
    /// limited) enabled through `cgroup.subtree_control` at the mount root
    /// and at `corral/`; `memory.swap.max` is 0 so the memory limit
    /// includes swap, and `memory.oom.group` is 1 so an OOM kills the whole
    /// sandbox. v1: one directory in each hierarchy a set limit needs
    /// (memory, pids, cpu) and none in the others, so no limits means no
    /// directory; the memory limit is also written to
    /// `memory.memsw.limit_in_bytes` when swap accounting exists. Nothing
    /// is left behind on error.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<SandboxCgroup, CgroupError> {
        validate_name(name)?;
        self.can_enforce(limits)?;
        match &self.version {
            Version::V2 { mount, controllers } => {
                v2::create(&self.backend, mount, controllers, name, limits)
            }
            Version::V1 { mounts } => v1::create(&self.backend, mounts, name, limits),
        }
    }

    /// The group directories of `name`, wherever they exist.
    pub(crate) fn existing_group(&self, name: &str) -> Option<SandboxCgroup> {
        let dirs: Vec<GroupDir> = match &self.version {
            Version::V2 { mount, .. } => vec![GroupDir {
                path: mount.join(BASE_DIR).join(name),
                controllers: Vec::new(),
            }],
            Version::V1 { mounts } => v1::hierarchies(mounts)
                .into_iter()
                .map(|(mount, controllers)| GroupDir {
                    path: mount.join(BASE_DIR).join(name),
                    controllers,
                })
                .collect(),
        };
        let dirs: Vec<GroupDir> = dirs.into_iter().filter(|d| d.path.is_dir()).collect();
        if dirs.is_empty() {
            return None;
        }
        Some(SandboxCgroup {
            v2: matches!(self.version, Version::V2 { .. }),
            dirs,
            enforced: CgroupEnforced::none(self.version.label()),
            backend: self.backend.clone(),
            done: false,
            stat_files: std::sync::OnceLock::new(),
        })
    }

    /// Removes the groups under `corral/` that a killed corral left
    /// behind: those named `<pid>-<n>` whose pid is not alive. Their
    /// processes are killed first. On v1 every hierarchy is searched,
    /// including cpuacct and freezer, where older corral versions made
    /// groups too. Returns how many groups were removed.
    ///
    /// Aliveness is judged in this process's pid namespace; corral
    /// instances in different pid namespaces must not share a cgroup
    /// hierarchy.
    pub fn sweep_stale(&self) -> usize {
        let bases: Vec<PathBuf> = match &self.version {
            Version::V2 { mount, .. } => vec![mount.join(BASE_DIR)],
            Version::V1 { mounts } => v1::hierarchies(mounts)
                .into_iter()
                .map(|(m, _)| m.join(BASE_DIR))
                .collect(),
        };
        let mut names = BTreeSet::new();
        for base in bases {
            // A directory's link count is 2 plus its subdirectories on the
            // cgroup file system (kernfs), so 2 means no group to look at:
            // the usual case, which then costs a `stat` instead of a
            // listing of the base's control files. (1, as some file
            // systems report for any directory, proves nothing.)
            // A base that cannot be looked at (no group was ever made in
            // this hierarchy, the usual case for those corral does not
            // limit) cannot be listed either.
            match std::fs::metadata(&base) {
                Ok(m) if m.nlink() != 2 => {}
                _ => continue,
            }
            let Ok(entries) = std::fs::read_dir(&base) else {
                continue;
            };
            // Most entries are the base's own control files (dozens in a
            // v1 memory hierarchy): only `<pid>-<n>` names are kept.
            for entry in entries.flatten() {
                let name = entry.file_name();
                if let Some(pid) = name.to_str().and_then(owner_pid) {
                    names.insert((name.to_string_lossy().into_owned(), pid));
                }
            }
        }
        let me = i32::try_from(std::process::id()).unwrap_or(0);
        let mut removed = 0;
        for (name, pid) in names {
            if pid == me || process_alive(pid) {
                continue;
            }
            if let Some(group) = self.existing_group(&name) {
                if group.remove().is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// Whether `pid` exists in this pid namespace.
pub(crate) fn process_alive(pid: i32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}
