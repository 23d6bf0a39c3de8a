//! The artifact folder the content tests digest and damage.

use super::CHUNK;

/// Covered files (one of them over two chunks) and one that is not.
pub(super) fn artifact() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["images", "control", "work"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let big: Vec<u8> = (0..(CHUNK as usize * 2 + 12345))
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(dir.path().join("images/pages-1.img"), &big).unwrap();
    std::fs::write(dir.path().join("images/core-1.img"), b"core").unwrap();
    std::fs::write(dir.path().join("control/ready.json"), b"{}").unwrap();
    std::fs::write(dir.path().join("work/dump.log"), b"not covered").unwrap();
    dir
}
