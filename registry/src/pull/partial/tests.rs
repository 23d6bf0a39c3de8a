use std::os::unix::fs::MetadataExt;

use vsnap_artifact::encryption::EncryptionKey;

use super::*;
use crate::index::FileEntry;

/// Three chunks: `a` twice in the pages (and once more in another file),
/// `b` once, `c` a control file.
struct Fixture {
    root: tempfile::TempDir,
    chunks: BTreeMap<&'static str, Vec<u8>>,
    sealer: Option<Sealer>,
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

impl Fixture {
    fn new(sealed: bool) -> Self {
        let chunks = [
            ("a", bytes(1, 5000)),
            ("b", bytes(2, 7000)),
            ("c", bytes(3, 10)),
        ]
        .into_iter()
        .collect();
        let sealer = sealed.then(|| Sealer::new(&EncryptionKey::from_secret([7; 32])));
        Fixture {
            root: tempfile::tempdir().unwrap(),
            chunks,
            sealer,
        }
    }

    /// The layer of chunk `k`: the chunk, or its envelope.
    fn layer(&self, k: &str) -> Vec<u8> {
        match &self.sealer {
            Some(s) => s.seal(&self.chunks[k]),
            None => self.chunks[k].clone(),
        }
    }

    fn digest(&self, k: &str) -> String {
        sha256_digest(&self.layer(k))
    }

    /// The OCI descriptor of chunk `k`'s layer.
    fn descriptor(&self, k: &str) -> OciDescriptor {
        OciDescriptor {
            digest: self.digest(k),
            size: self.layer(k).len() as i64,
            ..Default::default()
        }
    }

    /// The file's bytes as the chunks `ks` make them.
    fn content(&self, ks: &[&str]) -> Vec<u8> {
        ks.iter().flat_map(|k| self.chunks[k].clone()).collect()
    }

    fn files(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        vec![
            ("control/ready.json", vec!["c"]),
            ("images/pages-1.img", vec!["a", "b", "a"]),
            ("images/pages-2.img", vec!["a"]),
        ]
    }

    fn spec(&self, digest: &str) -> Spec {
        let mut layers = BTreeMap::new();
        let files = self
            .files()
            .into_iter()
            .map(|(path, ks)| {
                for k in &ks {
                    layers.insert(self.digest(k), self.layer(k).len() as u64);
                }
                FileEntry {
                    path: path.into(),
                    mode: 0o644,
                    size: self.content(&ks).len() as u64,
                    chunks: ks.iter().map(|k| self.digest(k)).collect(),
                }
            })
            .collect::<Vec<_>>();
        let sizes: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        let manifest = crate::index::tests::manifest(&sizes);
        Spec {
            root: self.root.path().to_path_buf(),
            name: "pulled".into(),
            digest: digest.into(),
            config: ArtifactConfig::new(&manifest, crate::chunking::PARAMS, files),
            layers,
            sealer: self.sealer.clone(),
            threads: 2,
            seal_at_rest: false,
            check_landing: None,
        }
    }

    fn open(&self, digest: &str) -> (Partial, BTreeSet<String>) {
        Partial::open(&self.spec(digest)).unwrap()
    }

    fn land(&self, p: &Partial, k: &str) {
        p.land(&self.digest(k), self.layer(k), "its files").unwrap();
    }

    fn tree(&self) -> PathBuf {
        self.root.path().join(".pull/partial/pulled/tree")
    }

    fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.tree().join(rel)).unwrap()
    }

    /// The manifest of the artifact the chunks make, its contents digested
    /// from a tree written whole.
    fn manifest(&self) -> Manifest {
        let whole = self.root.path().join("whole");
        for (path, ks) in self.files() {
            let p = whole.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, self.content(&ks)).unwrap();
        }
        let mut m = crate::index::tests::manifest(&[]);
        m.name = "pulled".into();
        m.contents = content::digest(&whole, 1).unwrap();
        std::fs::remove_dir_all(&whole).unwrap();
        m
    }
}

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_chunk_lands_once_at_each_of_its_places_and_only_then_is_recorded() {
    for sealed in [false, true] {
        let f = Fixture::new(sealed);
        let (p, landed) = f.open(DIGEST);
        assert!(landed.is_empty());
        // Every file is made at its size, holding nothing yet.
        let pages = f.tree().join("images/pages-1.img");
        let md = std::fs::metadata(&pages).unwrap();
        assert_eq!(md.len(), 17000);
        assert_eq!(md.blocks(), 0, "sparse until chunks land");
        f.land(&p, "a");
        let one = f.read("images/pages-1.img");
        assert_eq!(&one[..5000], &f.chunks["a"][..]);
        assert_eq!(&one[12000..], &f.chunks["a"][..], "its second place");
        assert_eq!(f.read("images/pages-2.img"), f.chunks["a"], "another file");
        assert!(one[5000..12000].iter().all(|b| *b == 0), "b not landed yet");
        let journal = f.root.path().join(".pull/partial/pulled/landed");
        assert_eq!(lines(&journal), [f.digest("a")]);
        // Each place recorded as arrived, for a restore that streams.
        let arrived: Vec<(String, u64, u64)> =
            lines(&f.root.path().join(".pull/partial/pulled/arrived"))
                .iter()
                .map(|l| {
                    let a = vsnap_artifact::arrivals::Arrival::parse(l).unwrap();
                    (a.file, a.offset, a.len)
                })
                .collect();
        assert_eq!(
            arrived,
            [
                ("images/pages-1.img".into(), 0, 5000),
                ("images/pages-1.img".into(), 12000, 5000),
                ("images/pages-2.img".into(), 0, 5000),
            ]
        );
        // Nothing but the tree and the records: no layer, no ciphertext.
        let mut kept: Vec<String> = std::fs::read_dir(f.root.path().join(".pull/partial/pulled"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        kept.sort();
        assert_eq!(kept, ["arrived", "digest", "landed", "tree"]);

        // A layer whose bytes do not open (sealed) or whose size is not
        // its places' is refused naming the blob, and is not recorded.
        let mut bad = f.layer("b");
        bad.pop();
        let e = p
            .land(&f.digest("b"), bad, "images/pages-1.img")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("blob {}", f.digest("b"))) && e.contains("images/pages-1.img"),
            "{e}"
        );
        if sealed {
            assert!(
                e.contains("does not decrypt") && e.contains("fleet-enc:"),
                "{e}"
            );
        }
        assert_eq!(lines(&journal), [f.digest("a")]);
    }
}

#[test]
fn a_resumed_pull_keeps_what_still_holds_and_fetches_the_rest() {
    for sealed in [false, true] {
        let f = Fixture::new(sealed);
        let (p, _) = f.open(DIGEST);
        f.land(&p, "a");
        f.land(&p, "b");
        f.land(&p, "c");
        drop(p);
        // The disk rotted under one place of c; a and b hold.
        std::fs::write(f.tree().join("control/ready.json"), b"0123456789").unwrap();
        let (p, landed) = f.open(DIGEST);
        let want: BTreeSet<String> = [f.digest("a"), f.digest("b")].into();
        assert_eq!(landed, want, "sealed {sealed}");
        assert_eq!(
            f.read("images/pages-2.img"),
            f.chunks["a"],
            "kept as it was"
        );
        // A place of a that no longer holds its bytes: a is fetched again.
        drop(p);
        let two = f.tree().join("images/pages-2.img");
        let mut bytes = std::fs::read(&two).unwrap();
        bytes[4999] ^= 1;
        std::fs::write(&two, bytes).unwrap();
        // A file cut short is made whole (at its size) again.
        std::fs::OpenOptions::new()
            .write(true)
            .open(f.tree().join("images/pages-1.img"))
            .unwrap()
            .set_len(100)
            .unwrap();
        let (_, landed) = f.open(DIGEST);
        assert_eq!(landed, BTreeSet::new(), "sealed {sealed}");
        assert_eq!(
            std::fs::metadata(f.tree().join("images/pages-1.img"))
                .unwrap()
                .len(),
            17000
        );
    }
}

#[test]
fn a_partial_pull_of_another_digest_is_started_again() {
    let f = Fixture::new(false);
    let (p, _) = f.open(DIGEST);
    f.land(&p, "a");
    drop(p);
    let (_, landed) = f.open(OTHER);
    assert!(landed.is_empty());
    assert!(
        f.read("images/pages-2.img").iter().all(|b| *b == 0),
        "the other digest's bytes are gone"
    );
    let digest = f.root.path().join(".pull/partial/pulled/digest");
    assert_eq!(std::fs::read_to_string(digest).unwrap().trim(), OTHER);
}

#[test]
fn the_layers_to_fetch_come_in_the_order_of_their_first_place() {
    let f = Fixture::new(false);
    let (p, _) = f.open(DIGEST);
    let layer = |k: &str| f.descriptor(k);
    let layers = vec![layer("b"), layer("a"), layer("c")];
    let order: Vec<&str> = p
        .to_fetch(&layers, &BTreeSet::new())
        .iter()
        .map(|l| l.digest.as_str())
        .collect();
    assert_eq!(order, [f.digest("c"), f.digest("a"), f.digest("b")]);
    let landed: BTreeSet<String> = [f.digest("a")].into();
    assert_eq!(p.to_fetch(&layers, &landed).len(), 2);
}

#[test]
fn a_whole_tree_is_published_in_place_and_the_partial_pull_removed() {
    for sealed in [false, true] {
        let f = Fixture::new(sealed);
        let root = f.root.path();
        let (p, _) = f.open(DIGEST);
        for k in ["a", "b", "c"] {
            f.land(&p, k);
        }
        // A name in use: refused, and what landed stays for the next try.
        let held = ArtifactLock::exclusive(root, "pulled").unwrap();
        let e = p.publish(root, f.manifest(), 2).unwrap_err().to_string();
        assert!(e.contains("pulled"), "{e}");
        drop(held);
        let (p, landed) = f.open(DIGEST);
        assert_eq!(landed.len(), 3);
        let pages = f.tree().join("images/pages-1.img");
        let inode = std::fs::metadata(&pages).unwrap().ino();
        p.publish(root, f.manifest(), 2).unwrap();
        let published = root.join("pulled/images/pages-1.img");
        assert_eq!(
            std::fs::metadata(&published).unwrap().ino(),
            inode,
            "renamed, not copied"
        );
        assert_eq!(
            std::fs::read(&published).unwrap(),
            f.content(&["a", "b", "a"])
        );
        Manifest::load_verified(root, "pulled").unwrap();
        assert!(!root.join(".pull/partial/pulled").exists());
        std::fs::remove_dir_all(root.join("pulled")).unwrap();
    }
}

#[test]
fn a_tree_that_does_not_verify_is_not_published_and_is_removed() {
    let f = Fixture::new(false);
    let root = f.root.path();
    let (p, _) = f.open(DIGEST);
    for k in ["a", "b", "c"] {
        f.land(&p, k);
    }
    let mut manifest = f.manifest();
    let d = manifest.contents.get_mut("images/pages-2.img").unwrap();
    d.chunks[0] = "00".repeat(32);
    let e = p.publish(root, manifest, 2).unwrap_err().to_string();
    assert!(e.contains("images/pages-2.img"), "{e}");
    assert!(!root.join("pulled").exists());
    assert!(!root.join(".pull/partial/pulled").exists());
}

/// Checked as it lands: the landing that makes a content chunk whole
/// fails when the chunk is not the manifest's, naming the file and the
/// chunk; a chunk checked so is not hashed again at the publish, one an
/// earlier pull landed is.
#[test]
fn each_content_chunk_is_checked_when_its_last_layer_lands() {
    for sealed in [false, true] {
        let f = Fixture::new(sealed);
        let root = f.root.path();
        let mut broken = f.manifest();
        broken
            .contents
            .get_mut("images/pages-2.img")
            .unwrap()
            .chunks[0] = "00".repeat(32);
        let checking = |m: &Manifest| Spec {
            check_landing: Some(m.contents.clone()),
            seal_at_rest: sealed,
            ..f.spec(DIGEST)
        };
        let (p, _) = Partial::open(&checking(&broken)).unwrap();
        let e = p
            .land(&f.digest("a"), f.layer("a"), "its files")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("images/pages-2.img chunk 0") && e.contains("does not match its digest"),
            "{e}"
        );
        drop(p);
        std::fs::remove_dir_all(root.join(".pull")).unwrap();

        // Every chunk checked as it landed: a byte changed on disk
        // afterwards (nothing of vsnap writes a landed place again) is not
        // read by the publish, which hashes nothing.
        let (p, _) = Partial::open(&checking(&f.manifest())).unwrap();
        for k in ["a", "b", "c"] {
            f.land(&p, k);
        }
        let ready = f.tree().join("control/ready.json");
        let mut bytes = std::fs::read(&ready).unwrap();
        bytes[0] ^= 1;
        std::fs::write(&ready, bytes).unwrap();
        p.publish(root, f.manifest(), 2).unwrap();
        std::fs::remove_dir_all(root.join("pulled")).unwrap();

        // Landed by an earlier pull, not checked then: checked at the
        // publish.
        let unchecked = Spec {
            check_landing: None,
            ..checking(&broken)
        };
        let (p, _) = Partial::open(&unchecked).unwrap();
        f.land(&p, "a");
        drop(p);
        let (p, landed) = Partial::open(&checking(&broken)).unwrap();
        assert_eq!(landed.len(), 1, "sealed {sealed}");
        f.land(&p, "b");
        f.land(&p, "c");
        let e = p.publish(root, broken, 2).unwrap_err().to_string();
        assert!(e.contains("images/pages-2.img"), "{e}");
        assert!(!root.join("pulled").exists());
    }
}

#[test]
fn a_pull_that_cannot_fit_is_refused_naming_what_it_needs() {
    let root = Path::new("/var/lib/vsnap/artifacts");
    room(root, 100, 300, 200).unwrap();
    let e = room(root, 99, 300, 200).unwrap_err().to_string();
    assert_eq!(
        e,
        "pull: /var/lib/vsnap/artifacts: 99 bytes free, the artifact needs 100 more (200 of its 300 bytes are here)"
    );
}

#[test]
fn a_streamed_pull_fetches_what_criu_reads_first_and_a_wanted_chunk_next() {
    let f = Fixture::new(false);
    let (p, _) = f.open(DIGEST);
    let layer = |k: &str| f.descriptor(k);
    let (a, b, c) = (layer("a"), layer("b"), layer("c"));
    let digests =
        |ls: Vec<&OciDescriptor>| -> Vec<String> { ls.iter().map(|l| l.digest.clone()).collect() };
    // Before the images are read: only the pages files' chunks can wait.
    let (early, late) = p.split_lazy(vec![&a, &b, &c], None);
    assert_eq!(digests(early), [f.digest("c")]);
    assert_eq!(digests(late.clone()), [f.digest("a"), f.digest("b")]);
    // pages-1.img all lazy, pages-2.img CRIU's own: `a` has a place there.
    let spans = [("images/pages-1.img".to_string(), vec![(0, 17000)])].into();
    let (early, late) = p.split_lazy(late, Some(&spans));
    assert_eq!(digests(early), [f.digest("a")]);
    assert_eq!(digests(late), [f.digest("b")]);
    // A page of `b` asked for ahead of order.
    let mut wanted = vsnap_artifact::arrivals::Coverage::default();
    wanted.add(&vsnap_artifact::arrivals::Arrival::now(
        "images/pages-1.img",
        6000,
        4096,
    ));
    assert!(p.wanted(&f.digest("b"), &wanted));
    assert!(!p.wanted(&f.digest("a"), &wanted) && !p.wanted(&f.digest("c"), &wanted));
}

/// Encrypted in the registry or not, the pulled copy's pages files are
/// sealed at rest with this host's key as each chunk lands (the control
/// file stays in clear), a pull taking the folder over seals alike and
/// keeps what landed, and the published manifest records the sealing.
#[test]
fn with_seal_at_rest_each_pages_chunk_is_sealed_where_it_lands() {
    use vsnap_artifact::at_rest::Sealed;
    for encrypted in [false, true] {
        let f = Fixture::new(encrypted);
        let root = f.root.path();
        let spec = Spec {
            seal_at_rest: true,
            ..f.spec(DIGEST)
        };
        let (p, _) = Partial::open(&spec).unwrap();
        f.land(&p, "a");
        f.land(&p, "c");
        drop(p);
        let dir = root.join(".pull/partial/pulled");
        let sealed: Sealed =
            serde_json::from_slice(&std::fs::read(dir.join("sealed")).unwrap()).unwrap();
        let opener = sealed.opener(&HostKey::load(root).unwrap()).unwrap();
        let on_disk = f.read("images/pages-2.img");
        assert_ne!(on_disk, f.chunks["a"], "no plaintext of a pages file");
        let mut opened = on_disk.clone();
        opener
            .file("images/pages-2.img")
            .unwrap()
            .apply(0, &mut opened);
        assert_eq!(opened, f.chunks["a"]);
        assert_eq!(f.read("control/ready.json"), f.chunks["c"], "in clear");
        // Taken over: the same sealing, what landed rechecked opened.
        let (p, landed) = Partial::open(&spec).unwrap();
        assert_eq!(landed.len(), 2, "encrypted {encrypted}");
        f.land(&p, "b");
        p.publish(root, f.manifest(), 2).unwrap();
        let m = Manifest::load_verified(root, "pulled").unwrap();
        assert_eq!(m.sealed, Some(sealed));
        let mut whole = std::fs::read(root.join("pulled/images/pages-1.img")).unwrap();
        opener
            .file("images/pages-1.img")
            .unwrap()
            .apply(0, &mut whole);
        assert_eq!(whole, f.content(&["a", "b", "a"]));
        let dir = vsnap_artifact::path(root, "pulled");
        content::verify_opened(&dir, &m.contents, 1, Some(&opener)).unwrap();
        assert!(
            content::verify(&dir, &m.contents, 1).is_err(),
            "sealed on disk"
        );
        std::fs::remove_dir_all(root.join("pulled")).unwrap();
    }
}
