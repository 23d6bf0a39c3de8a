//! A folder the engine watches with inotify for the life of the process, as
//! file watchers, hot-reload and config watchers in engines do
//! (`VSNAP_ENGINE_WATCH=DIR`, created when missing): the names of the
//! entries created, written or moved into it, in order, are served at
//! `GET /watch`, so a test can tell that a watch made before a capture
//! still fires in a restored copy.

use std::sync::Mutex;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static DIR: Mutex<Option<String>> = Mutex::new(None);

/// Starts watching `dir` on a thread of its own; fails naming the folder.
pub fn start(dir: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("watch: create {dir}: {e}"))?;
    let inotify =
        Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| format!("watch: inotify_init1: {e}"))?;
    let mask =
        AddWatchFlags::IN_CREATE | AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO;
    inotify
        .add_watch(dir, mask)
        .map_err(|e| format!("watch: {dir}: {e}"))?;
    *DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_string());
    std::thread::spawn(move || read_events(inotify));
    Ok(())
}

fn read_events(inotify: Inotify) {
    loop {
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        };
        // An event of the folder itself carries no name: an empty one.
        let names = events.into_iter().map(|e| {
            e.name
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        EVENTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(names);
    }
}

/// `{"dir": DIR or null, "events": [names...]}`.
pub fn report() -> serde_json::Value {
    serde_json::json!({
        "dir": *DIR.lock().unwrap_or_else(|e| e.into_inner()),
        "events": *EVENTS.lock().unwrap_or_else(|e| e.into_inner()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_fire_and_are_named() {
        let dir = std::env::temp_dir().join(format!("vsnap-watch-{}", std::process::id()));
        start(dir.to_str().unwrap()).unwrap();
        std::fs::write(dir.join("reload"), b"x").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !report()["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "reload")
        {
            assert!(std::time::Instant::now() < deadline, "{}", report());
            std::thread::yield_now();
        }
        assert_eq!(report()["dir"], dir.to_str().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
