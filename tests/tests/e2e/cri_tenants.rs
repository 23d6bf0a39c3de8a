//! Tenants as Kubernetes draws them: pods of two Kubernetes namespaces on
//! one node (one containerd namespace, `k8s.io`), driven through CRI as
//! kubelet drives it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_cri::v1::*;
use vsnap_e2e::cri::*;
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::registry::Registry;
use vsnap_e2e::snapshot_env::{answers, flip_middle_byte, largest_image, poll};

const A: &str = "team-a";
const B: &str = "team-b";
const C: &str = "team-c";

/// The reference engine's container, `annotations` on it.
fn engine(name: &str, annotations: &[(&str, &str)]) -> ContainerConfig {
    let mut c = container_config(name, ENGINE_IMAGE, &["/vsnap-ref-engine"]);
    c.annotations = vsnap_e2e::cri::annotations(annotations);
    c
}

/// A host-network pod of Kubernetes namespace `ns` with a plan in its
/// annotations (`vsnap.io/listen` on `port` added) and the engine's
/// container created in it (not started): the pod, its config, the container.
fn pod_in(
    e: &CriEnv,
    ns: &str,
    name: &str,
    port: u16,
    ann: &[(&str, &str)],
    container_ann: &[(&str, &str)],
) -> (String, PodSandboxConfig, String) {
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec![("vsnap.io/listen", listen.as_str())];
    all.extend_from_slice(ann);
    let config = e.pod_config_in(ns, name, true, &all);
    let pod = e.run_pod(&config, VSNAP);
    let id = e
        .cri
        .create(&pod, &config, engine(name, container_ann))
        .unwrap_or_else(|err| panic!("CreateContainer {name}: {err}"));
    (pod, config, id)
}

/// StartContainer must fail: its message (what kubelet shows in the pod's
/// events). The pod is removed.
fn start_error(e: &CriEnv, ns: &str, name: &str, ann: &[(&str, &str)]) -> String {
    let (pod, _, id) = pod_in(e, ns, name, free_port(), ann, &[]);
    let err = e.cri.start(&id).expect_err("StartContainer must fail");
    assert_ne!(e.cri.state(&id), ContainerState::ContainerRunning);
    e.remove_pod(&pod);
    err.message().to_string()
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// An `auto` pod of namespace `ns` without an artifact name whose donor
/// exits after the capture: the name of the artifact it made.
fn auto_create(e: &CriEnv, ns: &str, name: &str) -> String {
    let before = e.artifact_names();
    let (pod, _, id) = pod_in(
        e,
        ns,
        name,
        free_port(),
        &[
            ("vsnap.io/plan", "auto"),
            ("vsnap.io/after-capture", "exit"),
        ],
        &[],
    );
    e.cri
        .start(&id)
        .unwrap_or_else(|err| panic!("StartContainer {name}: {err}\n{}", e.c.log_tail()));
    let st = e.cri.wait_exited(&id, Duration::from_secs(120));
    assert_eq!(st.exit_code, 0, "the donor exits after capture: {st:?}");
    let made: Vec<String> = e
        .artifact_names()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(made.len(), 1, "{name}: one new artifact: {made:?}");
    e.remove_pod(&pod);
    made[0].clone()
}

/// A restore in namespace `ns` of artifact `name`: it starts, and its answers.
fn restores(e: &CriEnv, ns: &str, pod_name: &str, name: &str) -> Vec<String> {
    let port = free_port();
    let (pod, _, id) = pod_in(
        e,
        ns,
        pod_name,
        port,
        &[("vsnap.io/plan", "restore"), ("vsnap.io/artifact", name)],
        &[],
    );
    e.cri
        .start(&id)
        .unwrap_or_else(|err| panic!("StartContainer {pod_name}: {err}\n{}", e.c.log_tail()));
    let got = answers(port);
    e.remove_pod(&pod);
    got.into_iter().map(|a| format!("{a:?}")).collect()
}

/// Two Kubernetes namespaces on one node: B's `auto` makes its own
/// artifact instead of using A's; B can neither restore A's artifact by
/// name, nor replace it (A's artifact stays byte-identical and A's next
/// restore answers as A's engine), nor get it through annotations that
/// claim A's namespace (containerd's CRI overwrites them, even where the
/// handler's allowlist passes them), nor make the node connect to a
/// registry the policy does not give it; team-c, which A's artifacts are
/// shared with, restores it.
#[test]
fn kubernetes_namespaces_are_tenants_on_one_node() {
    let e = CriEnv::start("cri-tenants");
    let registry = Registry::start(&e.c.dir);
    let host = registry.host();
    let policy = format!(
        "\n[registries.\"{host}\"]\nplain_http = true\n\
         [[tenants.share]]\nowner = \"k8s.io/{A}\"\nartifacts = [\"auto-*\"]\nto = [\"k8s.io/{C}\"]\n\
         [tenants.artifact_refs]\n\"k8s.io/{A}\" = [\"{host}/{A}/*\"]\n"
    );
    let mut config = std::fs::read_to_string(&e.config).unwrap();
    config.push_str(&policy);
    std::fs::write(&e.config, config).unwrap();
    let cold = HostEngine::start();
    let reference: Vec<String> = answers(cold.port)
        .into_iter()
        .map(|a| format!("{a:?}"))
        .collect();

    // The same workload in A and in B: two artifacts, each its tenant's.
    let a = auto_create(&e, A, "a-auto");
    let b = auto_create(&e, B, "b-auto");
    assert_ne!(a, b, "B's auto did not take A's artifact");
    let owner = |name: &str| {
        let m = e.wait_manifest(name);
        (
            m["workload"]["namespace"].clone(),
            m["workload"]["kubernetes_namespace"].clone(),
        )
    };
    assert_eq!(
        owner(&a),
        (serde_json::json!("k8s.io"), serde_json::json!(A))
    );
    assert_eq!(
        owner(&b),
        (serde_json::json!("k8s.io"), serde_json::json!(B))
    );

    // B restores A's artifact by name: refused naming both tenants.
    let refused = format!("artifact {a} belongs to tenant k8s.io/{A}, not k8s.io/{B}");
    let err = start_error(
        &e,
        B,
        "b-restore",
        &[("vsnap.io/plan", "restore"), ("vsnap.io/artifact", &a)],
    );
    assert!(
        err.contains(&format!("restore: preflight: {refused}")),
        "{err}"
    );

    // B replaces A's artifact: refused before anything runs; not a byte moves.
    let before = tree(&e.artifact(&a));
    let err = start_error(
        &e,
        B,
        "b-replace",
        &[
            ("vsnap.io/plan", "create"),
            ("vsnap.io/artifact", &a),
            ("vsnap.io/after-capture", "exit"),
        ],
    );
    assert!(err.contains(&format!("create: {refused}")), "{err}");
    assert!(
        tree(&e.artifact(&a)) == before,
        "A's artifact is byte-identical"
    );

    // B's pod and container claim A's namespace themselves.
    let spoof = [("io.kubernetes.cri.sandbox-namespace", A)];
    let mut ann = vec![
        ("vsnap.io/plan", "restore"),
        ("vsnap.io/artifact", a.as_str()),
    ];
    ann.extend_from_slice(&spoof);
    let (pod, _, id) = pod_in(&e, B, "b-spoof", free_port(), &ann, &spoof);
    let info: serde_json::Value =
        serde_json::from_str(&e.c.ctr_ok(&["-n", NAMESPACE, "c", "info", &id])).unwrap();
    assert_eq!(
        info["Spec"]["annotations"]["io.kubernetes.cri.sandbox-namespace"], B,
        "containerd's CRI writes the pod's own namespace last"
    );
    assert_eq!(
        info["Spec"]["annotations"]["vsnap.io/artifact"],
        a.as_str(),
        "the allowlist passes the pod's annotations"
    );
    let err = e
        .cri
        .start(&id)
        .expect_err("a spoofed namespace changes nothing");
    assert!(err.message().contains(&refused), "{}", err.message());
    e.remove_pod(&pod);

    // B names a registry repository the policy gives A only: refused
    // before any connection (the registry saw no request for it).
    let reference_ref = format!("{host}/{A}/engine:v1");
    let err = start_error(
        &e,
        B,
        "b-pull",
        &[
            ("vsnap.io/plan", "restore"),
            ("vsnap.io/artifact", "pulled"),
            ("vsnap.io/artifact-ref", &reference_ref),
        ],
    );
    assert!(
        err.contains("refused by the tenant policy")
            && err.contains(&format!("tenant k8s.io/{B}"))
            && err.contains("none is configured for it"),
        "{err}"
    );
    let asked = format!("/v2/{A}/engine/");
    assert!(!registry.log().contains(&asked), "{}", registry.log());
    // A may: its pull reaches the registry (which has no such artifact).
    let err = start_error(
        &e,
        A,
        "a-pull",
        &[
            ("vsnap.io/plan", "restore"),
            ("vsnap.io/artifact", "pulled"),
            ("vsnap.io/artifact-ref", &reference_ref),
        ],
    );
    assert!(!err.contains("tenant policy"), "{err}");
    poll(
        Duration::from_secs(10),
        "A's request in the registry's log",
        || registry.log().contains(&asked),
    );

    // Shared with C on purpose: C restores A's artifact; A restores its own,
    // as A's engine.
    assert_eq!(restores(&e, C, "c-restore", &a), reference);
    assert_eq!(restores(&e, A, "a-restore", &a), reference);
    e.assert_nothing_left();
}

/// A tenant that restores another's shared artifact under `auto`, the
/// restore failing at Start (a flipped byte found beside CRIU): its start
/// goes on cold without a capture, never writing over the owner's name.
#[test]
fn a_shared_artifact_that_fails_at_start_is_never_replaced_by_its_borrower() {
    let e = CriEnv::start("cri-tenants-cold");
    let policy = format!(
        "\n[[tenants.share]]\nowner = \"k8s.io/{A}\"\nartifacts = [\"auto-*\"]\nto = [\"k8s.io/{C}\"]\n"
    );
    let mut config = std::fs::read_to_string(&e.config).unwrap();
    config.push_str(&policy);
    std::fs::write(&e.config, config).unwrap();
    let a = auto_create(&e, A, "a-auto");
    flip_middle_byte(&largest_image(&e.artifact(&a), true));
    let ann = [("vsnap.io/plan", "auto"), ("vsnap.io/artifact", a.as_str())];
    let (pod, _, id) = pod_in(&e, C, "c-auto", free_port(), &ann, &[]);
    e.cri
        .start(&id)
        .unwrap_or_else(|err| panic!("StartContainer c-auto: {err}\n{}", e.c.log_tail()));
    // The container's own spec runs: the engine serves where its command
    // line says (not on the plan's port), so the record in the bundle,
    // written once the cold init started, is what is checked.
    let bundle = e.c.bundle_in(NAMESPACE, &id);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("vsnap-fallback.json")).unwrap())
            .unwrap();
    assert_eq!(record["cause"], "damaged", "{record}");
    assert_eq!(record["start"], "cold, without a capture", "{record}");
    e.remove_pod(&pod);
    assert!(
        !e.artifact(&a).exists(),
        "nothing was published under A's name"
    );
    e.assert_nothing_left();
}
