//! Eight restores of one artifact started at once (a node that boots with
//! eight GPUs starts eight engines from one artifact), each its own shim,
//! under one private containerd: every copy answers like a cold start, the
//! shims' page servers share the host's filler budget (in this test's own
//! `runtime_dir`) and the reading and hashing of the pages (a leader hands
//! its checked chunks to the followers), and a damaged chunk of the shared
//! pages image refuses every copy that would run from it. Nothing is left:
//! no process, mount, bundle, runc state, held slot, or share.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has, flip_middle_byte, largest_image, setup, Env};

const COPIES: usize = 8;
/// Modest: eight copies of the engine's 256 MiB.
const RESIDENT: &str = "VSNAP_ENGINE_RESIDENT_MB=256";

/// `COPIES` restores of `name` started together: each one's id, port and
/// `ctr run -d` result, in order.
fn restore_all(e: &Env, tag: &str, name: &str) -> Vec<(String, u16, CmdOutput)> {
    let started: Vec<(String, u16, std::thread::JoinHandle<CmdOutput>)> = (0..COPIES)
        .map(|k| {
            let (id, port) = (format!("{tag}{k}"), free_port());
            let cmd: Command = e.run_command(&id, "restore", name, port, &["--env", RESIDENT], &[]);
            let h = std::thread::spawn(move || run(cmd, None, Duration::from_secs(300)));
            (id, port, h)
        })
        .collect();
    started
        .into_iter()
        .map(|(id, port, h)| (id, port, h.join().unwrap()))
        .collect()
}

/// The budget's slot files; each one free (no shim holds it any more).
fn slots_free(dir: &Path) -> Vec<String> {
    let names = vsnap_e2e::containerd::list(dir);
    for n in &names {
        let f = std::fs::File::open(dir.join(n)).unwrap();
        // SAFETY: flock on a descriptor this function owns.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(
            rc,
            0,
            "{n} is still held: {}",
            std::io::Error::last_os_error()
        );
    }
    names
}

#[test]
fn eight_restores_at_once_answer_like_a_cold_start_and_a_damaged_chunk_refuses_each() {
    let e = setup("concurrent");
    let runtime = e.c.dir.join("run");
    let config = std::fs::read_to_string(&e.config).unwrap();
    let line = format!("runtime_dir = \"{}\"\n", runtime.display());
    std::fs::write(&e.config, config + &line).unwrap();
    let reference = answers(HostEngine::start().port);
    e.mount_points_in_rootfs();
    e.create_good("cc-donor", "shared", &[RESIDENT]);

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let (mut followers, mut from_share) = (0, 0);
    for (id, port, out) in restore_all(&e, "cc-", "shared") {
        assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
        assert_eq!(answers(port), reference, "{id} answers like a cold start");
        let timings: serde_json::Value = serde_json::from_slice(
            &std::fs::read(e.bundle(&id).join("vsnap-restore.json")).unwrap(),
        )
        .unwrap();
        assert!(
            timings["pages_placed_bytes"].as_u64() > Some(256 << 20),
            "{id}: its page server placed the engine's memory: {timings}"
        );
        eprintln!("{id}: {timings}");
        let (shared, read) = (
            timings["page_chunks_from_share"].as_u64().unwrap(),
            timings["page_chunks_read"].as_u64().unwrap(),
        );
        assert!(shared + read >= 4, "{id}: every chunk placed: {timings}");
        if timings["page_share_role"] == "follower" {
            followers += 1;
            from_share += shared;
        }
    }
    assert!(
        followers > 0 && from_share > 0,
        "the copies shared their pages: {followers} followers placed {from_share} chunks from the share"
    );
    let fillers = runtime.join("fillers");
    assert_eq!(
        slots_free(&fillers).len(),
        cores.min(8),
        "one slot per core, shared by every copy's page server"
    );
    for k in 0..COPIES {
        e.remove(&format!("cc-{k}"));
    }

    // One flipped byte in the pages image every copy runs from: each copy
    // refuses, naming the file and its chunk, and none runs or listens.
    let pages = largest_image(&e.artifact("shared"), true);
    let rel = format!("images/{}", pages.file_name().unwrap().to_string_lossy());
    flip_middle_byte(&pages);
    for (id, port, out) in restore_all(&e, "cd-", "shared") {
        assert!(!out.ok(), "{id} must not start: {out:?}");
        assert_has(
            &out.stderr,
            &[
                "restore: verify: damaged",
                &rel,
                "chunk",
                "does not match its digest",
            ],
        );
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "nothing of {id} listens on {port}"
        );
        assert_eq!(e.cgroups(&id), Vec::<String>::new(), "no process of {id}");
        e.remove(&id);
    }
    // The host's empty tmpfs for runc's masks stays for later restores; a
    // test's own runtime folder takes it off.
    nix_unmount(&runtime.join("empty"));
    e.assert_nothing_left();
    slots_free(&fillers);
    let mut names = vsnap_e2e::containerd::list(&runtime);
    names.sort();
    assert_eq!(
        names,
        ["empty", "empty.lock", "fillers", "share"],
        "nothing else in the runtime folder"
    );

    assert_eq!(
        vsnap_e2e::containerd::list(&runtime.join("share")),
        Vec::<String>::new(),
        "every leader's lock and socket went with it"
    );
}

fn nix_unmount(dir: &Path) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a plain syscall on a NUL-terminated path.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    assert_eq!(
        rc,
        0,
        "unmount {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
}

/// What another `runc restore` of the same root folder does on the
/// folder's host side before CRIU runs (runc 1.1): binds the host's
/// `/etc/hosts` and `/etc/resolv.conf` onto the folder's and detaches them
/// again; here over and over until `stop`. Returns the rounds made.
/// How long each bind stays: runc holds its own for the rest of its
/// preparation; long enough here for a restore's runc to open it.
const HOLD: Duration = Duration::from_micros(30);

fn other_restores_mounting_on(
    rootfs: &Path,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    let pairs: Vec<(CString, CString)> = ["hosts", "resolv.conf"]
        .iter()
        .map(|f| {
            (
                c(&Path::new("/etc").join(f)),
                c(&rootfs.join("etc").join(f)),
            )
        })
        .collect();
    std::thread::spawn(move || {
        let mut rounds = 0;
        while !stop.load(Ordering::Relaxed) {
            for (source, target) in &pairs {
                // SAFETY: plain syscalls on NUL-terminated paths this thread owns.
                let bound = unsafe {
                    libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )
                };
                assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
                let held = std::time::Instant::now();
                while held.elapsed() < HOLD {
                    std::hint::spin_loop();
                }
                // SAFETY: as above.
                if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
                    // A restore's runc detaches what it finds there, this
                    // bind too (EINVAL: not mounted any more).
                    let e = std::io::Error::last_os_error();
                    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "detach: {e}");
                }
            }
            rounds += 1;
        }
        rounds
    })
}

/// runc 1.1 prepares a restore by mounting on the root folder's host side
/// and detaching again, so restores of one shared folder (`--rootfs DIR`)
/// raced there: one restore's bind detached under another's open handle
/// ("mount /etc/hosts:/etc/hosts ...: no such file or directory"), and a
/// failed restore's undo took off every mount below the folder. Each
/// restore now runs on a private bind of the folder of its own.
#[test]
fn restores_of_one_root_folder_never_meet_each_others_mounts() {
    let e = setup("rootrace");
    e.mount_points_in_rootfs();
    e.create_good("rr-donor", "shared", &[]);
    let reference = answers(HostEngine::start().port);
    let stop = Arc::new(AtomicBool::new(false));
    let other = other_restores_mounting_on(Path::new(&e.rootfs), stop.clone());
    let mut outcomes = Vec::new();
    for k in 0..3 {
        let (id, port) = (format!("rr-{k}"), free_port());
        let out = e.run(&id, "restore", "shared", port, &[]);
        let answered = out.ok().then(|| answers(port));
        outcomes.push((id, out, answered));
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = other.join().unwrap();
    assert!(rounds > 0, "the other restores mounted on the folder");
    for (id, out, answered) in outcomes {
        assert!(
            out.ok(),
            "{id} restores beside the others' mounts: {out:?}\n{}",
            e.c.log_tail()
        );
        assert_eq!(
            answered.as_ref(),
            Some(&reference),
            "{id} answers like a cold start"
        );
        e.remove(&id);
    }
    e.assert_nothing_left();
}
