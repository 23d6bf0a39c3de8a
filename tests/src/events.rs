//! `ctr events` against a test's containerd, read line by line on a thread.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Containerd;

/// `ctr events`, read line by line on a thread.
pub struct Subscription {
    child: std::process::Child,
    /// Every line `ctr events` prints.
    pub lines: mpsc::Receiver<String>,
}

impl Subscription {
    pub fn start(c: &Containerd) -> Self {
        let mut child = c
            .ctr_command(&["events"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Subscription { child, lines }
    }

    /// The next event line with `topic` for which `want` holds, within
    /// `timeout`; or, checked whenever no line is waiting, what `elsewhere`
    /// finds.
    pub fn wait_for(
        &self,
        topic: &str,
        want: impl Fn(&str) -> bool,
        timeout: Duration,
        elsewhere: impl Fn() -> Option<String>,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.contains(&format!(" {topic} ")) && want(&line) => {
                    return Some(line)
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(found) = elsewhere() {
                        return Some(found);
                    }
                    if e == mpsc::RecvTimeoutError::Disconnected {
                        // `ctr events` is gone; only `elsewhere` can answer.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
        None
    }

    /// Subscribes, and returns once the subscription has seen an event (the
    /// exit of a short exec in `id`): events from then on reach it.
    pub fn live(c: &Containerd, id: &str) -> Self {
        let events = Subscription::start(c);
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in 0.. {
            let probe = format!("probe{n}");
            let out = c.ctr(&["task", "exec", "--exec-id", &probe, id, "/bin/true"]);
            assert_eq!(out.code, Some(0), "{out:?}");
            let seen = events.wait_for(
                "/tasks/exit",
                |l| l.contains(&format!("\"id\":\"{probe}\"")),
                Duration::from_secs(2),
                || None,
            );
            if seen.is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no exec exit reached `ctr events` within 30 s; containerd log:\n{}",
                c.log_tail()
            );
        }
        events
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
