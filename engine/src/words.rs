//! The resident block's memory: a plain `Vec<u64>`, or, with
//! `VSNAP_ENGINE_RESIDENT_HUGE=1`, its own 2 MiB aligned anonymous mapping
//! advised `MADV_HUGEPAGE`, so that (THP in `madvise` mode) the kernel backs
//! it with huge pages and a checkpoint records it as eligible for them.

use std::ops::{Deref, DerefMut};

const HUGE: usize = 2 << 20;

pub enum Words {
    Plain(Vec<u64>),
    Huge(Mapped),
}

/// `len` words in a mapping of `map_len` bytes at `ptr`.
pub struct Mapped {
    ptr: *mut u64,
    len: usize,
    map_len: usize,
}

// SAFETY: plain memory owned by this value alone.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Words {
    /// `len` words of `f(i)`, in a huge-page eligible mapping when `huge`.
    pub fn generate(len: usize, huge: bool, f: impl FnMut() -> u64) -> Result<Self, String> {
        if !huge {
            let mut data = Vec::new();
            data.try_reserve_exact(len).map_err(|e| e.to_string())?;
            data.extend(std::iter::repeat_with(f).take(len));
            return Ok(Words::Plain(data));
        }
        let mut m = Mapped::new(len)?;
        for (w, v) in m.deref_mut().iter_mut().zip(std::iter::repeat_with(f)) {
            *w = v;
        }
        Ok(Words::Huge(m))
    }

    /// The mapping's bounds, where it is one of its own.
    pub fn range(&self) -> Option<(usize, usize)> {
        match self {
            Words::Plain(_) => None,
            Words::Huge(m) => Some((m.ptr as usize, m.ptr as usize + m.map_len)),
        }
    }
}

impl Mapped {
    fn new(len: usize) -> Result<Self, String> {
        let map_len = (len * 8).div_ceil(HUGE).max(1) * HUGE;
        // One more huge page to align the start.
        let total = map_len + HUGE;
        // SAFETY: a fresh private anonymous mapping this value owns.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {total} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let start = (base as usize).div_ceil(HUGE) * HUGE;
        // SAFETY: the unaligned head and the tail of the mapping above.
        unsafe {
            if start > base as usize {
                libc::munmap(base, start - base as usize);
            }
            let end = base as usize + total;
            if end > start + map_len {
                libc::munmap(
                    (start + map_len) as *mut libc::c_void,
                    end - start - map_len,
                );
            }
        }
        // SAFETY: the aligned mapping left.
        if unsafe { libc::madvise(start as *mut libc::c_void, map_len, libc::MADV_HUGEPAGE) } != 0 {
            return Err(format!(
                "madvise(MADV_HUGEPAGE): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Mapped {
            ptr: start as *mut u64,
            len,
            map_len,
        })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no reference outlives `self`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

impl Deref for Mapped {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: `len` words of the mapping, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for Mapped {
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            Words::Plain(v) => v,
            Words::Huge(m) => m,
        }
    }
}

impl DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            Words::Plain(v) => v,
            Words::Huge(m) => m,
        }
    }
}

impl PartialEq for Words {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Words {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} words at {:?}", self.len(), self.range())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_block_is_its_own_aligned_advised_mapping() {
        let mut i = 0u64;
        let w = Words::generate(3 << 17, true, || {
            i += 1;
            i
        })
        .unwrap();
        assert_eq!(w.len(), 3 << 17);
        assert_eq!(w[0], 1);
        assert_eq!(w[(3 << 17) - 1], 3 << 17);
        let (start, end) = w.range().unwrap();
        assert_eq!((start % HUGE, end - start), (0, 4 << 20));
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{start:x}-{end:x} ");
        let entry: String = smaps
            .split_inclusive('\n')
            .skip_while(|l| !l.starts_with(&head))
            .take_while(|l| !l.starts_with("VmFlags"))
            .collect();
        assert!(!entry.is_empty(), "no VMA {head} in smaps");
        let flags = smaps[smaps.find(&head).unwrap()..]
            .lines()
            .find(|l| l.starts_with("VmFlags"))
            .unwrap();
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        let plain = Words::generate(4, false, || 7).unwrap();
        assert_eq!((plain.range(), &plain[..]), (None, &[7u64; 4][..]));
    }
}
