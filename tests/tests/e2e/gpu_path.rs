//! The GPU path, proven on a machine without a GPU: what runc and CRIU are
//! given (options, tools, config), CRIU's CUDA plugin forced on with a fake
//! `cuda-checkpoint` at the configured path only, an engine connected to
//! itself on a non-loopback address, a device CRIU cannot dump, and a hung
//! `runc checkpoint` killed at its deadline. Real containerd, runc and CRIU.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use vsnap_e2e::cmd::which;

use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has, setup, Env};

fn script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn append_config(e: &Env, lines: &str) {
    let mut body = std::fs::read_to_string(&e.config).unwrap();
    body.push_str(lines);
    std::fs::write(&e.config, body).unwrap();
}

/// Tools of a GPU host, fakes where a GPU is needed, all under the test's
/// folder: a runc that logs each checkpoint and restore (verb, PATH, argv)
/// and then runs the real one, with CRIU's CUDA plugin forced on while
/// `force-cuda-plugin` exists; a cuda-checkpoint that logs its calls and
/// knows no CUDA process.
struct Tools {
    dir: PathBuf,
}

impl Tools {
    fn new(e: &Env) -> Self {
        let dir = e.c.dir.join("tools");
        let runc = which("runc");
        script(
            &dir.join("runc-logging"),
            &format!(
                r#"verb= work= prev=
for a in "$@"; do
  case "$a" in checkpoint|restore) [ -z "$verb" ] && verb=$a;; esac
  [ "$prev" = --work-path ] && work=$a
  prev=$a
done
[ -z "$verb" ] && exec {runc} "$@"
printf '%s\tPATH=%s\tARGS=%s\n' "$verb" "$PATH" "$*" >> {dir}/runc-calls.log
[ -f {dir}/force-cuda-plugin ] && export CRIU_FAULT=138
{runc} "$@"
rc=$?
# CRIU's log of a failed run, for the test's message.
[ $rc -ne 0 ] && cat "$work"/*.log > {dir}/failed-criu.log 2>/dev/null
exit $rc"#,
                dir = dir.display(),
                runc = runc.display()
            ),
        );
        script(
            &dir.join("nv/bin/cuda-checkpoint"),
            &format!(
                r#"echo "$*" >> {dir}/cuda-checkpoint-calls.log
case "$1" in
  -h|--help) echo "usage: cuda-checkpoint --action {{lock,checkpoint,restore,unlock}} --pid PID [--timeout MS]"; exit 0;;
esac
echo "Error: pid $3 is not a CUDA process" >&2
exit 1"#,
                dir = dir.display()
            ),
        );
        Tools { dir }
    }

    fn cuda_checkpoint(&self) -> PathBuf {
        self.dir.join("nv/bin/cuda-checkpoint")
    }

    fn force_cuda_plugin(&self) {
        std::fs::write(self.dir.join("force-cuda-plugin"), "").unwrap();
    }

    /// `(verb, PATH, argv)` of each logged runc checkpoint and restore.
    fn runc_calls(&self) -> Vec<(String, String, String)> {
        std::fs::read_to_string(self.dir.join("runc-calls.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (
                    f[0].to_string(),
                    f[1].trim_start_matches("PATH=").to_string(),
                    f[2].trim_start_matches("ARGS=").to_string(),
                )
            })
            .collect()
    }

    /// CRIU's logs of a failed checkpoint or restore (empty without one).
    fn failed_criu_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("failed-criu.log")).unwrap_or_default()
    }

    fn cuda_checkpoint_calls(&self) -> String {
        std::fs::read_to_string(self.dir.join("cuda-checkpoint-calls.log")).unwrap_or_default()
    }
}

/// Whether this host's runc takes `--criu` (1.0 and 1.1 do).
fn runc_takes_criu_flag() -> bool {
    let out = std::process::Command::new(which("runc"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.starts_with("runc version 1.1.") || text.starts_with("runc version 1.0.")
}

fn pids_of(e: &Env, id: &str) -> Vec<String> {
    e.c.ctr_ok(&["task", "ps", id])
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn an_engine_connected_to_itself_is_captured_and_restored() {
    let e = setup("gpu-self");
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    // vLLM's rendezvous store: a connection from the engine to itself on
    // the host's address (the container shares the host network).
    let env = ["VSNAP_ENGINE_SELF_TCP=auto"];
    e.create_good("gps-c0", "self", &env);
    let port = free_port();
    let out = e.run("gps-r0", "restore", "self", port, &["--env", env[0]]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    // The engine's recovery sent bytes both ways over the restored pair.
    assert_eq!(
        answers(port),
        reference,
        "the copy answers like a cold start"
    );
    e.remove("gps-r0");
    // The restore repeats the options the dump recorded in the manifest:
    // a record saying the dump kept no established connections (resealed,
    // so it is this host's) has CRIU refuse the connected pair.
    let path = e.manifest("self");
    let made = std::fs::read(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&made).unwrap();
    assert_eq!(v["criu"]["tcp_established"], true, "{v}");
    assert_eq!(v["criu"]["file_locks"], true, "{v}");
    v["criu"]["tcp_established"] = false.into();
    let mut m: vsnap_artifact::Manifest = serde_json::from_value(v).unwrap();
    m.seal(&vsnap_artifact::HostKey::load(&e.artifacts).unwrap());
    std::fs::write(&path, m.to_bytes()).unwrap();
    let out = e.run("gps-r1", "restore", "self", free_port(), &["--env", env[0]]);
    assert!(!out.ok(), "{out:?}");
    assert_has(&out.stderr, &["Connected TCP socket in image"]);
    e.remove("gps-r1");
    e.assert_nothing_left();
}

#[test]
fn runc_and_criu_get_the_captures_options_and_the_configured_tools() {
    let e = setup("gpu-tools");
    let tools = Tools::new(&e);
    let criu = which("criu");
    // The CUDA plugin from a folder CRIU does not know by default.
    let plugins = e.c.dir.join("criu-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        "/usr/lib/criu/cuda_plugin.so",
        plugins.join("cuda_plugin.so"),
    )
    .expect("CRIU's CUDA plugin (scripts/setup.sh builds it)");
    // What the operator's runc.conf holds must reach CRIU too.
    let runc_conf = e.c.dir.join("runc.conf");
    std::fs::write(&runc_conf, "# the operator's\ntimeout 120\n").unwrap();
    append_config(
        &e,
        &format!(
            "runc_binary = \"{}\"\ncriu_binary = \"{}\"\ncuda_checkpoint = \"{}\"\ncuda_plugin_dir = \"{}\"\ncriu_config = \"{}\"\n",
            tools.dir.join("runc-logging").display(),
            criu.display(),
            tools.cuda_checkpoint().display(),
            plugins.display(),
            runc_conf.display()
        ),
    );
    tools.force_cuda_plugin();
    let env = ["VSNAP_ENGINE_SELF_TCP=auto"];

    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let out = e.run("gpt-c0", "create", "tools", free_port(), &["--env", env[0]]);
    assert!(out.ok(), "{out:?}");
    vsnap_e2e::snapshot_env::poll(
        std::time::Duration::from_secs(120),
        "the artifact, or a failed capture",
        || e.manifest("tools").exists() || e.bundle("gpt-c0").join("vsnap-error.json").exists(),
    );
    assert!(
        e.manifest("tools").exists(),
        "{}\n{}",
        std::fs::read_to_string(e.bundle("gpt-c0").join("vsnap-error.json")).unwrap_or_default(),
        tools.failed_criu_log()
    );
    let pids = pids_of(&e, "gpt-c0");
    let conf = std::fs::read_to_string(e.bundle("gpt-c0").join("vsnap-criu.conf")).unwrap();
    e.remove("gpt-c0");

    // The CRIU config: runc.conf's options, then vsnap's.
    assert!(conf.contains("\ntimeout 120\n"), "{conf}");
    assert!(
        conf.contains(&format!("\nlibdir {}\n", plugins.display())),
        "{conf}"
    );
    assert!(conf.contains("\nghost-limit "), "{conf}");
    assert!(!conf.contains("leave-stopped"), "a capture: {conf}");

    // The plugin found in that folder initialized, and found the fake
    // cuda-checkpoint on the PATH vsnap gave CRIU (it is on no other).
    let dump_log = std::fs::read_to_string(e.artifact("tools").join("work/dump.log")).unwrap();
    assert!(
        dump_log.contains("cuda_plugin: initialized"),
        "{}",
        dump_log
            .lines()
            .filter(|l| l.contains("cuda"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let calls = tools.cuda_checkpoint_calls();
    assert!(calls.lines().any(|l| l == "-h"), "{calls}");
    for pid in &pids {
        assert!(
            calls.contains(&format!("--get-restore-tid --pid {pid}\n")),
            "the plugin asked about every process of the tree ({pids:?}): {calls}"
        );
    }

    let port = free_port();
    let out = e.run("gpt-r0", "restore", "tools", port, &["--env", env[0]]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "the copy answers like a cold start"
    );
    let conf = std::fs::read_to_string(e.bundle("gpt-r0").join("vsnap-criu.conf")).unwrap();
    // A CPU restore: held stopped, its memory placed by vsnap's page server.
    // Then the mapping of runc's masked folders (criu/masks.rs).
    let (options, masks) = conf
        .rsplit_once("lazy-pages\n")
        .expect("a restore's options");
    assert!(options.ends_with("leave-stopped\n"), "a restore: {conf}");
    assert!(
        masks.starts_with("external mnt[vsnap-empty]:") && masks.lines().count() == 1,
        "a restore: {conf}"
    );
    e.remove("gpt-r0");

    let calls = tools.runc_calls();
    let verbs: Vec<&str> = calls.iter().map(|(v, _, _)| v.as_str()).collect();
    assert_eq!(verbs, ["checkpoint", "restore"], "{calls:?}");
    let first_on_path = format!(
        "{}:{}:",
        tools.cuda_checkpoint().parent().unwrap().display(),
        criu.parent().unwrap().display()
    );
    for (verb, path, args) in &calls {
        for option in ["--tcp-established", "--ext-unix-sk", "--file-locks"] {
            assert!(args.contains(option), "{verb} without {option}: {args}");
        }
        assert!(
            path.starts_with(&first_on_path),
            "{verb}: PATH={path}, expected it to start with {first_on_path}"
        );
        let criu_flag = format!("--criu {} ", criu.display());
        assert_eq!(
            args.contains(&criu_flag),
            runc_takes_criu_flag(),
            "{verb}: {args}"
        );
    }
    e.assert_nothing_left();
}

#[test]
fn the_cuda_plugin_in_criu_s_default_folder_is_used_too() {
    let e = setup("gpu-plugin");
    let tools = Tools::new(&e);
    append_config(
        &e,
        &format!(
            "runc_binary = \"{}\"\ncuda_checkpoint = \"{}\"\n",
            tools.dir.join("runc-logging").display(),
            tools.cuda_checkpoint().display(),
        ),
    );
    tools.force_cuda_plugin();
    e.create_good("gpp-c0", "plugin", &[]);
    let dump_log = std::fs::read_to_string(e.artifact("plugin").join("work/dump.log")).unwrap();
    assert!(dump_log.contains("cuda_plugin: initialized"), "{dump_log}");
    assert!(
        tools
            .cuda_checkpoint_calls()
            .contains("--get-restore-tid --pid "),
        "{}",
        tools.cuda_checkpoint_calls()
    );
    e.assert_nothing_left();
}

#[test]
fn a_device_criu_cannot_dump_is_refused_naming_the_process() {
    let e = setup("gpu-dev");
    // /dev/fuse (10:229): CRIU dumps no misc device but tun and autofs.
    let err = e.failed_capture(
        "gpd-c0",
        "device",
        137,
        &[
            "--device",
            "/dev/fuse",
            "--env",
            "VSNAP_ENGINE_HOLD_DEVICE=/dev/fuse",
        ],
    );
    assert_has(
        &err,
        &[
            "capture: inventory: pid ",
            "/dev/fuse (10:229, fd ",
            "CRIU cannot dump",
        ],
    );
    e.assert_nothing_published();
    e.assert_nothing_left();
}

#[test]
fn a_hung_checkpoint_is_killed_at_its_deadline_and_the_engine_thawed() {
    let e = setup("gpu-hang");
    let dir = e.c.dir.join("tools");
    // A dump that hangs with the tree frozen, as a wedged CRIU or GPU
    // checkpoint leaves it: runc pauses the container, then never returns.
    script(
        &dir.join("runc-hanging"),
        &format!(
            r#"real={runc}
for a in "$@"; do case "$a" in checkpoint)
  root=$2; for id; do :; done
  "$real" --root "$root" pause "$id" || exit 1
  echo paused > {dir}/paused
  exec sleep 3600;;
esac; done
exec "$real" "$@""#,
            runc = which("runc").display(),
            dir = dir.display()
        ),
    );
    append_config(
        &e,
        &format!(
            "runc_binary = \"{}\"\ncheckpoint_timeout_s = 3\n",
            dir.join("runc-hanging").display()
        ),
    );
    // The capture fails and the engine is killed (137): nothing stays frozen.
    let err = e.failed_capture("gph-c0", "hang", 137, &[]);
    assert!(dir.join("paused").exists(), "the dump froze the tree first");
    assert_has(
        &err,
        &[
            "capture: checkpoint: runc checkpoint not done when the checkpoint timeout of 3s (checkpoint_timeout_s) passed",
            "killed runc",
        ],
    );
    e.assert_nothing_published();
    e.assert_nothing_left();
}
