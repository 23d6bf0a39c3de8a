use super::*;

fn opener(cipher: Cipher) -> (tempfile::TempDir, Sealed, Opener) {
    let root = tempfile::tempdir().unwrap();
    let key = HostKey::load_or_create(root.path()).unwrap();
    let sealed = Sealed::fresh_with(cipher).unwrap();
    let opener = sealed.opener(&key).unwrap();
    (root, sealed, opener)
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn only_pages_files_of_the_images_are_sealed() {
    for rel in ["images/pages-1.img", "images/pages-42.img"] {
        assert!(is_sealed(rel), "{rel}");
    }
    for rel in [
        "images/pagemap-1.img",
        "images/mm-1.img",
        "images/pages-.img",
        "images/x/pages-1.img",
        "control/pages-1.img",
        "dev-shm/pages-1.img",
        "manifest.json",
    ] {
        assert!(!is_sealed(rel), "{rel}");
    }
    let (_root, _, o) = opener(CIPHER);
    assert!(o.file("images/pagemap-1.img").is_none());
}

#[test]
fn any_piece_at_any_offset_seals_and_opens_like_the_whole() {
    for cipher in [Cipher::Aes256Ctr, Cipher::ChaCha20] {
        let (_root, _, o) = opener(cipher);
        let c = o.file("images/pages-1.img").unwrap();
        let plain = bytes(300_000);
        let mut whole = plain.clone();
        c.apply(0, &mut whole);
        assert_ne!(whole, plain, "{cipher}: sealed");
        // Pieces of odd lengths at odd offsets (not block-aligned), sealed
        // one by one, make the same bytes: position addressable.
        let mut pieces = plain.clone();
        let mut at = 0;
        for len in [1usize, 15, 17, 4096, 65_537, 3, 100_000].iter().cycle() {
            if at >= pieces.len() {
                break;
            }
            let end = (at + len).min(pieces.len());
            c.apply(at as u64, &mut pieces[at..end]);
            at = end;
        }
        assert_eq!(pieces, whole, "{cipher}");
        // Opened at an offset far into a large file, on its own.
        let far = 40u64 << 30;
        let mut piece = plain[..5000].to_vec();
        c.apply(far + 13, &mut piece);
        c.apply(far + 13, &mut piece);
        assert_eq!(piece, plain[..5000], "{cipher}: opens back");
        // Across ChaCha20's 128 GiB spans (a nonce each): the same bytes
        // as sealed in two pieces either side.
        let edge = 128u64 << 30;
        let mut across = plain[..4096].to_vec();
        c.apply(edge - 1000, &mut across);
        let mut halves = plain[..4096].to_vec();
        c.apply(edge - 1000, &mut halves[..1000]);
        c.apply(edge, &mut halves[1000..]);
        assert_eq!(across, halves, "{cipher}");
        assert_ne!(
            across[1000..],
            plain[1000..4096],
            "{cipher}: sealed past the edge"
        );
        // Opened back whole.
        c.apply(0, &mut whole);
        assert_eq!(whole, plain, "{cipher}");
    }
}

#[test]
fn each_file_each_artifact_and_each_host_has_its_own_keystream() {
    let (root, sealed, o) = opener(CIPHER);
    let zeros = || vec![0u8; 64];
    let stream = |o: &Opener, rel: &str| {
        let mut b = zeros();
        o.file(rel).unwrap().apply(0, &mut b);
        b
    };
    let one = stream(&o, "images/pages-1.img");
    assert_ne!(one, stream(&o, "images/pages-2.img"), "per file");
    let key = HostKey::load(root.path()).unwrap();
    let again = sealed.opener(&key).unwrap();
    assert_eq!(one, stream(&again, "images/pages-1.img"), "reproducible");
    let other = Sealed::fresh().unwrap().opener(&key).unwrap();
    assert_ne!(one, stream(&other, "images/pages-1.img"), "per artifact");
    let (_host2, _, _) = opener(CIPHER);
    let key2 = HostKey::load(_host2.path()).unwrap();
    let there = sealed.opener(&key2).unwrap();
    assert_ne!(one, stream(&there, "images/pages-1.img"), "per host");
    let bad = Sealed {
        salt: "zz".into(),
        ..sealed
    };
    assert!(bad.opener(&key).is_err());
}

#[test]
fn a_tree_is_sealed_in_place_and_a_file_hole_opens_back_to_zeros() {
    let (_root, _, o) = opener(CIPHER);
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    std::fs::create_dir(&images).unwrap();
    let plain = bytes(3 * PIECE + 123);
    std::fs::write(images.join("pages-1.img"), &plain).unwrap();
    std::fs::write(images.join("pagemap-1.img"), b"pagemap").unwrap();
    // A sparse file: a hole, then data.
    let sparse = File::create(images.join("pages-2.img")).unwrap();
    sparse.write_all_at(b"tail", 2 * PIECE as u64).unwrap();
    drop(sparse);
    let (names, n) = seal_tree(dir.path(), &o).unwrap();
    assert_eq!(names, ["images/pages-1.img", "images/pages-2.img"]);
    assert_eq!(n, plain.len() as u64 + 2 * PIECE as u64 + 4);
    assert_eq!(
        std::fs::read(images.join("pagemap-1.img")).unwrap(),
        b"pagemap",
        "only pages files are sealed"
    );
    let mut got = std::fs::read(images.join("pages-1.img")).unwrap();
    assert_ne!(got, plain);
    o.file("images/pages-1.img").unwrap().apply(0, &mut got);
    assert_eq!(got, plain);
    // Every byte of the file is sealed, a hole's zeros too: a reader opens
    // every byte it reads, so a hole left as one would open to noise.
    let mut got = std::fs::read(images.join("pages-2.img")).unwrap();
    assert!(got[..PIECE].iter().any(|&b| b != 0), "the hole was sealed");
    o.file("images/pages-2.img").unwrap().apply(0, &mut got);
    assert!(got[..2 * PIECE].iter().all(|&b| b == 0));
    assert_eq!(&got[2 * PIECE..], b"tail");
}

#[test]
fn the_manifest_field_names_its_cipher() {
    let s = Sealed {
        cipher: Cipher::Aes256Ctr,
        salt: "00".repeat(16),
    };
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(
        json,
        format!(r#"{{"cipher":"aes-256-ctr","salt":"{}"}}"#, s.salt)
    );
    let back: Sealed = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    assert!(serde_json::from_str::<Sealed>(r#"{"cipher":"rot13","salt":""}"#).is_err());
}
