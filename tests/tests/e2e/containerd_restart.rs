//! containerd restarted while a vsnap container runs reconnects to its shim
//! (through the bootstrap/address file), and the task can still be killed
//! and its exit status collected. The shim's events reach the restarted
//! containerd too, an exit that happened while containerd was down included.

use std::time::{Duration, Instant};

use vsnap_e2e::events::Subscription;
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

#[test]
fn containerd_reconnects_to_a_running_shim_after_a_crash() {
    let mut c = Containerd::start("restart");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    c.start_sleeper(&rootfs, "survivor");
    let shims = c.shim_pids();
    assert_eq!(shims.len(), 1, "one shim serves the container");

    c.restart();
    assert_eq!(c.shim_pids(), shims, "the shim outlived containerd");
    let tasks = c.ctr_ok(&["task", "ls"]);
    assert!(
        tasks
            .lines()
            .any(|l| l.starts_with("survivor") && l.contains("RUNNING")),
        "containerd reconnected to the shim: {tasks}"
    );
    // Exec still works through the reconnected shim.
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "after",
        "survivor",
        "/bin/echo",
        "still-here",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "still-here\n");

    // Kill through the new containerd; ctr prints the non-zero status that
    // the delete reply carries.
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "survivor"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.ctr_ok(&["task", "ls"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "survivor never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let deleted = c.ctr(&["task", "delete", "survivor"]);
    assert!(deleted.ok(), "{deleted:?}");
    assert!(
        format!("{}{}", deleted.stdout, deleted.stderr).contains("137"),
        "exit status 137 reported at delete: {deleted:?}"
    );
    c.ctr_ok(&["c", "rm", "survivor"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.shim_pids().is_empty() {
        assert!(Instant::now() < deadline, "shim did not exit after delete");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Pids `ctr task ps` lists for a container.
fn task_pids(c: &Containerd, id: &str) -> Vec<i32> {
    c.ctr_ok(&["task", "ps", id])
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The container's init pid, as `ctr task ls` prints it.
fn init_pid(c: &Containerd, id: &str) -> i32 {
    let tasks = c.ctr_ok(&["task", "ls"]);
    tasks
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(id)).then(|| f.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no pid for {id} in: {tasks}"))
}

/// A process still exists (a zombie included) until its parent reaps it.
fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn run_sleeper(c: &Containerd, id: &str) {
    c.start_sleeper(&busybox_rootfs(&c.dir).display().to_string(), id);
}

/// Kills the task through containerd and checks that its exit and delete
/// events reach `events`, then that the shim goes away.
fn kill_and_delete(c: &Containerd, id: &str, events: &Subscription) {
    let within = Duration::from_secs(30);
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", id]);
    let exit = events.wait_for(
        "/tasks/exit",
        |l| l.contains(&format!("\"id\":\"{id}\"")),
        within,
        || None,
    );
    let exit = exit.unwrap_or_else(|| {
        panic!(
            "no /tasks/exit for {id} within {within:?}; containerd log:\n{}",
            c.log_tail()
        )
    });
    assert!(exit.contains("\"exit_status\":137"), "{exit}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = c.ctr_ok(&["task", "ls"]);
        if tasks
            .lines()
            .any(|l| l.starts_with(id) && l.contains("STOPPED"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{id} never stopped: {tasks}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let deleted = c.ctr(&["task", "delete", id]);
    assert!(deleted.ok(), "{deleted:?}");
    let delete = events.wait_for(
        "/tasks/delete",
        |l| l.contains(&format!("\"container_id\":\"{id}\"")),
        within,
        || None,
    );
    assert!(
        delete.is_some(),
        "no /tasks/delete for {id}; containerd log:\n{}",
        c.log_tail()
    );
    c.ctr_ok(&["c", "rm", id]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.shim_pids().is_empty() {
        assert!(Instant::now() < deadline, "shim did not exit after delete");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After containerd restarts, the shim's events still reach it: the shim
/// reconnects (containerd-shim's own publisher never did, and dropped every
/// later event, TaskExit included, which Kubernetes relies on).
#[test]
fn events_after_a_containerd_restart_reach_it() {
    let mut c = Containerd::start("eventsrestart");
    run_sleeper(&c, "later");
    c.restart();
    // Live only if the exits of its probe execs reach containerd.
    let events = Subscription::live(&c, "later");
    kill_and_delete(&c, "later", &events);
}

/// A process that exits while containerd is down: the shim queues its
/// TaskExit and delivers it once containerd is back.
///
/// The process is an exec, not the init: containerd 2.x, when it reloads a
/// (non-sandbox) shim whose task lists no pids, deletes it as a "leaked
/// shim process" before it serves anything, so an init exit in that window
/// never becomes a task event from anyone.
#[test]
fn an_exit_while_containerd_is_down_reaches_it_after_the_restart() {
    let mut c = Containerd::start("exitdown");
    run_sleeper(&c, "lonely");
    c.ctr_ok(&[
        "task",
        "exec",
        "-d",
        "--exec-id",
        "waiter",
        "lonely",
        "/bin/sleep",
        "2000",
    ]);
    let init = init_pid(&c, "lonely");
    let deadline = Instant::now() + Duration::from_secs(10);
    let exec = loop {
        if let Some(pid) = task_pids(&c, "lonely").into_iter().find(|p| *p != init) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the exec never showed up");
        std::thread::sleep(Duration::from_millis(20));
    };
    let shims = c.shim_pids();
    assert_eq!(shims.len(), 1, "one shim serves the container");

    c.crash();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(exec),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Reaped by the shim: from here on it publishes the exit, to nobody.
    let deadline = Instant::now() + Duration::from_secs(20);
    while exists(exec) {
        assert!(Instant::now() < deadline, "the shim never reaped {exec}");
        std::thread::sleep(Duration::from_millis(20));
    }

    // The new instance logs at trace level, where containerd records each
    // event a shim forwards ("event forwarded", with its topic); what it
    // logs from here on belongs to the new instance.
    let config_path = c.dir.join("config.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    assert!(config.contains("level = \"debug\""), "{config}");
    std::fs::write(
        &config_path,
        config.replace("level = \"debug\"", "level = \"trace\""),
    )
    .unwrap();
    let log_path = c.dir.join("containerd.log");
    let log_start = std::fs::metadata(&log_path).unwrap().len() as usize;
    c.restart();
    assert_eq!(c.shim_pids(), shims, "the shim outlived containerd");
    let events = Subscription::start(&c);

    // The exit arrives on the subscription or, if the shim delivered it
    // before `ctr events` subscribed, containerd logged receiving it (the
    // only exit after the restart so far is the exec's). The shim retries
    // every 2 s at most, so either race outcome happens.
    let forwarded = || {
        let log = std::fs::read(&log_path).unwrap_or_default();
        let log = String::from_utf8_lossy(&log[log_start.min(log.len())..]).into_owned();
        log.lines()
            .find(|l| l.contains("msg=\"event forwarded\"") && l.contains("topic=/tasks/exit"))
            .map(str::to_string)
    };
    let within = Duration::from_secs(30);
    let proof = events.wait_for(
        "/tasks/exit",
        |l| l.contains("\"id\":\"waiter\""),
        within,
        forwarded,
    );
    let proof = proof.unwrap_or_else(|| {
        panic!(
            "the exec's /tasks/exit never reached containerd within {within:?}; containerd log:\n{}",
            c.log_tail()
        )
    });
    eprintln!("exit delivered: {proof}");
    drop(events);

    let events = Subscription::live(&c, "lonely");
    kill_and_delete(&c, "lonely", &events);
}
