//! Container ids are unique across the end-to-end suite. `ctr run` gives a
//! container the cgroup `/<namespace>/<id>` on the host, whatever containerd
//! it talks to, so two tests whose private containerds run the same id at
//! the same time share that cgroup: one test's `runc kill --all` then kills
//! the other's processes (it did: a donor SIGKILLed at capture-ready, in a
//! test beside one whose capture was refused and its task killed), and one
//! test's leak check sees the other's processes. Every test thread claims
//! the ids it runs; an id another test claimed first fails the second, on
//! any run, however the two were scheduled.

use std::collections::BTreeMap;
use std::sync::Mutex;

static CLAIMED: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// Claims container `id` for the test running on this thread (libtest names
/// the thread after the test); panics if another test claimed it. Threads
/// without a test's name (a benchmark's main thread, a helper thread) claim
/// nothing.
pub fn claim(id: &str) {
    let Some(test) = std::thread::current().name().map(str::to_string) else {
        return;
    };
    if test == "main" {
        return;
    }
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    match claimed.get(id) {
        Some(other) if *other != test => panic!(
            "container id {id:?} is run by {other} and by {test}: give one of them another id \
             (both would get the host's cgroup /default/{id}; tests/src/ids.rs)"
        ),
        Some(_) => {}
        None => {
            claimed.insert(id.to_string(), test);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_test_running_an_id_fails() {
        let run_as = |test: &str, id: &str| {
            let id = id.to_string();
            std::thread::Builder::new()
                .name(test.to_string())
                .spawn(move || claim(&id))
                .unwrap()
                .join()
        };
        assert!(run_as("ids::a", "ids-unit-1").is_ok());
        assert!(
            run_as("ids::a", "ids-unit-1").is_ok(),
            "a test may run its id again"
        );
        assert!(run_as("ids::b", "ids-unit-2").is_ok());
        assert!(run_as("ids::b", "ids-unit-1").is_err(), "another test's id");
        assert!(
            run_as("main", "ids-unit-1").is_ok(),
            "a bench's main thread claims nothing"
        );
    }
}
