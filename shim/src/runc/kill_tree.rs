//! Killing a process tree: every process under a root stopped, then killed,
//! so none forks or leaves its children to the shim (a subreaper) meanwhile.

/// SIGKILLs every process under `root`, then `root`. They are all stopped
/// first, so none can fork, and none dies and leaves its children to the
/// shim (a subreaper) before they are found. Returns how many were under it.
pub fn kill_tree(root: i32) -> usize {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
    let mut stopped: Vec<i32> = Vec::new();
    // Until a pass finds nobody new: a process may fork until it is stopped.
    for _ in 0..100 {
        let found: Vec<i32> = descendants(root)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if found.is_empty() {
            break;
        }
        for p in found {
            let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
            stopped.push(p);
        }
    }
    for p in &stopped {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    stopped.len()
}

/// Every live process below `root`, from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        if let Some(Ok(ppid)) = fields.next().map(str::parse::<i32>) {
            if state != "Z" && state != "X" {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, _) in parent_of.iter().filter(|(_, pp)| *pp == parent) {
            if !tree.contains(pid) {
                tree.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// Gone, or a zombie nobody reaped yet.
    fn dead(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    #[test]
    fn kill_tree_kills_every_descendant() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait"])
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tree = descendants(root);
        while tree.len() < 2 {
            assert!(Instant::now() < deadline, "the sleeps never started");
            std::thread::sleep(Duration::from_millis(10));
            tree = descendants(root);
        }
        assert_eq!(kill_tree(root), 2);
        child.wait().unwrap();
        for pid in tree {
            while !dead(pid) {
                assert!(Instant::now() < deadline, "{pid} survived");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
