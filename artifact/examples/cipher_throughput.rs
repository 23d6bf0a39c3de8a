//! Per-core throughput of each cipher that can seal memory images at rest
//! (`vsnap_artifact::at_rest`), over 2 MiB pieces (the page server's
//! piece): `cargo run -p vsnap-artifact --release --example
//! cipher_throughput` (a release build: without LTO the AES code runs at a
//! third of its speed). A measurement, not a test: docs/benchmarks.md.

use vsnap_artifact::at_rest::{Cipher, Sealed};
use vsnap_artifact::HostKey;

fn main() {
    let root = tempfile::tempdir().expect("a scratch folder");
    let key = HostKey::load_or_create(root.path()).expect("a host key");
    for cipher in [Cipher::Aes256Ctr, Cipher::ChaCha20] {
        let opener = Sealed::fresh_with(cipher)
            .and_then(|s| s.opener(&key))
            .expect("a sealing");
        let c = opener
            .file("images/pages-1.img")
            .expect("a pages file is sealed");
        let mut buf = vec![1u8; 2 << 20];
        let rounds = 512u64; // 1 GiB
        let t = std::time::Instant::now();
        for i in 0..rounds {
            c.apply(i * buf.len() as u64, &mut buf);
        }
        let s = t.elapsed().as_secs_f64();
        let gib = (rounds * buf.len() as u64) as f64 / (1u64 << 30) as f64;
        println!("{cipher}: {:.2} GiB/s on one core", gib / s);
    }
}
