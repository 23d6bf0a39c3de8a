//! A probe of how a page server could place memory as huge pages, outside
//! CRIU, with a real userfaultfd (docs/page-server.md, "Huge pages").
//! THREADS fillers take 64 MiB chunks of FILE (warm: from the page cache),
//! `pread` each in 2 MiB pieces into their own buffer, BLAKE3 it and place
//! it into a fresh 2 MiB aligned private anonymous mapping in one of these
//! ways (MODEs, each run ROUNDS times, in ABBA order):
//!
//! - `copy`: the mapping registered with a userfaultfd, `UFFDIO_COPY`
//!   (what the page server does);
//! - `copy-advised`: the same, the mapping `MADV_HUGEPAGE`d first;
//! - `unregister-writev`: advised and registered; per 2 MiB piece
//!   `UFFDIO_UNREGISTER` of that piece, then `process_vm_writev` from the
//!   buffer (the kernel's fault path, which allocates a huge page);
//! - `unregister-all-writev`: the same, the whole mapping unregistered
//!   once before the fill (one VMA stays one VMA);
//! - `copy-collapse`: advised, `UFFDIO_COPY`, then `process_madvise(
//!   MADV_COLLAPSE)` of the piece (through a pidfd, as a server would);
//! - `pread-advised`: no userfaultfd: `pread` straight into the advised
//!   mapping (the huge-page fill limit of `scripts/bench.sh restore-limits`,
//!   with the hash added).
//!
//! The fill itself is the page server's (`vsnap_pages::chunks`: the chunks
//! in order, the fillers, the reads; `vsnap_pages::uffd`: the region, the
//! copy and the unregister), only the placing differs.
//!
//! Prints per mode the median GB/s and how much of the mapping was huge
//! (`AnonHugePages` of its smaps entry) after the fill.
//!
//! cargo run --release -p vsnap-e2e --example huge_fill_probe -- THREADS ROUNDS FILE MODE...

use std::time::Instant;

use vsnap_pages::chunks::{fillers, read_chunk, Buffer, Chunks, PIECE};
use vsnap_pages::uffd::{self, Region};

const MADV_COLLAPSE: i32 = 25;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Copy,
    CopyAdvised,
    UnregisterWritev,
    UnregisterAllWritev,
    CopyCollapse,
    PreadAdvised,
}

impl Mode {
    fn parse(s: &str) -> Mode {
        match s {
            "copy" => Mode::Copy,
            "copy-advised" => Mode::CopyAdvised,
            "unregister-writev" => Mode::UnregisterWritev,
            "unregister-all-writev" => Mode::UnregisterAllWritev,
            "copy-collapse" => Mode::CopyCollapse,
            "pread-advised" => Mode::PreadAdvised,
            _ => panic!("unknown mode {s}"),
        }
    }
}

/// A 2 MiB aligned private anonymous mapping of `len` bytes (advised
/// unless `copy`), registered with a new userfaultfd (unless
/// `pread-advised`).
fn region(len: usize, mode: Mode) -> Region {
    let mut r = Region::map(len, true).unwrap();
    if mode != Mode::Copy {
        r.advise(libc::MADV_HUGEPAGE).unwrap();
    }
    if mode != Mode::PreadAdvised {
        r.register(0).unwrap();
    }
    r
}

/// Places `data` at `dst` of this process as `mode` does (`uffd`: the
/// region's descriptor).
fn place(mode: Mode, uffd: &std::os::fd::OwnedFd, pidfd: i32, dst: usize, data: &mut [u8]) {
    let k = data.len();
    match mode {
        Mode::PreadAdvised => unreachable!(),
        Mode::UnregisterWritev | Mode::UnregisterAllWritev => {
            if mode == Mode::UnregisterWritev {
                let (start, end) = (dst as u64, (dst + k) as u64);
                uffd::unregister(uffd, start, end).expect("unregister");
            }
            let local = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut _,
                iov_len: k,
            };
            let remote = libc::iovec {
                iov_base: dst as *mut _,
                iov_len: k,
            };
            // SAFETY: a write of `k` bytes of the buffer into this probe's
            // own mapping (`dst..dst + k` inside it).
            let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
            assert_eq!(n, k as isize, "{}", std::io::Error::last_os_error());
        }
        _ => {
            uffd::copy(uffd, dst as u64, data).expect("UFFDIO_COPY");
            if mode == Mode::CopyCollapse {
                let iov = libc::iovec {
                    iov_base: dst as *mut _,
                    iov_len: k,
                };
                // SAFETY: an advice on this probe's own mapping, through a
                // pidfd of this process.
                let n = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        pidfd,
                        &iov as *const libc::iovec,
                        1,
                        MADV_COLLAPSE,
                        0,
                    )
                };
                assert_eq!(n, k as i64, "{}", std::io::Error::last_os_error());
            }
        }
    }
}

/// kB of `AnonHugePages` of the smaps entries inside `[start, end)`, and
/// how many entries (VMAs) that range is now.
fn anon_huge_kb(start: usize, end: usize) -> (u64, usize) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut inside, mut kb, mut vmas) = (false, 0, 0);
    for line in smaps.lines() {
        let head = line.split(' ').next().unwrap_or("");
        if let Some((a, _)) = head.split_once('-').filter(|_| !line.ends_with(':')) {
            if let Ok(a) = usize::from_str_radix(a, 16) {
                inside = a >= start && a < end;
                vmas += usize::from(inside);
                continue;
            }
        }
        if inside && line.starts_with("AnonHugePages:") {
            kb += line
                .split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    (kb, vmas)
}

fn run(threads: usize, path: &str, mode: Mode) -> (f64, f64) {
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len() / PIECE * PIECE;
    let chunks = Chunks::of(&[size]);
    let region = region(size as usize, mode);
    let start = region.addr as usize;
    // SAFETY: a pidfd of this process.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
    assert!(pidfd >= 0);
    let t = Instant::now();
    if mode == Mode::UnregisterAllWritev {
        uffd::unregister(region.fd(), start as u64, start as u64 + size).expect("unregister");
    }
    let fd = region.uffd.as_ref();
    let filled = fillers(
        threads,
        |_| {
            let mut buf = Buffer::new(PIECE as usize);
            while let Some(c) = chunks.next() {
                let mut h = blake3::Hasher::new();
                if mode == Mode::PreadAdvised {
                    // SAFETY: this chunk's own range of the mapping, which
                    // no other filler writes.
                    let mem = unsafe {
                        std::slice::from_raw_parts_mut(
                            (start + c.start as usize) as *mut u8,
                            c.len() as usize,
                        )
                    };
                    // The whole chunk as the buffer: each piece is read
                    // straight into its place.
                    read_chunk(&file, path, c, PIECE, mem, |_, data| {
                        h.update(data);
                        Ok(())
                    })?;
                } else {
                    let fd = fd.expect("registered");
                    read_chunk(&file, path, c, PIECE, buf.as_mut_slice(), |at, data| {
                        h.update(data);
                        place(mode, fd, pidfd, start + at as usize, data);
                        Ok(())
                    })?;
                }
                std::hint::black_box(h.finalize());
            }
            Ok(())
        },
        || {},
    );
    filled.unwrap();
    let secs = t.elapsed().as_secs_f64();
    let (kb, vmas) = anon_huge_kb(start, start + size as usize);
    if vmas != 1 {
        eprintln!("{mode:?}: the mapping is {vmas} VMAs after the fill");
    }
    let huge = kb as f64 * 1024.0 / size as f64;
    // SAFETY: the pidfd made above, no longer used.
    unsafe { libc::close(pidfd) };
    drop(region);
    (size as f64 / secs / 1e9, huge)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args[0].parse().unwrap();
    let rounds: usize = args[1].parse().unwrap();
    let path = &args[2];
    let modes: Vec<(String, Mode)> = args[3..]
        .iter()
        .map(|a| (a.clone(), Mode::parse(a)))
        .collect();
    let mut res: Vec<Vec<(f64, f64)>> = vec![Vec::new(); modes.len()];
    for r in 0..rounds {
        let mut order: Vec<usize> = (0..modes.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            res[i].push(run(threads, path, modes[i].1));
        }
    }
    for ((name, _), v) in modes.iter().zip(&res) {
        let mut s: Vec<f64> = v.iter().map(|x| x.0).collect();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name:>18}: median {:.2} GB/s  runs {:?}  huge fraction {:?}",
            s[s.len() / 2],
            v.iter()
                .map(|x| (x.0 * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            v.iter()
                .map(|x| (x.1 * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        );
    }
}
