//! Ordinary containers under `io.vsnap.v1` behave as under containerd's runc
//! shim: output, exit codes, signals, exec, stdin, tty, pause/resume, ps,
//! metrics. Each test runs its own private containerd.

use std::time::Duration;

use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::{cmd, Containerd};

const RT: &str = "io.vsnap.v1";

fn setup(tag: &str) -> (Containerd, String) {
    let c = Containerd::start(tag);
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    (c, rootfs)
}

#[test]
fn run_prints_the_output_of_echo() {
    let (c, rootfs) = setup("echo");
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "echo1",
        "/bin/echo",
        "hi",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hi\n");
}

#[test]
fn exit_status_is_the_process_exit_code() {
    let (c, rootfs) = setup("exit");
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "exit7",
        "/bin/sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(out.code, Some(7), "{out:?}");
    // ctr reports the status it got from Wait; the shim's TaskExit agrees.
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "exit0",
        "/bin/true",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

fn start_sleeper(c: &Containerd, rootfs: &str, id: &str) {
    c.start_sleeper(rootfs, id);
}

fn wait_running(c: &Containerd, id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !c
        .ctr_ok(&["task", "ls"])
        .lines()
        .any(|l| l.starts_with(id) && l.contains("RUNNING"))
    {
        assert!(std::time::Instant::now() < deadline, "{id} never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkill_to_the_init_process_gives_137() {
    let (c, rootfs) = setup("sigkill");
    // An attached `ctr run` exits with the status the shim reports.
    let mut run = c
        .ctr_command(&[
            "run",
            "--rm",
            "--runtime",
            RT,
            "--rootfs",
            &rootfs,
            "k9",
            "/bin/sleep",
            "1000",
        ])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_running(&c, "k9");
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "k9"]);
    assert_eq!(
        cmd::wait_deadline(&mut run, Duration::from_secs(20)),
        Some(137)
    );
    assert!(
        c.ctr_ok(&["c", "ls", "-q"]).trim().is_empty(),
        "--rm removed it"
    );
}

#[test]
fn sigterm_gives_143_and_sigkill_137_for_exec_processes() {
    let (c, rootfs) = setup("sigterm");
    start_sleeper(&c, &rootfs, "t15");
    // A sleep that is not PID 1 of its namespace dies of SIGTERM (PID 1
    // ignores signals it has no handler for, under any runtime).
    for (exec_id, signal, want) in [("e15", "SIGTERM", 143), ("e9", "SIGKILL", 137)] {
        let mut child = c
            .ctr_command(&[
                "task",
                "exec",
                "--exec-id",
                exec_id,
                "t15",
                "/bin/sleep",
                "1000",
            ])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let ps = c.ctr_ok(&["task", "ps", "t15"]);
            if ps.contains(exec_id) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "exec never showed in ps: {ps}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c.ctr_ok(&["task", "kill", "--exec-id", exec_id, "-s", signal, "t15"]);
        let code = cmd::wait_deadline(&mut child, Duration::from_secs(20));
        assert_eq!(code, Some(want), "exec killed by {signal}");
    }
}

#[test]
fn exec_runs_in_the_container_with_its_output_and_exit_code() {
    let (c, rootfs) = setup("exec");
    start_sleeper(&c, &rootfs, "ex");
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "ex",
        "/bin/sh",
        "-c",
        "echo from-exec; exit 3",
    ]);
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(out.stdout, "from-exec\n");
    // The exec sees the container's filesystem, not the host's.
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "ex",
        "/bin/ls",
        "/bin/busybox",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[test]
fn stdin_is_delivered_to_the_process() {
    let (c, rootfs) = setup("stdin");
    let out = c.ctr_in(
        &[
            "run",
            "--rm",
            "--runtime",
            RT,
            "--rootfs",
            &rootfs,
            "in1",
            "/bin/sh",
            "-c",
            "read x; echo got:$x",
        ],
        Some(b"data\n"),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "got:data\n");
}

#[test]
fn a_tty_run_gets_a_terminal() {
    let (c, rootfs) = setup("tty");
    // ctr -t needs a terminal of its own: give it one with script(1).
    let ctr = c.ctr_command(&[
        "run",
        "--rm",
        "-t",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "tty1",
        "/bin/tty",
    ]);
    let line = format!("{:?}", ctr).replace('"', "");
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &line, "/dev/null"]);
    let out = cmd::run(script, None, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("/dev/pts/"), "{out:?}");
}

#[test]
fn pause_resume_ps_and_metrics_work() {
    let (c, rootfs) = setup("pause");
    start_sleeper(&c, &rootfs, "p1");
    c.ctr_ok(&["task", "pause", "p1"]);
    assert!(c.ctr_ok(&["task", "ls"]).contains("PAUSED"));
    c.ctr_ok(&["task", "resume", "p1"]);
    assert!(c.ctr_ok(&["task", "ls"]).contains("RUNNING"));
    let ps = c.ctr_ok(&["task", "ps", "p1"]);
    let pid = c.ctr_ok(&["task", "ls"]);
    let init_pid = pid
        .lines()
        .find(|l| l.starts_with("p1"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .to_string();
    assert!(ps.contains(&init_pid), "ps {ps} lacks init pid {init_pid}");
    let metrics = c.ctr_ok(&["task", "metrics", "p1"]);
    assert!(metrics.contains("memory.usage_in_bytes"), "{metrics}");
    assert!(metrics.contains("pids.current"), "{metrics}");
}

#[test]
fn a_file_log_uri_receives_the_output() {
    let (c, rootfs) = setup("logfile");
    let log = c.dir.join("logs/app.log");
    let uri = format!("file://{}", log.display());
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--log-uri",
        &uri,
        "--rootfs",
        &rootfs,
        "lg1",
        "/bin/sh",
        "-c",
        "echo to-out; echo to-err >&2",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("to-out\n") && text.contains("to-err\n"),
        "{text:?}"
    );
}

#[test]
fn the_shim_answers_help_and_version_like_containerds_shims() {
    let shim = vsnap_e2e::containerd::shim_binary();
    for flag in ["-h", "--help"] {
        let out = std::process::Command::new(&shim)
            .arg(flag)
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("Usage of containerd-shim-vsnap-v1"),
            "{text}"
        );
        assert!(
            text.contains("-namespace") && text.contains("-address"),
            "{text}"
        );
    }
    let out = std::process::Command::new(&shim)
        .arg("-v")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("Runtime: io.vsnap.v1"),
        "{text}"
    );
}
