//! Benchmark: what a restore into a new pod costs. Side by side on one
//! private containerd with CRI on, ABAB... over `BENCH_RUNS` rounds (3 by
//! default), each restoring a reference engine with `BENCH_RESIDENT_MB` MiB
//! resident (1024 by default), warm page cache:
//! * **twin**: a host-network pod, the path earlier releases were tested
//!   on (no namespace to join, the node's own hostname);
//! * **new pod**: a pod of a Deployment on the CNI network, its own name,
//!   hostname and IP (CRIU joins its UTS and IPC namespaces, no network
//!   lock, the copy's identity read from its namespaces);
//! * **cold**: the new pod's engine cold-started (`plan` off), from
//!   StartContainer until it answers on its pod IP.
//!
//! Each row times StartContainer (the pod and the container exist); a
//! restore returns once the copy validated and listens. Plus the shim's
//! phases from `vsnap-restore.json`. Run by `scripts/bench.sh pods`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_cri::v1::*;
use vsnap_e2e::bench::env_num;
use vsnap_e2e::cri::{container_config, envs, CriEnv, ENGINE_IMAGE, NAMESPACE, VSNAP};
use vsnap_e2e::engine::free_port;
use vsnap_e2e::pod_net::in_netns_of;

/// The shim's restore phases of container `id` (none for a cold start).
fn phases(e: &CriEnv, id: &str) -> String {
    vsnap_e2e::bench::restore_phases(&e.c.bundle_in(NAMESPACE, id))
        .unwrap_or_else(|| "- | - | -".into())
}

/// A pod of `plan` on `artifact`; `cni`: a pod network, else the host's.
fn pod(
    e: &CriEnv,
    name: &str,
    plan: &str,
    artifact: &str,
    cni: bool,
) -> (String, PodSandboxConfig, String) {
    let listen = if cni {
        "0.0.0.0:8000".to_string()
    } else {
        format!("127.0.0.1:{}", free_port())
    };
    let ann = [
        ("vsnap.io/plan", plan),
        ("vsnap.io/artifact", artifact),
        ("vsnap.io/listen", listen.as_str()),
        ("vsnap.io/after-capture", "exit"),
    ];
    let config = e.pod_config(name, !cni, &ann);
    (e.run_pod(&config, VSNAP), config, listen)
}

fn engine(resident: &str) -> ContainerConfig {
    let mut c = container_config("engine", ENGINE_IMAGE, &["/vsnap-ref-engine"]);
    c.envs = envs(&[("VSNAP_ENGINE_RESIDENT_MB", resident)]);
    c
}

/// Creates artifact `name` in a pod of the given network; the donor exits.
fn create(e: &CriEnv, name: &str, cni: bool, resident: &str) {
    let (pod_id, config, _) = pod(e, &format!("vllm-create-{name}"), "create", name, cni);
    let donor = e.run_container(&pod_id, &config, engine(resident));
    e.wait_manifest(name);
    e.cri.wait_exited(&donor, Duration::from_secs(300));
    e.remove_pod(&pod_id);
}

/// StartContainer of a prepared container in a new pod; for `cold`, until
/// the engine answers on the pod's IP. Returns ms and the phases.
fn start(
    e: &CriEnv,
    name: &str,
    plan: &str,
    artifact: &str,
    cni: bool,
    resident: &str,
) -> (f64, String) {
    let (pod_id, config, _) = pod(e, name, plan, artifact, cni);
    let id = e
        .cri
        .create(&pod_id, &config, engine(resident))
        .expect("CreateContainer");
    let pause = e.cri.pod_pid(&pod_id);
    let ip = e
        .cri
        .pod_status(&pod_id)
        .status
        .unwrap()
        .network
        .unwrap()
        .ip;
    let t = Instant::now();
    e.cri
        .start(&id)
        .unwrap_or_else(|err| panic!("StartContainer {name}: {err}"));
    if plan == "off" {
        let addr: SocketAddr = SocketAddr::new(ip.parse().unwrap(), 8000);
        in_netns_of(pause, move || loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        });
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let phases = phases(e, &id);
    e.remove_pod(&pod_id);
    (ms, phases)
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 1024).to_string();
    let e = CriEnv::start("bench-pods");
    eprintln!("bench-pods: creating the {resident} MiB artifacts (host network and CNI)");
    create(&e, "twin", false, &resident);
    create(&e, "pods", true, &resident);
    let mut rows: Vec<(String, Vec<f64>, String)> = vec![
        (
            "twin: host-network pod, restore".into(),
            Vec::new(),
            String::new(),
        ),
        (
            "new pod: CNI pod of a Deployment, restore".into(),
            Vec::new(),
            String::new(),
        ),
        (
            "new pod: cold start until it answers on its IP".into(),
            Vec::new(),
            String::new(),
        ),
    ];
    for i in 0..runs {
        let runs: [(&str, &str, bool); 3] = [
            ("restore", "twin", false),
            ("restore", "pods", true),
            ("off", "pods", true),
        ];
        for (row, (plan, artifact, cni)) in runs.iter().enumerate() {
            let (ms, phases) = start(
                &e,
                &format!("vllm-7d9f8-{row}x{i}"),
                plan,
                artifact,
                *cni,
                &resident,
            );
            rows[row].1.push(ms);
            rows[row].2 = phases;
        }
    }
    let median = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    let twin = median(&rows[0].1);
    println!("#### StartContainer of a {resident} MiB reference engine: a new pod beside its twin ({runs} rounds, ABC order, warm page cache)\n");
    println!("| start | runs ms | median ms | / twin restore | last run's preflight, CRIU restore, activation ms |");
    println!("|---|---|---|---|---|");
    for (name, ms, phases) in &rows {
        let all: Vec<String> = ms.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {name} | {} | {:.0} | {:.2} | {phases} |",
            all.join(", "),
            median(ms),
            median(ms) / twin
        );
    }
}
