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
//! The fill is the page server's own (`vsnap_pages::chunks`: the chunks
//! in order, the fillers, the reads); only the read-ahead variants and
//! the copy into plain memory are the probe's.
//!
//! cargo run --release -p vsnap-e2e --example placement_probe -- THREADS LEAD FILE [warm]

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use vsnap_pages::chunks::{fillers, read_chunk, Buffer, Chunk, Chunks, CHUNK, PIECE};
use vsnap_pages::uffd::Region;

const READ: u64 = 16 << 20;

/// `POSIX_FADV_WILLNEED` of `len` bytes at `at` of `file`.
fn will_need(file: &std::fs::File, at: u64, len: u64) {
    // SAFETY: an advice on an open descriptor.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            at as i64,
            len as i64,
            libc::POSIX_FADV_WILLNEED,
        )
    };
}

/// LEAD > 0: reads the file ahead of the fillers (16 MiB reads, or
/// `POSIX_FADV_WILLNEED` of it), at most `lead` chunks ahead of the one
/// they took last.
fn read_ahead(chunks: &Chunks, path: &str, size: u64, lead: usize, willneed: bool) {
    let ra = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; READ as usize];
    let mut i = 0;
    while i < chunks.len() {
        let n = chunks.taken();
        if i < n {
            i = n;
            continue;
        }
        if i >= n + lead {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        let c = Chunk::of(0, size, i);
        let mut at = c.start;
        while at < c.end {
            let k = READ.min(c.end - at);
            if willneed {
                let mut w = at;
                while w < at + k {
                    will_need(&ra, w, 2 << 20);
                    w += 2 << 20;
                }
            } else {
                ra.read_exact_at(&mut buf[..k as usize], at).unwrap();
            }
            at += k;
        }
        i += 1;
    }
}

/// Hashes chunk `c` of `file` and copies it to `base` from a read-only
/// mapping of the file, a piece at a time, instead of reading it.
fn place_mapped(file: &std::fs::File, c: Chunk, base: usize) {
    let mut h = blake3::Hasher::new();
    let len = c.len() as usize;
    // SAFETY: a read-only shared mapping of the file's chunk, unmapped
    // below; the file is not truncated meanwhile.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            c.start as i64,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let mut at = 0usize;
    while at < len {
        let k = (PIECE as usize).min(len - at);
        // SAFETY: inside the mapping.
        let p = unsafe { (m as *mut u8).add(at) };
        // MADV_POPULATE_READ (22): the piece's pages mapped at once.
        // SAFETY: an advice on the mapping's own piece.
        unsafe { libc::madvise(p.cast(), k, 22) };
        // SAFETY: the piece is mapped and readable.
        let src = unsafe { std::slice::from_raw_parts(p, k) };
        h.update(src);
        // SAFETY: this chunk's own range of the destination.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                (base + c.start as usize + at) as *mut u8,
                k,
            )
        };
        at += k;
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(m, len) };
    std::hint::black_box(h.finalize());
}

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
    let chunks = Chunks::of(&[size]);
    assert_eq!(chunks.len() as u64, size.div_ceil(CHUNK));
    // Fresh private anonymous memory, as `UFFDIO_COPY` fills it.
    let region = Region::map(size as usize, false).unwrap();
    let base = region.addr as usize;
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
            let chunks = &chunks;
            s.spawn(move || read_ahead(chunks, path, size, lead, willneed));
        }
        let filled = fillers(
            threads,
            |_| {
                let file = match own {
                    true => std::fs::File::open(path).unwrap(),
                    false => file.try_clone().unwrap(),
                };
                let mut buf = Buffer::new(PIECE as usize);
                while let Some(c) = chunks.next() {
                    if mapped {
                        place_mapped(&file, c, base);
                        continue;
                    }
                    let mut h = blake3::Hasher::new();
                    let mut advised = c.start;
                    read_chunk(&file, path, c, PIECE, buf.as_mut_slice(), |at, data| {
                        let k = data.len() as u64;
                        let want = (at + k + ahead * PIECE).min(c.end);
                        if want > advised {
                            let from = advised.max(at + k);
                            will_need(&file, from, want - from);
                            advised = want;
                        }
                        h.update(data);
                        // SAFETY: this chunk's own range of the region.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                data.as_ptr(),
                                (base + at as usize) as *mut u8,
                                data.len(),
                            )
                        };
                        Ok(())
                    })?;
                    std::hint::black_box(h.finalize());
                }
                Ok(())
            },
            || {},
        );
        filled.unwrap();
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} {:.0} {:.2}",
        args[1],
        secs * 1000.0,
        size as f64 / secs / 1e9
    );
    drop(region);
}
