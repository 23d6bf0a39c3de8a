use super::*;
use crate::images::testing::{entry, field, image};
use crate::images::PAGEMAP_MAGIC;
use vsnap_artifact::at_rest::Sealed;
use vsnap_artifact::HostKey;

fn opener() -> (tempfile::TempDir, Opener) {
    let root = tempfile::tempdir().unwrap();
    let key = HostKey::load_or_create(root.path()).unwrap();
    (root, Sealed::fresh().unwrap().opener(&key).unwrap())
}

/// A task (pid 5, pages-1.img) of a stack page, 2 lazy pages and one more
/// page not lazy, and a shared memory pages file (pages-2.img); the pages
/// files sealed. Returns the plaintext of both.
fn sealed_images(images: &Path, o: &Opener) -> (Vec<u8>, Vec<u8>) {
    std::fs::create_dir_all(images).unwrap();
    let mut head = Vec::new();
    field(1, 1, &mut head);
    let pagemap = image(
        PAGEMAP_MAGIC,
        &[
            head,
            entry(0x1000, 1, Some(PE_PRESENT)),
            entry(0x10000, 2, Some(PE_PRESENT | PE_LAZY)),
            entry(0x20000, 1, Some(PE_PRESENT)),
        ],
    );
    std::fs::write(images.join("pagemap-5.img"), pagemap).unwrap();
    std::fs::write(images.join("core-5.img"), b"core").unwrap();
    let task: Vec<u8> = (0..4 * PAGE_SIZE as usize)
        .map(|i| (i % 251 + 1) as u8)
        .collect();
    let shmem = vec![7u8; 3 * PAGE_SIZE as usize];
    for (name, plain) in [("pages-1.img", &task), ("pages-2.img", &shmem)] {
        let mut sealed = plain.clone();
        o.file(&format!("images/{name}"))
            .unwrap()
            .apply(0, &mut sealed);
        std::fs::write(images.join(name), sealed).unwrap();
    }
    (task, shmem)
}

#[test]
fn criu_sees_in_clear_only_the_pages_it_reads_itself() {
    let (_root, o) = opener();
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let (task, shmem) = sealed_images(&images, &o);
    let at = dir.path().join("view");
    let view = CriuView::make(&images, &at, &o, true).unwrap();
    assert_eq!(view.path(), at);
    let page = PAGE_SIZE as usize;
    // The small images are copies (a restored task opens its pagemap from
    // inside its own root: no symlink to the artifact would resolve there).
    let core = at.join("core-5.img");
    assert!(std::fs::symlink_metadata(&core)
        .unwrap()
        .file_type()
        .is_file());
    assert_eq!(std::fs::read(&core).unwrap(), b"core");
    // The task's stack page and its last page in clear, the lazy pages not
    // there at all (a hole of the sparse file: zeros, never the bytes).
    let got = std::fs::read(at.join("pages-1.img")).unwrap();
    assert_eq!(got.len(), task.len(), "its size");
    assert_eq!(got[..page], task[..page]);
    assert!(got[page..3 * page].iter().all(|&b| b == 0));
    assert_eq!(got[3 * page..], task[3 * page..]);
    // Shared memory's pages file: CRIU places it, all of it in clear.
    assert_eq!(std::fs::read(at.join("pages-2.img")).unwrap(), shmem);
    assert_eq!(view.opened, (2 * page + shmem.len()) as u64);
    drop(view);
    assert!(!at.exists(), "the view goes with the restore");
    // Without the page server CRIU reads every page.
    let all = CriuView::make(&images, &at, &o, false).unwrap();
    assert_eq!(std::fs::read(at.join("pages-1.img")).unwrap(), task);
    assert_eq!(all.opened, (task.len() + shmem.len()) as u64);
}

#[test]
fn a_view_left_by_a_dead_restore_is_made_anew() {
    let (_root, o) = opener();
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    sealed_images(&images, &o);
    let at = dir.path().join("view");
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(at.join("pages-1.img"), b"stale").unwrap();
    let _view = CriuView::make(&images, &at, &o, true).unwrap();
    let len = std::fs::metadata(at.join("pages-1.img")).unwrap().len();
    assert_eq!(len, 4 * PAGE_SIZE);
}
