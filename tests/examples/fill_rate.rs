//! The machine's fresh-memory fill rate: how fast the bytes of some files
//! (a restore's page images) can be placed into freshly mapped anonymous
//! memory, as a restore must place them. With T threads each `pread`s its
//! share into its part of one mapping; with `--huge` the mapping is first
//! `madvise(MADV_HUGEPAGE)`d (THP in `madvise` mode). Prints one line:
//! `bytes threads huge ms GB/s`. The first pass warms nothing: run it after
//! the files are in the page cache for the warm figure.
//!
//! cargo run --release -p vsnap-e2e --example fill_rate -- [--huge] THREADS FILE...

use std::os::unix::fs::FileExt;
use std::time::Instant;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let huge = args.first().is_some_and(|a| a == "--huge");
    if huge {
        args.remove(0);
    }
    let threads: usize = args
        .first()
        .and_then(|t| t.parse().ok())
        .filter(|t| *t > 0)
        .expect("usage: fill_rate [--huge] THREADS FILE...");
    let files: Vec<std::fs::File> = args[1..]
        .iter()
        .map(|p| std::fs::File::open(p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .collect();
    let sizes: Vec<usize> = files
        .iter()
        .map(|f| f.metadata().unwrap().len() as usize)
        .collect();
    let total: usize = sizes.iter().sum();
    assert!(total > 0, "no bytes to place");
    // 2 MiB aligned, so huge pages can back it.
    let align = 2 << 20;
    let len = total.div_ceil(align) * align + align;
    // SAFETY: a fresh private anonymous mapping, unmapped at the end.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED, "mmap of {len} bytes");
    let start = (base as usize).div_ceil(align) * align;
    if huge {
        // SAFETY: inside the mapping made above.
        let r =
            unsafe { libc::madvise(start as *mut libc::c_void, len - align, libc::MADV_HUGEPAGE) };
        assert_eq!(r, 0, "madvise(MADV_HUGEPAGE)");
    }
    // Work items: (file, offset in file, destination offset, length), cut in
    // 8 MiB pieces handed out round-robin, so threads share big files.
    let piece = 8 << 20;
    let mut items = Vec::new();
    let mut dest = 0;
    for (i, size) in sizes.iter().enumerate() {
        let mut off = 0;
        while off < *size {
            let n = piece.min(size - off);
            items.push((i, off, dest, n));
            off += n;
            dest += n;
        }
    }
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..threads {
            let (files, items) = (&files, &items);
            s.spawn(move || {
                for (i, off, dest, n) in items.iter().skip(k).step_by(threads) {
                    // SAFETY: each item writes its own range of the mapping.
                    let buf =
                        unsafe { std::slice::from_raw_parts_mut((start + dest) as *mut u8, *n) };
                    files[*i].read_exact_at(buf, *off as u64).expect("pread");
                }
            });
        }
    });
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    println!(
        "{total} {threads} {} {ms:.1} {:.2}",
        if huge { "huge" } else { "4k" },
        total as f64 / ms / 1e6
    );
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(base, len) };
}
