//! Scratch buffers of whole pages straight from the kernel.

use crate::{Errno, SysResult};

/// A zeroed, writable buffer mapped anonymously (`mmap(2)`): the kernel
/// provides each page, zeroed, only when it is first touched, so a large
/// buffer of which a run uses a few hundred bytes costs one page, not its
/// size. A zeroed `Vec` of the same size is written whole by the
/// allocator's `memset` (unless it is large enough to be mapped), page by
/// page faulting in; in a process that has just forked, each of those
/// pages may also be one it shares copy-on-write. Unmapped when dropped.
pub struct PageBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: PageBuf owns its mapping exclusively, like a Box<[u8]>.
unsafe impl Send for PageBuf {}

impl PageBuf {
    /// A buffer of `len` bytes (rounded up to whole pages by the kernel;
    /// `len` is what the slice shows). `EINVAL` for 0.
    pub fn new(len: usize) -> SysResult<PageBuf> {
        if len == 0 {
            return Err(Errno(libc::EINVAL));
        }
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>()).ok_or(Errno(libc::ENOMEM))?;
        Ok(PageBuf { ptr, len })
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes, zeroed or written
        // through `deref_mut`, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, of `len` bytes, and no borrow of it
        // outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl std::fmt::Debug for PageBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_page_buffer_is_zeroed_writable_and_only_touched_pages_are_resident() {
        let mut buf = PageBuf::new(64 * 1024 + 1).unwrap();
        assert_eq!(buf.len(), 64 * 1024 + 1);
        assert!(buf.iter().all(|&b| b == 0));
        buf[0] = 7;
        buf[64 * 1024] = 9;
        assert_eq!((buf[0], buf[64 * 1024]), (7, 9));
        assert_eq!(PageBuf::new(0).unwrap_err(), Errno(libc::EINVAL));
        // A fresh one: only what is written becomes resident (mincore).
        // Large folios (multi-size THP, where enabled) would fault in more
        // than the page written: kept out of this range.
        let mut fresh = PageBuf::new(64 * 1024).unwrap();
        // SAFETY: advice on the mapping `fresh` owns; no memory changes.
        let advised =
            unsafe { libc::madvise(fresh.ptr.as_ptr().cast(), 64 * 1024, libc::MADV_NOHUGEPAGE) };
        assert_eq!(advised, 0);
        fresh[100] = 1;
        let mut vec = [0u8; 16];
        // SAFETY: the mapping is 16 pages long and `vec` has 16 entries.
        let r = unsafe { libc::mincore(fresh.ptr.as_ptr().cast(), 64 * 1024, vec.as_mut_ptr()) };
        assert_eq!(r, 0);
        assert_eq!(vec.iter().filter(|&&v| v & 1 == 1).count(), 1, "{vec:?}");
    }
}
