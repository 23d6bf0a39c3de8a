//! Benchmark: a 1 GiB restore's StartContainer through CRI beside the same
//! restore through `ctr run`, side by side in one run on one private
//! containerd with CRI on. Each path restores its own artifact (artifacts
//! belong to a tenant: `k8s.io/default` for the CRI pod, `default` for ctr),
//! both captured from the reference engine with `BENCH_RESIDENT_MB` MiB
//! resident (1024 by default). Timed: CRI's StartContainer (CreateContainer
//! and the pod are ready before), and `ctr run -d` (which creates the
//! container and task, then starts it); both return once the copy
//! validated and listens. Plus the shim's phases from `vsnap-restore.json`.
//! Order ABAB... over `BENCH_RUNS` pairs (default 1), warm page cache.
//!
//! Run by `scripts/bench.sh cri` (release builds).

use std::time::{Duration, Instant};

use k8s_cri::v1::*;
use vsnap_e2e::bench::env_num;
use vsnap_e2e::cmd::run;
use vsnap_e2e::cri::{container_config, envs, CriEnv, ENGINE_IMAGE, NAMESPACE, VSNAP};
use vsnap_e2e::engine::free_port;

/// Artifacts are owned by a namespace: one per path.
const CRI_ARTIFACT: &str = "big-cri";
const CTR_ARTIFACT: &str = "big-ctr";

/// The shim's restore phases of the task in `namespace`.
fn phases(e: &CriEnv, namespace: &str, id: &str) -> String {
    vsnap_e2e::bench::restore_phases(&e.c.bundle_in(namespace, id)).expect("vsnap-restore.json")
}

fn engine(resident: &str) -> ContainerConfig {
    let mut c = container_config("engine", ENGINE_IMAGE, &["/vsnap-ref-engine"]);
    c.envs = envs(&[("VSNAP_ENGINE_RESIDENT_MB", resident)]);
    c
}

fn plan_pod(
    e: &CriEnv,
    name: &str,
    plan: &str,
    extra: &[(&str, &str)],
) -> (String, PodSandboxConfig) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut ann = vec![
        ("vsnap.io/plan", plan),
        ("vsnap.io/artifact", CRI_ARTIFACT),
        ("vsnap.io/listen", listen.as_str()),
    ];
    ann.extend_from_slice(extra);
    let config = e.pod_config(name, true, &ann);
    (e.run_pod(&config, VSNAP), config)
}

fn main() {
    let runs = env_num("BENCH_RUNS", 1);
    let resident = env_num("BENCH_RESIDENT_MB", 1024).to_string();
    let e = CriEnv::start("bench-cri");
    eprintln!("bench-cri: creating the {resident} MiB artifacts (CRI and ctr)");
    let (pod, config) = plan_pod(
        &e,
        "create",
        "create",
        &[("vsnap.io/after-capture", "exit")],
    );
    let donor = e.run_container(&pod, &config, engine(&resident));
    e.wait_manifest(CRI_ARTIFACT);
    e.cri.wait_exited(&donor, Duration::from_secs(120));
    e.remove_pod(&pod);
    let env = format!("VSNAP_ENGINE_RESIDENT_MB={resident}");
    e.create_good("bench-donor", CTR_ARTIFACT, &[&env]);

    let mut rows = Vec::new();
    for i in 0..runs {
        // CRI: the pod and the container exist; StartContainer restores.
        let (pod, config) = plan_pod(&e, &format!("restore-{i}"), "restore", &[]);
        let id = e
            .cri
            .create(&pod, &config, engine(&resident))
            .expect("CreateContainer");
        let t = Instant::now();
        e.cri
            .start(&id)
            .unwrap_or_else(|err| panic!("StartContainer: {err}"));
        let cri_ms = t.elapsed().as_secs_f64() * 1000.0;
        rows.push(format!(
            "| CRI StartContainer | {cri_ms:.0} | {} |",
            phases(&e, NAMESPACE, &id)
        ));
        e.remove_pod(&pod);

        // ctr: `ctr run -d` of the same restore in the default namespace.
        let ctr_id = format!("bench-ctr-{i}");
        let cmd = e.run_command(
            &ctr_id,
            "restore",
            CTR_ARTIFACT,
            free_port(),
            &["--env", &env],
            &[],
        );
        let t = Instant::now();
        let out = run(cmd, None, Duration::from_secs(300));
        let ctr_ms = t.elapsed().as_secs_f64() * 1000.0;
        assert!(out.ok(), "ctr run: {out:?}");
        rows.push(format!(
            "| `ctr run -d` (create + start) | {ctr_ms:.0} | {} |",
            phases(&e, "default", &ctr_id)
        ));
        e.remove(&ctr_id);
    }
    println!(
        "#### Restore of a {resident} MiB artifact: CRI vs ctr ({runs} pair(s), warm page cache)\n"
    );
    println!("| path | wall ms | preflight ms | CRIU restore ms | activation ms |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
