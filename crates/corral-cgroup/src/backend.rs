//! Control-file access: the kernel's cgroup filesystem, or the fake one
//! in tests.

use super::*;

/// Writes one value to a control file (never creating it).
pub(crate) fn write_file(backend: &Backend, path: &Path, value: &str) -> Result<(), CgroupError> {
    backend
        .write(path, value)
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        })
}

/// Reads a control file, `None` when absent or unreadable (usage figures
/// are best effort).
pub(crate) fn read_opt(backend: &Backend, path: &Path) -> Option<String> {
    backend.read(path).ok()
}

/// The value of `key` in a flat-keyed file (`key value` lines).
pub(crate) fn keyed_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

/// The pids in `dir/cgroup.procs`.
pub(crate) fn read_pids(backend: &Backend, dir: &Path) -> Vec<i32> {
    read_opt(backend, &dir.join("cgroup.procs"))
        .map(|t| {
            t.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Creates a directory, treating "already exists" as success.
pub(crate) fn ensure_dir(backend: &Backend, path: &Path) -> Result<(), CgroupError> {
    match backend.mkdir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The file operations that touch the cgroup filesystem. The kernel
/// outside tests; in tests, a fake that emulates what the kernel does on
/// mkdir, write and rmdir.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Kernel,
    #[cfg(test)]
    Fake(std::sync::Arc<fake::FakeKernel>),
}

impl Backend {
    pub(crate) fn mkdir(&self, path: &Path) -> io::Result<()> {
        match self {
            Backend::Kernel => std::fs::create_dir(path),
            #[cfg(test)]
            Backend::Fake(k) => k.mkdir(path),
        }
    }

    pub(crate) fn rmdir(&self, path: &Path) -> io::Result<()> {
        match self {
            Backend::Kernel => std::fs::remove_dir(path),
            #[cfg(test)]
            Backend::Fake(k) => k.rmdir(path),
        }
    }

    pub(crate) fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        match self {
            Backend::Kernel => {
                // Control files exist or the kernel does not support the
                // knob: never create one. One write(2) per value.
                let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.write_all(value.as_bytes())
            }
            #[cfg(test)]
            Backend::Fake(k) => k.write(path, value),
        }
    }

    /// `path` opened for reading, to be read later; `None` where it
    /// cannot be (or, in tests, for the fake, which is read by path).
    pub(crate) fn open_read(&self, path: &Path) -> Option<std::fs::File> {
        match self {
            Backend::Kernel => std::fs::File::open(path).ok(),
            #[cfg(test)]
            Backend::Fake(_) => None,
        }
    }

    pub(crate) fn read(&self, path: &Path) -> io::Result<String> {
        match self {
            Backend::Kernel => std::fs::read_to_string(path),
            #[cfg(test)]
            Backend::Fake(k) => k.read(path),
        }
    }
}
