//! Polling for protocol files.
//!
//! The capturer waits on a live engine: besides the file it wants it watches for error.json
//! and for the engine process going away. The engine waits on the capturer, possibly across
//! a checkpoint: its timeout counts only time it was awake (see [`AwakeTimer`]).

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::dir::ControlDir;
use crate::error::{ProtocolError, Result};
use crate::file::{read_bytes, read_json, Received};
use crate::files;
use crate::messages::{ErrorRecord, Message, Schema};

/// How often a missing file is looked for again by the engine (vLLM polls
/// every 50 ms too).
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How often the capturer (the shim) looks again: what it waits for is on
/// a restore's critical path, and a look is a few system calls.
pub const CAPTURER_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// A gap between two polls longer than this means the process was frozen.
const FROZEN_GAP: Duration = Duration::from_secs(2);

/// Capturer side: waits until the engine writes `T`'s file into `dir`.
///
/// Each poll re-validates the directory, then fails with
/// [`ProtocolError::EngineFailed`] if error.json appeared, returns the message if it is
/// there, and fails with [`ProtocolError::EngineExited`] once `is_alive` says the engine is
/// gone (after one last look for error.json).
pub fn wait_for<T: Message>(
    dir: &ControlDir,
    deadline: Instant,
    is_alive: &mut dyn FnMut() -> bool,
) -> Result<Received<T>> {
    wait_until(dir, deadline, is_alive, |_| Ok(true))
}

/// Like [`wait_for`], but keeps polling while `accept` returns `Ok(false)`.
pub(crate) fn wait_until<T: Message>(
    dir: &ControlDir,
    deadline: Instant,
    is_alive: &mut dyn FnMut() -> bool,
    mut accept: impl FnMut(&Received<T>) -> Result<bool>,
) -> Result<Received<T>> {
    let started = Instant::now();
    let target = dir.file(T::FILE);
    loop {
        dir.validate()?;
        fail_on_engine_error(dir)?;
        if let Some(received) = read_json::<T>(&target)? {
            if accept(&received)? {
                return Ok(received);
            }
        }
        if !is_alive() {
            fail_on_engine_error(dir)?;
            return Err(ProtocolError::EngineExited {
                path: dir.path().into(),
            });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ProtocolError::Timeout {
                path: target,
                waited: now - started,
            });
        }
        thread::sleep(CAPTURER_POLL_INTERVAL.min(deadline - now));
    }
}

fn fail_on_engine_error(dir: &ControlDir) -> Result<()> {
    let path = dir.file(files::ERROR);
    match read_json::<ErrorRecord>(&path)? {
        Some(received) => Err(ProtocolError::EngineFailed {
            path,
            record: Box::new(received.value),
        }),
        None => Ok(()),
    }
}

/// Engine side: waits until the capturer writes `name` into `dir` and returns its bytes.
/// The directory is re-validated before every read; `timeout` counts awake time only.
pub fn wait_for_capturer(dir: &ControlDir, name: &str, timeout: Duration) -> Result<Vec<u8>> {
    let path = dir.file(name);
    let mut timer = AwakeTimer::start();
    loop {
        dir.validate()?;
        if let Some(bytes) = read_bytes(&path)? {
            return Ok(bytes);
        }
        let awake = timer.awake();
        if awake >= timeout {
            return Err(ProtocolError::Timeout {
                path,
                waited: awake,
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Engine side of the barrier protocol: waits for a file at any path; `timeout` counts
/// awake time only.
pub fn wait_for_path<T: Schema>(path: &Path, timeout: Duration) -> Result<Received<T>> {
    let mut timer = AwakeTimer::start();
    loop {
        if let Some(received) = read_json::<T>(path)? {
            return Ok(received);
        }
        let awake = timer.awake();
        if awake >= timeout {
            return Err(ProtocolError::Timeout {
                path: path.into(),
                waited: awake,
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Measures how long a polling loop has been awake.
///
/// A process that waits for its activation is checkpointed in that loop and may be
/// restored hours later. The monotonic clock then jumps by the time spent frozen, which
/// must not count against the timeout. Any gap between two calls longer than two seconds
/// is therefore counted as one poll interval.
#[derive(Debug)]
pub struct AwakeTimer {
    last: Instant,
    awake: Duration,
}

impl AwakeTimer {
    pub fn start() -> Self {
        AwakeTimer {
            last: Instant::now(),
            awake: Duration::ZERO,
        }
    }

    /// Awake time since [`AwakeTimer::start`], updated by this call.
    pub fn awake(&mut self) -> Duration {
        let now = Instant::now();
        let step = now.saturating_duration_since(self.last);
        self.awake += if step > FROZEN_GAP {
            POLL_INTERVAL
        } else {
            step
        };
        self.last = now;
        self.awake
    }
}
