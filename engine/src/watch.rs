//! A folder the engine watches with inotify for the life of the process, as
//! file watchers, hot-reload and config watchers in engines do
//! (`VSNAP_ENGINE_WATCH=DIR`, created when missing): the names of the
//! entries created, written or moved into it, in order, are served at
//! `GET /watch`, so a test can tell that a watch made before a capture
//! still fires in a restored copy.

use std::ffi::CString;
use std::sync::Mutex;

static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static DIR: Mutex<Option<String>> = Mutex::new(None);

/// Starts watching `dir` on a thread of its own; fails naming the folder.
pub fn start(dir: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("watch: create {dir}: {e}"))?;
    let path = CString::new(dir).map_err(|_| format!("watch: {dir:?} holds a NUL"))?;
    // SAFETY: plain syscalls on a descriptor this function owns.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "watch: inotify_init1: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mask = libc::IN_CREATE | libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO;
    // SAFETY: `path` is a valid C string.
    if unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) } < 0 {
        return Err(format!("watch: {dir}: {}", std::io::Error::last_os_error()));
    }
    *DIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_string());
    std::thread::spawn(move || read_events(fd));
    Ok(())
}

fn read_events(fd: i32) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: reads into a buffer of the length given.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let names = parse(&buf[..n as usize]);
        EVENTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(names);
    }
}

/// The names of the events in one read of an inotify descriptor.
fn parse(mut bytes: &[u8]) -> Vec<String> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut names = Vec::new();
    while bytes.len() >= HEADER {
        let len = u32::from_ne_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        let Some(name) = bytes.get(HEADER..HEADER + len) else {
            break;
        };
        let end = name.iter().position(|b| *b == 0).unwrap_or(len);
        names.push(String::from_utf8_lossy(&name[..end]).into_owned());
        bytes = &bytes[HEADER + len..];
    }
    names
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
