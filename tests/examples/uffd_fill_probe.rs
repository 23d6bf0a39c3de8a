//! A probe of the page server's warm fill outside CRIU, with a real
//! userfaultfd: THREADS fillers take 64 MiB chunks of FILE (from the page
//! cache), `pread` each in PIECE-KiB pieces into their own buffer, BLAKE3 it
//! and `UFFDIO_COPY` it into a fresh anonymous mapping registered with a
//! userfaultfd, with the page server's own pieces (`vsnap_pages::chunks`:
//! the chunks in order, the fillers, the reads; `vsnap_pages::uffd`: the
//! region and the copy). Runs each PIECE given ROUNDS times, in ABBA
//! order, and prints GB/s. `SKIP_READ=1` copies the buffer without
//! reading, `SKIP_HASH=1` places without hashing: what each step costs
//! (docs/page-server.md).
//!
//! cargo run --release -p vsnap-e2e --example uffd_fill_probe -- THREADS ROUNDS FILE PIECE_KIB...

use std::time::Instant;

use vsnap_pages::chunks::{fillers, read_chunk, Buffer, Chunks, PIECE};
use vsnap_pages::uffd::{self, Region};

fn run(threads: usize, path: &str, piece: u64) -> f64 {
    let piece = piece.min(PIECE);
    let file = std::fs::File::open(path).unwrap();
    let size = file.metadata().unwrap().len();
    let chunks = Chunks::of(&[size]);
    let mut region = Region::map(size as usize, false).unwrap();
    region.register(0).unwrap();
    let (base, fd) = (region.addr as u64, region.fd());
    let skip_read = std::env::var("SKIP_READ").is_ok();
    let skip_hash = std::env::var("SKIP_HASH").is_ok();
    let t = Instant::now();
    let filled = fillers(
        threads,
        |_| {
            let mut buf = Buffer::new(PIECE as usize);
            // Bytes to copy where nothing is read.
            buf.as_mut_slice().fill(0);
            while let Some(c) = chunks.next() {
                let mut h = blake3::Hasher::new();
                let mut place = |at: u64, data: &mut [u8]| {
                    if !skip_hash {
                        h.update(data);
                    }
                    uffd::copy(fd, base + at, data).expect("UFFDIO_COPY");
                    Ok(())
                };
                if skip_read {
                    let mut at = c.start;
                    while at < c.end {
                        let k = piece.min(c.end - at);
                        place(at, &mut buf.as_mut_slice()[..k as usize])?;
                        at += k;
                    }
                } else {
                    read_chunk(&file, path, c, piece, buf.as_mut_slice(), place)?;
                }
                std::hint::black_box(h.finalize());
            }
            Ok(())
        },
        || {},
    );
    filled.unwrap();
    let secs = t.elapsed().as_secs_f64();
    drop(region);
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
