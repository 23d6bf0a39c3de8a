//! Recording the digests of an artifact's covered files at capture, and
//! checking the files against them before a restore; the errors that name
//! the damage.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::files::{covered_files, open_all, open_regular};
use super::hash::{chunk_count, hash_chunk, hash_chunks, hash_chunks_until};
use super::{Contents, FileDigest, CHUNK};
use crate::at_rest::{FileCipher, Opener};
use crate::error::{ArtifactError, Result};

/// The error naming chunk `chunk` of `rel` in `dir` as damaged: what a
/// verification says, and what a restore told of the damage by another
/// restore of the same artifact says.
pub fn chunk_mismatch(dir: &Path, rel: &str, chunk: usize, size: u64) -> ArtifactError {
    let start = chunk as u64 * CHUNK;
    let end = (start + CHUNK).min(size).saturating_sub(1);
    damaged(
        dir,
        rel,
        format!("chunk {chunk} (bytes {start}-{end}) does not match its digest"),
    )
}

/// The digests of every covered file of `dir` (at capture, in staging).
pub fn digest(dir: &Path, threads: usize) -> Result<Contents> {
    digest_with(dir, threads, Contents::new())
}

/// As [`digest`], with the digests in `written` (files hashed as they were
/// written, [`WrittenDigest`](super::WrittenDigest)) taken as they are
/// rather than read again. Each must name a covered file that holds its
/// recorded size.
pub fn digest_with(dir: &Path, threads: usize, written: Contents) -> Result<Contents> {
    let mut covered = covered_files(dir)?;
    for (rel, d) in &written {
        let Ok(i) = covered.binary_search(rel) else {
            return Err(damaged(
                dir,
                rel,
                "was hashed as it was written but is not a covered file".into(),
            ));
        };
        covered.remove(i);
        let (_, size) = open_regular(dir, rel)?;
        if size != d.size {
            return Err(damaged(
                dir,
                rel,
                format!(
                    "holds {size} bytes, {} were hashed as it was written",
                    d.size
                ),
            ));
        }
    }
    let files = open_all(dir, &covered)?;
    let digests: Vec<Mutex<Vec<String>>> = files
        .iter()
        .map(|(_, _, size)| Mutex::new(vec![String::new(); chunk_count(*size)]))
        .collect();
    hash_chunks(dir, &files, threads, &|file, chunk, digest| {
        digests[file].lock().expect("lock")[chunk] = digest;
        Ok(())
    })?;
    Ok(files
        .into_iter()
        .zip(digests)
        .map(|((rel, _, size), chunks)| {
            let chunks = chunks.into_inner().expect("lock");
            (rel, FileDigest { size, chunks })
        })
        .chain(written)
        .collect())
}

/// Checks that the covered files of `dir` are exactly those of `contents`,
/// each of its recorded size: no hashing (`vsnap verify --quick`).
pub fn verify_sizes(dir: &Path, contents: &Contents) -> Result<Vec<(String, File, u64)>> {
    let present = covered_files(dir)?;
    for rel in &present {
        if !contents.contains_key(rel) {
            return Err(damaged(
                dir,
                rel,
                "is not part of the artifact as captured".into(),
            ));
        }
    }
    for rel in contents.keys() {
        if present.binary_search(rel).is_err() {
            return Err(damaged(dir, rel, "is missing".into()));
        }
    }
    let files = open_all(dir, &present)?;
    for (rel, _, size) in &files {
        let want = contents[rel].size;
        if *size != want {
            return Err(damaged(
                dir,
                rel,
                format!("holds {size} bytes, the manifest says {want}"),
            ));
        }
    }
    Ok(files)
}

/// Checks every covered file of `dir` against `contents`, chunk by chunk,
/// with `threads` threads. The error names the file and the chunk.
pub fn verify(dir: &Path, contents: &Contents, threads: usize) -> Result<()> {
    verify_except(dir, contents, threads, &[])
}

/// As [`verify`], the files sealed at rest opened with `opener` (the
/// manifest's `sealed`, with this host's key) as they are hashed.
pub fn verify_opened(
    dir: &Path,
    contents: &Contents,
    threads: usize,
    opener: Option<&Opener>,
) -> Result<()> {
    verify_opened_except(dir, contents, threads, opener, &|_, _| false)
}

/// As [`verify_opened`], without hashing the chunks `checked(rel, chunk)`
/// names (every file's set membership and size are still checked): for a
/// writer that checked those chunks with [`verify_chunk`] as each became
/// whole (a pull, as its chunks land).
pub fn verify_opened_except(
    dir: &Path,
    contents: &Contents,
    threads: usize,
    opener: Option<&Opener>,
    checked: &(dyn Fn(&str, usize) -> bool + Sync),
) -> Result<()> {
    let files = verify_sizes(dir, contents)?;
    let skip = |file: usize, chunk: usize| checked(&files[file].0, chunk);
    check_chunks(
        dir,
        contents,
        &files,
        threads,
        &skip,
        opener,
        &AtomicBool::new(false),
    )
}

/// Checks chunk `chunk` of the covered file `rel` of `dir` against
/// `digest`, opened with `sealed` where sealed at rest. The error is the
/// one [`verify`] gives for that chunk.
pub fn verify_chunk(
    dir: &Path,
    rel: &str,
    digest: &FileDigest,
    chunk: usize,
    sealed: Option<&FileCipher>,
) -> Result<()> {
    let (file, _) = open_regular(dir, rel)?;
    let got = hash_chunk(&file, digest.size, chunk, sealed)
        .map_err(|e| ArtifactError::io(&dir.join(rel), "read", e))?;
    if digest.chunks.get(chunk) == Some(&got) {
        return Ok(());
    }
    Err(chunk_mismatch(dir, rel, chunk, digest.size))
}

/// As [`verify`], without hashing the files named in `hashed_elsewhere`
/// (their set membership and size are still checked): for a reader that
/// checks those chunks itself as it uses them
/// ([`ChunkDigest`](super::ChunkDigest)).
pub fn verify_except(
    dir: &Path,
    contents: &Contents,
    threads: usize,
    hashed_elsewhere: &[String],
) -> Result<()> {
    verify_except_until(
        dir,
        contents,
        threads,
        hashed_elsewhere,
        None,
        &AtomicBool::new(false),
    )
}

/// As [`verify_except`], stopping with [`ArtifactError::Stopped`] once
/// `stop` is set (a restore that was killed, or ran out of time); the
/// files sealed at rest opened with `opener` as they are hashed.
pub fn verify_except_until(
    dir: &Path,
    contents: &Contents,
    threads: usize,
    hashed_elsewhere: &[String],
    opener: Option<&Opener>,
    stop: &AtomicBool,
) -> Result<()> {
    let mut files = verify_sizes(dir, contents)?;
    files.retain(|(rel, _, _)| !hashed_elsewhere.contains(rel));
    check_chunks(dir, contents, &files, threads, &|_, _| false, opener, stop)
}

/// Hashes the chunks of `files` but those `skip` names and checks each
/// against `contents`; the error names the file and the chunk.
fn check_chunks(
    dir: &Path,
    contents: &Contents,
    files: &[(String, File, u64)],
    threads: usize,
    skip: &(dyn Fn(usize, usize) -> bool + Sync),
    opener: Option<&Opener>,
    stop: &AtomicBool,
) -> Result<()> {
    let each = |file: usize, chunk: usize, digest: String| {
        let rel = &files[file].0;
        let want = contents[rel].chunks.get(chunk).map(String::as_str);
        if want == Some(digest.as_str()) {
            return Ok(());
        }
        Err(chunk_mismatch(dir, rel, chunk, files[file].2))
    };
    hash_chunks_until(dir, files, threads, skip, &each, opener, stop)
}

pub(super) fn damaged(dir: &Path, rel: &str, what: String) -> ArtifactError {
    ArtifactError::Damaged(format!("{}: {rel} {what}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::super::testing::artifact;
    use super::*;

    fn err(dir: &Path, c: &Contents) -> String {
        verify(dir, c, 2).unwrap_err().to_string()
    }

    #[test]
    fn a_verification_told_to_stop_stops_before_the_next_chunk() {
        let dir = artifact();
        let c = digest(dir.path(), 1).unwrap();
        let stop = AtomicBool::new(true);
        let err = verify_except_until(dir.path(), &c, 2, &[], None, &stop).unwrap_err();
        assert!(matches!(err, ArtifactError::Stopped(_)), "{err}");
        // Not told: it checks every chunk.
        verify_except_until(dir.path(), &c, 2, &[], None, &AtomicBool::new(false)).unwrap();
    }

    #[test]
    fn digests_cover_what_a_restore_reads_in_chunks() {
        let dir = artifact();
        let c = digest(dir.path(), 2).unwrap();
        let names: Vec<&str> = c.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "control/ready.json",
                "images/core-1.img",
                "images/pages-1.img"
            ]
        );
        assert_eq!(c["images/pages-1.img"].chunks.len(), 3);
        assert_eq!(c["images/core-1.img"].size, 4);
        assert_eq!(c, digest(dir.path(), 1).unwrap(), "threads change nothing");
        verify(dir.path(), &c, 2).unwrap();
        std::fs::write(dir.path().join("work/dump.log"), b"changed").unwrap();
        verify(dir.path(), &c, 2).unwrap();
    }

    #[test]
    fn every_damage_is_named_with_its_file_and_chunk() {
        let dir = artifact();
        let p = dir.path();
        let c = digest(p, 2).unwrap();
        let pages = p.join("images/pages-1.img");
        let original = std::fs::read(&pages).unwrap();

        let mut flipped = original.clone();
        flipped[CHUNK as usize + 7] ^= 1;
        std::fs::write(&pages, &flipped).unwrap();
        let e = err(p, &c);
        assert!(
            e.contains("images/pages-1.img chunk 1 (bytes 67108864-134217727)"),
            "{e}"
        );

        let mut appended = original.clone();
        appended.push(0);
        std::fs::write(&pages, &appended).unwrap();
        let e = err(p, &c);
        assert!(e.contains("images/pages-1.img holds"), "{e}");

        std::fs::write(&pages, &original[..100]).unwrap();
        assert!(err(p, &c).contains("the manifest says"));

        std::fs::remove_file(&pages).unwrap();
        assert!(err(p, &c).contains("images/pages-1.img is missing"));
        std::fs::write(&pages, &original).unwrap();

        std::fs::write(p.join("control/ready.json"), b"[]").unwrap();
        assert!(err(p, &c).contains("control/ready.json chunk 0"));
        std::fs::write(p.join("control/ready.json"), b"{}").unwrap();

        std::fs::write(p.join("images/extra.img"), b"x").unwrap();
        assert!(err(p, &c).contains("images/extra.img is not part"));
        std::fs::remove_file(p.join("images/extra.img")).unwrap();

        std::os::unix::fs::symlink("/etc/hostname", p.join("control/link")).unwrap();
        assert!(err(p, &c).contains("not a regular file"));
        std::fs::remove_file(p.join("control/link")).unwrap();

        verify(p, &c, 2).unwrap();
    }
}
