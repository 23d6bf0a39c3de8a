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
//! Prints per mode the median GB/s and how much of the mapping was huge
//! (`AnonHugePages` of its smaps entry) after the fill.
//!
//! cargo run --release -p vsnap-e2e --example huge_fill_probe -- THREADS ROUNDS FILE MODE...

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const CHUNK: u64 = 64 << 20;
const PIECE: u64 = 2 << 20;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
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
/// `pread-advised`): (mapping, start, descriptor or -1).
fn region(len: usize, mode: Mode) -> (usize, usize, i32) {
    let total = len + PIECE as usize;
    // SAFETY: plain syscalls on memory and a descriptor this probe owns.
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        let start = (base as usize).div_ceil(PIECE as usize) * PIECE as usize;
        if mode != Mode::Copy {
            assert_eq!(libc::madvise(start as *mut _, len, libc::MADV_HUGEPAGE), 0);
        }
        if mode == Mode::PreadAdvised {
            return (base as usize, start, -1);
        }
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32;
        assert!(fd >= 0);
        let mut api = [0xAAu64, 0, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()), 0);
        let mut reg = [start as u64, len as u64, 1, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_REGISTER, reg.as_mut_ptr()), 0);
        (base as usize, start, fd)
    }
}

/// Places `data` at `dst` of this process as `mode` does.
fn place(mode: Mode, fd: i32, pidfd: i32, dst: usize, data: &mut [u8]) {
    let k = data.len();
    // SAFETY: syscalls on this probe's own mapping (`dst..dst + k` inside
    // it) and buffer (`k` bytes).
    unsafe {
        match mode {
            Mode::PreadAdvised => unreachable!(),
            Mode::UnregisterWritev | Mode::UnregisterAllWritev => {
                if mode == Mode::UnregisterWritev {
                    let mut range = [dst as u64, k as u64];
                    let rc = libc::ioctl(fd, UFFDIO_UNREGISTER, range.as_mut_ptr());
                    assert_eq!(rc, 0, "unregister: {}", std::io::Error::last_os_error());
                }
                let local = libc::iovec {
                    iov_base: data.as_mut_ptr() as *mut _,
                    iov_len: k,
                };
                let remote = libc::iovec {
                    iov_base: dst as *mut _,
                    iov_len: k,
                };
                let n = libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0);
                assert_eq!(n, k as isize, "{}", std::io::Error::last_os_error());
            }
            _ => {
                let mut cp = [dst as u64, data.as_ptr() as u64, k as u64, 0u64, 0u64];
                let rc = libc::ioctl(fd, UFFDIO_COPY, cp.as_mut_ptr());
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                if mode == Mode::CopyCollapse {
                    let iov = libc::iovec {
                        iov_base: dst as *mut _,
                        iov_len: k,
                    };
                    let n = libc::syscall(
                        libc::SYS_process_madvise,
                        pidfd,
                        &iov as *const libc::iovec,
                        1,
                        MADV_COLLAPSE,
                        0,
                    );
                    assert_eq!(n, k as i64, "{}", std::io::Error::last_os_error());
                }
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
    let chunks = size.div_ceil(CHUNK) as usize;
    let (base, start, fd) = region(size as usize, mode);
    // SAFETY: a pidfd of this process.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
    assert!(pidfd >= 0);
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    if mode == Mode::UnregisterAllWritev {
        let mut range = [start as u64, size];
        // SAFETY: the whole registered range, on its own descriptor.
        let rc = unsafe { libc::ioctl(fd, UFFDIO_UNREGISTER, range.as_mut_ptr()) };
        assert_eq!(rc, 0, "unregister: {}", std::io::Error::last_os_error());
    }
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (next, file) = (&next, file.try_clone().unwrap());
            s.spawn(move || {
                let mut buf = vec![0u8; PIECE as usize];
                loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks {
                        return;
                    }
                    let (from, end) = (c as u64 * CHUNK, ((c as u64 + 1) * CHUNK).min(size));
                    let mut h = blake3::Hasher::new();
                    let mut at = from;
                    while at < end {
                        let k = PIECE.min(end - at) as usize;
                        let dst = start + at as usize;
                        if mode == Mode::PreadAdvised {
                            // SAFETY: this chunk's own range of the mapping.
                            let mem = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, k) };
                            file.read_exact_at(mem, at).unwrap();
                            h.update(mem);
                        } else {
                            file.read_exact_at(&mut buf[..k], at).unwrap();
                            h.update(&buf[..k]);
                            place(mode, fd, pidfd, dst, &mut buf[..k]);
                        }
                        at += k as u64;
                    }
                    std::hint::black_box(h.finalize());
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let (kb, vmas) = anon_huge_kb(start, start + size as usize);
    if vmas != 1 {
        eprintln!("{mode:?}: the mapping is {vmas} VMAs after the fill");
    }
    let huge = kb as f64 * 1024.0 / size as f64;
    // SAFETY: the mapping and descriptors made above, no longer used.
    unsafe {
        if fd >= 0 {
            libc::close(fd);
        }
        libc::close(pidfd);
        libc::munmap(base as *mut _, size as usize + PIECE as usize);
    }
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
