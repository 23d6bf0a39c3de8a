//! The machine's fresh-memory fill rate: how fast the bytes of some files
//! (a restore's page images) can be placed into freshly mapped anonymous
//! memory, as a restore must place them. T threads `pread` them into one
//! mapping in the page server's order (64 MiB chunks, to whichever thread
//! asks next: `vsnap_pages::chunks`); with `--huge` the mapping is first
//! `madvise(MADV_HUGEPAGE)`d (THP in `madvise` mode). Prints one line:
//! `bytes threads huge ms GB/s`. The first pass warms nothing: run it after
//! the files are in the page cache for the warm figure. The probe itself is
//! `vsnap_e2e::bench::fill`, which `scripts/bench.sh restore-limits` uses.
//!
//! cargo run --release -p vsnap-e2e --example fill_rate -- [--huge] THREADS FILE...

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
    let paths: Vec<std::path::PathBuf> = args[1..].iter().map(Into::into).collect();
    let (bytes, secs) = vsnap_e2e::bench::fill(&paths, threads, huge);
    let ms = secs * 1000.0;
    println!(
        "{bytes} {threads} {} {ms:.1} {:.2}",
        if huge { "huge" } else { "4k" },
        bytes as f64 / ms / 1e6
    );
}
