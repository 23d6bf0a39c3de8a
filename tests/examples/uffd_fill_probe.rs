//! A probe of the page server's warm fill outside CRIU, with a real
//! userfaultfd: THREADS fillers take 64 MiB chunks of FILE (from the page
//! cache), `pread` each in PIECE-KiB pieces into their own buffer, BLAKE3 it
//! and `UFFDIO_COPY` it into a fresh anonymous mapping registered with a
//! userfaultfd, as `shim/src/snapshot/pages/verify.rs` does. Runs each PIECE
//! given ROUNDS times, in ABBA order, and prints GB/s. `SKIP_READ=1` copies
//! the buffer without reading, `SKIP_HASH=1` places without hashing: what
//! each step costs (docs/page-server.md).
//!
//! cargo run --release -p vsnap-e2e --example uffd_fill_probe -- THREADS ROUNDS FILE PIECE_KIB...

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const CHUNK: u64 = 64 << 20;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;

/// A fresh private anonymous mapping of `len` bytes, registered for
/// missing-page faults with a new userfaultfd: (address, descriptor).
fn region(len: usize) -> (usize, i32) {
    // SAFETY: plain syscalls on memory and a descriptor this probe owns.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED);
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32;
        assert!(fd >= 0);
        let mut api = [0xAAu64, 0, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()), 0);
        let mut reg = [addr as u64, len as u64, 1, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_REGISTER, reg.as_mut_ptr()), 0);
        (addr as usize, fd)
    }
}

fn run(threads: usize, path: &str, piece: u64) -> f64 {
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len();
    let chunks = size.div_ceil(CHUNK) as usize;
    let (base, fd) = region(size as usize);
    let next = AtomicUsize::new(0);
    let skip_read = std::env::var("SKIP_READ").is_ok();
    let skip_hash = std::env::var("SKIP_HASH").is_ok();
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let next = &next;
            let file = file.try_clone().unwrap();
            s.spawn(move || {
                let mut buf = vec![0u8; (2 << 20) as usize];
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks {
                        return;
                    }
                    let (start, end) = (c as u64 * CHUNK, ((c as u64 + 1) * CHUNK).min(size));
                    let mut h = blake3::Hasher::new();
                    let mut at = start;
                    while at < end {
                        let k = piece.min(end - at) as usize;
                        if !skip_read {
                            file.read_exact_at(&mut buf[..k], at).unwrap();
                        }
                        if !skip_hash {
                            h.update(&buf[..k]);
                        }
                        let mut cp = [base as u64 + at, buf.as_ptr() as u64, k as u64, 0u64, 0u64];
                        // SAFETY: a valid uffdio_copy from the buffer (k bytes in
                        // bounds) into this chunk's own range of the region.
                        let rc = unsafe { libc::ioctl(fd, UFFDIO_COPY, cp.as_mut_ptr()) };
                        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                        at += k as u64;
                    }
                    std::hint::black_box(h.finalize());
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    // SAFETY: the mapping and descriptor made by `region`, no longer used.
    unsafe {
        libc::munmap(base as *mut _, size as usize);
        libc::close(fd);
    }
    size as f64 / secs / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args[0].parse().unwrap();
    let rounds: usize = args[1].parse().unwrap();
    let path = &args[2];
    let pieces: Vec<u64> = args[3..]
        .iter()
        .map(|a| a.parse::<u64>().unwrap() << 10)
        .collect();
    let mut res: Vec<Vec<f64>> = vec![Vec::new(); pieces.len()];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..pieces.len()).collect()
        } else {
            (0..pieces.len()).rev().collect()
        };
        for i in order {
            res[i].push(run(threads, path, pieces[i]));
        }
    }
    for (p, v) in pieces.iter().zip(&res) {
        let mut s = v.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "piece {:>5} KiB: median {:.2} GB/s  runs {:?}",
            p >> 10,
            s[s.len() / 2],
            v.iter()
                .map(|x| (x * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
    }
}
