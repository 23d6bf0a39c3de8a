//! A probe of the page server's cold-cache pattern outside CRIU: THREADS
//! fillers take 64 MiB chunks of FILE in order, read each in 2 MiB pieces
//! into their own buffer, BLAKE3 it and copy it into fresh anonymous
//! memory (as `UFFDIO_COPY` places it); with LEAD > 0 one more thread reads
//! the file ahead of them (16 MiB reads, at most LEAD chunks ahead). Drops
//! the page cache first unless WARM is given. LEAD is a number of chunks,
//! prefixed with `w` to read ahead with `POSIX_FADV_WILLNEED` instead of
//! reads, `o` to give each filler its own open file (its own kernel
//! read-ahead state), or `m` (with 0) to hash and copy from a mapping of
//! the file instead of reading it into a buffer. Prints `LEAD ms GB/s`.
//!
//! cargo run --release -p vsnap-e2e --example placement_probe -- THREADS LEAD FILE [warm]

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const CHUNK: u64 = 64 << 20;
const PIECE: u64 = 2 << 20;
const READ: u64 = 16 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args[0].parse().unwrap();
    let willneed = args[1].starts_with('w');
    let own = args[1].starts_with('o');
    let mapped = args[1].starts_with('m');
    let lead: usize = args[1].trim_start_matches(['w', 'o', 'm']).parse().unwrap();
    let path = &args[2];
    if args.get(3).map(String::as_str) != Some("warm") {
        vsnap_e2e::bench::drop_caches();
    }
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len();
    let chunks = size.div_ceil(CHUNK) as usize;
    // SAFETY: a fresh private anonymous mapping, never unmapped (the
    // process ends).
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    let next = AtomicUsize::new(0);
    // AHEAD=k: each filler asks the kernel for its next k pieces
    // (POSIX_FADV_WILLNEED) once it has read one, so the disk works while
    // it hashes and copies.
    let ahead: u64 = std::env::var("AHEAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        if lead > 0 {
            let (next, ra) = (&next, std::fs::File::open(path).unwrap());
            s.spawn(move || {
                let mut buf = vec![0u8; READ as usize];
                let mut i = 0;
                while i < chunks {
                    let n = next.load(Ordering::Relaxed);
                    if i < n {
                        i = n;
                        continue;
                    }
                    if i >= n + lead {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        continue;
                    }
                    let (start, end) = (i as u64 * CHUNK, ((i as u64 + 1) * CHUNK).min(size));
                    let mut at = start;
                    while at < end {
                        let k = READ.min(end - at);
                        if willneed {
                            use std::os::fd::AsRawFd;
                            let mut w = at;
                            while w < at + k {
                                // SAFETY: an advice on an open descriptor.
                                unsafe {
                                    libc::posix_fadvise(
                                        ra.as_raw_fd(),
                                        w as i64,
                                        (2 << 20) as i64,
                                        libc::POSIX_FADV_WILLNEED,
                                    )
                                };
                                w += 2 << 20;
                            }
                        } else {
                            ra.read_exact_at(&mut buf[..k as usize], at).unwrap();
                        }
                        at += k;
                    }
                    i += 1;
                }
            });
        }
        for _ in 0..threads {
            let next = &next;
            let file = match own {
                true => std::fs::File::open(path).unwrap(),
                false => file.try_clone().unwrap(),
            };
            s.spawn(move || {
                let mut buf = vec![0u8; PIECE as usize];
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks {
                        return;
                    }
                    let (start, end) = (c as u64 * CHUNK, ((c as u64 + 1) * CHUNK).min(size));
                    let mut h = blake3::Hasher::new();
                    if mapped {
                        use std::os::fd::AsRawFd;
                        let len = (end - start) as usize;
                        // SAFETY: a read-only shared mapping of the file's chunk,
                        // unmapped below; the file is not truncated meanwhile.
                        let m = unsafe {
                            libc::mmap(
                                std::ptr::null_mut(),
                                len,
                                libc::PROT_READ,
                                libc::MAP_SHARED,
                                file.as_raw_fd(),
                                start as i64,
                            )
                        };
                        assert_ne!(m, libc::MAP_FAILED);
                        let mut at = 0usize;
                        while at < len {
                            let k = (PIECE as usize).min(len - at);
                            // SAFETY: inside the mapping.
                            let p = unsafe { (m as *mut u8).add(at) };
                            // MADV_POPULATE_READ (22): the piece's pages mapped at once.
                            unsafe { libc::madvise(p.cast(), k, 22) };
                            // SAFETY: the piece is mapped and readable.
                            let src = unsafe { std::slice::from_raw_parts(p, k) };
                            h.update(src);
                            // SAFETY: this chunk's own range of the mapping.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src.as_ptr(),
                                    (base + start as usize + at) as *mut u8,
                                    k,
                                )
                            };
                            at += k;
                        }
                        // SAFETY: the mapping made above.
                        unsafe { libc::munmap(m, len) };
                        std::hint::black_box(h.finalize());
                        continue;
                    }
                    let mut at = start;
                    let mut advised = start;
                    while at < end {
                        let k = PIECE.min(end - at) as usize;
                        file.read_exact_at(&mut buf[..k], at).unwrap();
                        let want = (at + k as u64 + ahead * PIECE).min(end);
                        if want > advised {
                            use std::os::fd::AsRawFd;
                            let from = advised.max(at + k as u64);
                            // SAFETY: an advice on an open descriptor.
                            unsafe {
                                libc::posix_fadvise(
                                    file.as_raw_fd(),
                                    from as i64,
                                    (want - from) as i64,
                                    libc::POSIX_FADV_WILLNEED,
                                )
                            };
                            advised = want;
                        }
                        h.update(&buf[..k]);
                        // SAFETY: this chunk's own range of the mapping.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                buf.as_ptr(),
                                (base + at as usize) as *mut u8,
                                k,
                            )
                        };
                        at += k as u64;
                    }
                    std::hint::black_box(h.finalize());
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} {:.0} {:.2}",
        args[1],
        secs * 1000.0,
        size as f64 / secs / 1e9
    );
}
