//! Every pod is a new pod: a copy restored through CRI into a pod of a CNI
//! network that is not its donor's twin (another name, hostname, network
//! namespace and IP, as a Deployment makes them) lives in that pod's
//! namespaces, answers on its IP from another pod, and is an individual.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_cri::v1::*;
use vsnap_e2e::cri::*;
use vsnap_e2e::engine::HostEngine;
use vsnap_e2e::pod_net::{get_json, in_netns_of, iptables_rules, namespaces};
use vsnap_e2e::snapshot_env::{answers, answers_at, flip_middle_byte, largest_image, poll};

/// The port every pod's engine listens on (each pod has its own IP).
const PORT: u16 = 8000;

/// One pod of a Deployment: its name, id, config and IP.
struct Pod {
    name: String,
    id: String,
    config: PodSandboxConfig,
    ip: String,
}

impl Pod {
    fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip.parse().unwrap(), PORT)
    }
}

/// A pod of Deployment `deployment` on the CNI network, named as a
/// ReplicaSet names its pods (`<deployment>-<hash>-<5 chars>`), with
/// `plan` (and `artifact`, when given) in its annotations.
fn deployment_pod(e: &CriEnv, deployment: &str, plan: &str, artifact: Option<&str>) -> Pod {
    static PODS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PODS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Five characters of the alphabet ReplicaSets use, different per pod.
    let mut x = (u64::from(std::process::id()) << 20) ^ (n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let suffix: String = (0..5)
        .map(|_| {
            let c = b"bcdfghjklmnpqrstvwxz2456789"[(x % 27) as usize] as char;
            x /= 27;
            c
        })
        .collect();
    let name = format!("{deployment}-7d9f8-{suffix}");
    let listen = format!("0.0.0.0:{PORT}");
    let mut ann = vec![
        ("vsnap.io/plan", plan),
        ("vsnap.io/listen", listen.as_str()),
        ("vsnap.io/per-pod-env", "POD_NAME"),
    ];
    if let Some(a) = artifact {
        ann.push(("vsnap.io/artifact", a));
    }
    let config = e.pod_config(&name, false, &ann);
    let id = e.run_pod(&config, VSNAP);
    let ip = e.cri.pod_status(&id).status.unwrap().network.unwrap().ip;
    assert!(!ip.is_empty(), "{name}: a CNI address");
    Pod {
        name,
        id,
        config,
        ip,
    }
}

/// The reference engine as the Deployment's template runs it, with the
/// downward API's POD_NAME.
fn engine_in(pod: &Pod, env: &[(&str, &str)]) -> ContainerConfig {
    let mut c = container_config("engine", ENGINE_IMAGE, &["/vsnap-ref-engine"]);
    let mut all = vec![("POD_NAME", pod.name.as_str())];
    all.extend_from_slice(env);
    c.envs = envs(&all);
    c
}

/// Whether something accepts a connection to `addr` from the network
/// namespace of `client` (another pod's sandbox pid).
fn listens(client: i32, addr: SocketAddr) -> bool {
    in_netns_of(client, move || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    })
}

/// Asserts that the engine `id` of `pod` lives in the pod: the sandbox's
/// network, IPC and UTS namespaces, the pod's hostname inside (`hostname`
/// and `/etc/hostname`), and returns its `/v1/identity` as asked from the
/// network namespace of `client` (another pod's sandbox pid).
fn assert_lives_in(e: &CriEnv, pod: &Pod, id: &str, client: i32) -> serde_json::Value {
    let (engine, pause) = (e.cri.container_pid(id), e.cri.pod_pid(&pod.id));
    assert_eq!(
        namespaces(engine),
        namespaces(pause),
        "{}: the engine's net, ipc and uts namespaces are the pause container's",
        pod.name
    );
    let hostname = e
        .cri
        .exec_sync(id, &["/bin/sh", "-c", "hostname; cat /etc/hostname"]);
    assert_eq!(
        String::from_utf8_lossy(&hostname.stdout),
        format!("{0}\n{0}\n", pod.name),
        "{hostname:?}"
    );
    let addr = pod.addr();
    let identity = in_netns_of(client, move || get_json(addr, "/v1/identity"));
    assert_eq!(identity["hostname"], pod.name.as_str(), "{identity}");
    assert!(
        identity["pod_ips"]
            .as_array()
            .unwrap()
            .iter()
            .any(|ip| ip == pod.ip.as_str()),
        "{identity}"
    );
    identity
}

/// A pod of Deployment `vllm` creates; pods of the same Deployment restore
/// (plan `restore`; `auto` with the artifact named): each copy lives in its
/// own pod, answers on its pod's IP from another pod exactly as a cold
/// start does, and draws its own random numbers.
#[test]
fn a_copy_restores_into_another_pod_of_its_deployment() {
    let e = CriEnv::start("cri-pods");
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let client = deployment_pod(&e, "client", "off", None);
    let client_pid = e.cri.pod_pid(&client.id);

    let donor_pod = deployment_pod(&e, "vllm", "create", Some("dep"));
    let donor = e.run_container(&donor_pod.id, &donor_pod.config, engine_in(&donor_pod, &[]));
    let manifest = e.wait_manifest("dep");
    assert_eq!(
        manifest["workload"]["per_pod_env"],
        serde_json::json!(["HOSTNAME", "POD_NAME"]),
        "the manifest records what was the pod's own"
    );
    // The donor goes on serving in its own pod.
    let donor_addr = donor_pod.addr();
    poll(Duration::from_secs(60), "the donor serving", || {
        listens(client_pid, donor_addr)
    });
    let donor_identity = assert_lives_in(&e, &donor_pod, &donor, client_pid);

    let mut draws = vec![donor_identity["draw"].clone()];
    for plan in ["restore", "auto"] {
        let pod = deployment_pod(&e, "vllm", plan, Some("dep"));
        let copy = e.run_container(&pod.id, &pod.config, engine_in(&pod, &[]));
        let addr = pod.addr();
        assert!(
            listens(client_pid, addr),
            "{plan}: restored, listening on its pod IP when StartContainer returned"
        );
        assert_eq!(
            in_netns_of(client_pid, move || answers_at(addr)),
            reference,
            "{plan}: the copy answers on {addr} like a cold start"
        );
        let identity = assert_lives_in(&e, &pod, &copy, client_pid);
        // What kubelet shows of a failed exec is worded as runc-v2 words it.
        let exec = e.cri.call(e.cri.rs().exec_sync(ExecSyncRequest {
            container_id: copy.clone(),
            cmd: vec!["/no-such-binary".into()],
            timeout: 30,
        }));
        let err = exec.expect_err("an exec of a missing binary fails");
        assert!(
            err.message().contains("OCI runtime exec failed: ")
                && !err.message().contains("runc exec failed"),
            "{err:?}"
        );
        assert_eq!(identity["seed_applied"], true, "{identity}");
        draws.push(identity["draw"].clone());
    }
    draws.sort_by_key(|d| d.to_string());
    draws.dedup();
    assert_eq!(
        draws.len(),
        3,
        "every copy draws its own numbers: {draws:?}"
    );
    for pod in e
        .cri
        .call(
            e.cri
                .rs()
                .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
        )
        .unwrap()
        .items
    {
        e.remove_pod(&pod.id);
    }
    e.assert_nothing_left();
}

/// `auto` without a name across two pods of one Deployment: the first
/// captures, the second restores the first's artifact (one artifact for
/// the Deployment, although each pod has its own HOSTNAME and POD_NAME).
#[test]
fn auto_without_a_name_restores_the_deployments_one_artifact() {
    let e = CriEnv::start("cri-pods-auto");
    let client = deployment_pod(&e, "client", "off", None);
    let client_pid = e.cri.pod_pid(&client.id);
    let first = deployment_pod(&e, "web", "auto", None);
    e.run_container(&first.id, &first.config, engine_in(&first, &[]));
    poll(Duration::from_secs(120), "the first pod's artifact", || {
        e.artifact_names().iter().any(|n| n.starts_with("auto-"))
    });
    let name = e
        .artifact_names()
        .into_iter()
        .find(|n| n.starts_with("auto-"))
        .unwrap();
    e.wait_manifest(&name);
    // The first pod's shim lets go of the artifact's write lock just after
    // it published; a pod started while a writer holds it starts cold,
    // without a capture (here the test holds it).
    poll(
        Duration::from_secs(30),
        "the capture's write lock released",
        || !vsnap_artifact::lock::ArtifactLock::is_held(&e.artifacts, &name).unwrap(),
    );
    let held = vsnap_artifact::lock::ArtifactLock::exclusive(&e.artifacts, &name).unwrap();
    let busy = deployment_pod(&e, "web", "auto", None);
    e.run_container(&busy.id, &busy.config, engine_in(&busy, &[]));
    drop(held);
    e.remove_pod(&busy.id);
    let second = deployment_pod(&e, "web", "auto", None);
    let copy = e.run_container(&second.id, &second.config, engine_in(&second, &[]));
    let addr = second.addr();
    assert!(
        listens(client_pid, addr),
        "the second pod restored: listening when StartContainer returned"
    );
    assert_eq!(
        e.artifact_names(),
        [name],
        "one artifact for the Deployment"
    );
    assert_lives_in(&e, &second, &copy, client_pid);
    for pod in [&client, &first, &second] {
        e.remove_pod(&pod.id);
    }
    e.assert_nothing_left();
}

/// The vsnap shim's error record of container `id` (CRI's namespace).
fn capture_error(e: &CriEnv, id: &str) -> String {
    let record = e.c.bundle_in(NAMESPACE, id).join("vsnap-error.json");
    poll(
        Duration::from_secs(120),
        &record.display().to_string(),
        || record.exists(),
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    v["error"].as_str().unwrap().to_string()
}

/// A tree holding a TCP connection to itself over its pod's IP (what
/// torch.distributed's gloo makes) is refused at capture, before CRIU,
/// naming the address and the fix; a connection in a listener's backlog at
/// capture does not fail it; a restore that fails after CRIU started
/// leaves no CRIU rule in the pod's network namespace, and `auto`'s cold
/// start in the same Start answers on the pod's IP from another pod.
#[test]
fn a_socket_on_the_pod_ip_is_refused_and_a_failed_restore_leaves_the_pod_as_it_was() {
    let e = CriEnv::start("cri-pods-net");
    let client = deployment_pod(&e, "client", "off", None);
    let client_pid = e.cri.pod_pid(&client.id);

    let tied = deployment_pod(&e, "gloo", "create", Some("tied"));
    let id = e.run_container(
        &tied.id,
        &tied.config,
        engine_in(&tied, &[("VSNAP_ENGINE_SELF_TCP", "auto")]),
    );
    let err = capture_error(&e, &id);
    for part in [
        "capture: inventory",
        "TCP connection",
        &format!("{}:", tied.ip),
        "own address",
        "GLOO_SOCKET_IFNAME=lo",
    ] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    assert!(
        !e.artifact_names().contains(&"tied".to_string()),
        "nothing published"
    );

    // A client's connection the kernel accepted and the engine did not yet:
    // in flight at capture, it stays the donor's, and a copy restores.
    let busy = deployment_pod(&e, "inflight", "create", Some("inflight"));
    let backlog = [("VSNAP_ENGINE_BACKLOG", "1")];
    e.run_container(&busy.id, &busy.config, engine_in(&busy, &backlog));
    e.wait_manifest("inflight");
    let copy = deployment_pod(&e, "inflight", "restore", Some("inflight"));
    e.run_container(&copy.id, &copy.config, engine_in(&copy, &backlog));
    e.remove_pod(&busy.id);
    e.remove_pod(&copy.id);

    let donor = deployment_pod(&e, "net", "create", Some("net"));
    e.run_container(&donor.id, &donor.config, engine_in(&donor, &[]));
    e.wait_manifest("net");
    e.remove_pod(&donor.id);
    flip_middle_byte(&largest_image(&e.artifact("net"), true));
    let pod = deployment_pod(&e, "net", "auto", Some("net"));
    e.run_container(&pod.id, &pod.config, engine_in(&pod, &[]));
    let pause = e.cri.pod_pid(&pod.id);
    let rules = iptables_rules(pause);
    assert!(
        !rules.contains("CRIU"),
        "the pod's namespace holds CRIU's rules:\n{rules}"
    );
    let addr = pod.addr();
    poll(
        Duration::from_secs(120),
        "the cold start serving on the pod IP",
        || listens(client_pid, addr),
    );
    assert!(!in_netns_of(client_pid, move || answers_at(addr)).is_empty());
    for p in [&client, &tied, &pod] {
        e.remove_pod(&p.id);
    }
    e.assert_nothing_left();
}
