//! What the fault tests share: the rootfs's digests, the moments waited
//! for, a restore run in the background, the shim killed, and the checks
//! that nothing is left and that a later restore works.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::engine::{answer, complete, free_port};
use vsnap_e2e::snapshot_env::{poll, poll_every, Env};

/// Every file under `dir`: its sha256 (or a symlink's target).
pub(super) fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
                out.insert(rel, "dir".into());
            } else if ft.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                );
            } else {
                let mut h = Sha256::new();
                let mut f = std::fs::File::open(&p).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = f.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                let digest: Vec<String> = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
                out.insert(rel, digest.concat());
            }
        }
    }
    out
}

/// Waits (polling every 5 ms: some moments are brief) until `done` holds.
pub(super) fn wait_until(timeout: Duration, what: &str, done: impl FnMut() -> bool) {
    poll_every(Duration::from_millis(5), timeout, what, done)
}

/// runc's bind mount of the rootfs while it restores `id`.
pub(super) fn criu_root(e: &Env, id: &str) -> PathBuf {
    e.c.runc_root().join(id).join("criu-root")
}

/// A restore of `name` as `id` run by ctr on a thread (ctr blocks in Start).
pub(super) fn restore_in_background(
    e: &Env,
    id: &str,
    name: &str,
    port: u16,
    extra: &[&str],
) -> JoinHandle<CmdOutput> {
    let cmd = e.run_command(id, "restore", name, port, extra, &[]);
    std::thread::spawn(move || run(cmd, None, Duration::from_secs(180)))
}

/// SIGKILLs `pid`.
fn sigkill(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// Kills this instance's one shim (by pid) and returns its pid.
pub(super) fn kill_the_shim(e: &Env) -> i32 {
    let shims = e.c.shim_pids();
    assert_eq!(shims.len(), 1, "one shim serves the restore: {shims:?}");
    sigkill(shims[0]);
    shims[0]
}

/// Removes whatever is left of `id` through containerd (after a fault the
/// task may be gone already).
pub(super) fn remove_any(e: &Env, id: &str) {
    let _ = e.c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    let _ = e.c.ctr(&["task", "delete", "-f", id]);
    let _ = e.c.ctr(&["c", "rm", id]);
    poll(Duration::from_secs(30), &format!("{id} removed"), || {
        !e.c.ctr_ok(&["c", "ls", "-q"]).lines().any(|l| l == id)
    });
}

/// Waits until containerd's cleanup after the dead shim is done: it runs
/// the shim binary's `delete` (whose command line names this instance).
pub(super) fn cleaned_up(e: &Env) {
    poll(Duration::from_secs(30), "the dead shim's delete", || {
        e.c.shim_pids().is_empty()
    });
}

/// After a fault and the cleanup: the rootfs as it was, and nothing left.
pub(super) fn assert_intact_and_clean(e: &Env, id: &str, before: &BTreeMap<String, String>) {
    cleaned_up(e);
    assert_eq!(&tree(Path::new(&e.rootfs)), before, "the rootfs is intact");
    assert_eq!(
        e.cgroups(id),
        Vec::<String>::new(),
        "no cgroup (no process) of {id}"
    );
    e.assert_nothing_left();
}

/// A later restore of `name` works and answers.
pub(super) fn restore_works(e: &Env, id: &str, name: &str, env: &[&str]) {
    let port = free_port();
    let mut extra = Vec::new();
    for kv in env {
        extra.extend_from_slice(&["--env", *kv]);
    }
    let out = e.run(id, "restore", name, port, &extra);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    let reply = complete(port, "The capital of France is", 4);
    assert!(answer(&reply).0.is_string(), "{reply}");
    e.remove(id);
}

/// `pid`'s name and state, from /proc/<pid>/stat ("pid (comm) state ...").
fn comm_and_state(pid: i32) -> Option<(String, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let state = stat[close + 1..].trim_start().chars().next()?;
    Some((stat[open + 1..close].to_string(), state))
}

/// The processes named `comm` under a shim of this instance (runc, CRIU
/// under runc), by pid.
pub(super) fn under_the_shim(e: &Env, comm: &str) -> Vec<i32> {
    let shims = e.c.shim_pids();
    // pid -> (comm, ppid), from /proc/<pid>/stat: "pid (comm) state ppid ...".
    let mut procs = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let ppid = stat[close + 1..].split_whitespace().nth(1);
        if let Some(ppid) = ppid.and_then(|p| p.parse::<i32>().ok()) {
            procs.insert(pid, (stat[open + 1..close].to_string(), ppid));
        }
    }
    let under_a_shim = |pid: i32| {
        // Up its parents (runc, the shim), a few levels at most.
        let mut at = pid;
        for _ in 0..8 {
            match procs.get(&at) {
                Some((_, ppid)) if shims.contains(ppid) => return true,
                Some((_, ppid)) => at = *ppid,
                None => return false,
            }
        }
        false
    };
    procs
        .iter()
        .filter(|(pid, (c, _))| c == comm && under_a_shim(**pid))
        .map(|(pid, _)| *pid)
        .collect()
}

/// Which of `pids` (each named `comm` when taken) still run.
pub(super) fn still_running(pids: &[i32], comm: &str) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|p| comm_and_state(*p).is_some_and(|(c, s)| c == comm && s != 'Z'))
        .collect()
}
