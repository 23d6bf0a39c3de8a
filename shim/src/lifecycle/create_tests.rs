//! Create through a recording runc (fakes.rs): what a plain container
//! keeps of its spec, what is refused before runc runs, and where runc's
//! state goes. Snapshot plans are prepared in snapshot/plan/ and run
//! end to end by the e2e tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::asynchronous::io::Stdio;
use serde_json::json;
use vsnap_config::RuntimeConfig;

use super::{runc_root, CreateRequest, Creator, MakeRunc};
use crate::bundle_spec::CRI_CONTAINER_TYPE;
use crate::cleanup;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::fakes::{self, FakeRunc};
use crate::runc::{Runc, RuncVerbs};

const NS: &str = "k8s.io";

struct Setup {
    dir: tempfile::TempDir,
    exits: Exits,
    runc: Arc<FakeRunc>,
    make_runc: MakeRunc,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let exits = Exits::default();
        let runc = FakeRunc::new(&dir.path().join("runc-root"), &exits);
        let verbs: Arc<dyn RuncVerbs> = runc.clone();
        let make_runc: MakeRunc = Arc::new(move |_: Runc| verbs.clone());
        Self {
            dir,
            exits,
            runc,
            make_runc,
        }
    }

    /// A bundle for `id` whose spec has `annotations` and `linux`.
    fn bundle(
        &self,
        id: &str,
        annotations: serde_json::Value,
        linux: serde_json::Value,
    ) -> PathBuf {
        let bundle = fakes::bundle(self.dir.path(), id, annotations);
        let path = bundle.join("config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["linux"] = linux;
        std::fs::write(&path, spec.to_string()).unwrap();
        bundle
    }

    async fn create(&self, id: &str, bundle: &Path, terminal: bool) -> Result<Container> {
        let creator = Creator {
            namespace: NS,
            containerd_address: "",
            exits: &self.exits,
            make_runc: &self.make_runc,
        };
        creator
            .create(CreateRequest {
                id: id.into(),
                bundle: bundle.to_path_buf(),
                rootfs: Vec::new(),
                stdio: Stdio::new("", "", "", terminal),
                checkpoint: None,
                config: RuntimeConfig::default(),
            })
            .await
    }
}

#[tokio::test]
async fn a_plain_container_is_created_by_runc_and_keeps_what_it_asks_of_its_spec() {
    let s = Setup::new();
    let bundle = s.bundle(
        "sandbox",
        json!({ CRI_CONTAINER_TYPE: "sandbox" }),
        json!({"cgroupsPath": "/kubepods/pod1/sandbox", "resources": {"memory": {"limit": 1024}}}),
    );
    let before = std::fs::read(bundle.join("config.json")).unwrap();
    let c = s.create("sandbox", &bundle, false).await.unwrap();
    assert_eq!(s.runc.calls(), ["create sandbox"]);
    assert_eq!(c.init.pid, s.runc.pid("sandbox"));
    assert!(!c.start.restores());
    // Kill asks these of the container, not of config.json.
    assert!(c.spec.is_cri_sandbox());
    assert_eq!(
        c.cgroups_path(),
        Some(PathBuf::from("/kubepods/pod1/sandbox"))
    );
    assert_eq!(
        c.spec.value()["linux"]["resources"]["memory"]["limit"],
        1024
    );
    assert!(c.spec.args().is_empty(), "the process is not kept");
    assert_eq!(
        std::fs::read(bundle.join("config.json")).unwrap(),
        before,
        "a plain container's spec is not rewritten"
    );
    // What a delete after this shim's death needs.
    let record = cleanup::Record::read(&bundle).unwrap();
    assert_eq!(record.runc_root, runc_root(None, &bundle, NS));
    assert_eq!(record.control_dir, None);
}

#[tokio::test]
async fn a_container_that_is_no_sandbox_is_not_taken_for_one() {
    let s = Setup::new();
    let bundle = s.bundle(
        "app",
        json!({ CRI_CONTAINER_TYPE: "container" }),
        json!({"cgroupsPath": "system.slice:cri-containerd:app"}),
    );
    let c = s.create("app", &bundle, false).await.unwrap();
    assert!(!c.spec.is_cri_sandbox());
    assert_eq!(
        c.cgroups_path(),
        None,
        "a systemd cgroup is no cgroupfs path"
    );
}

#[tokio::test]
async fn a_terminal_the_spec_and_the_task_disagree_on_is_refused_before_runc() {
    let s = Setup::new();
    let bundle = s.bundle("t", json!({}), json!({}));
    let Err(Error::InvalidArgument(e)) = s.create("t", &bundle, true).await else {
        panic!("a terminal mismatch is an invalid argument");
    };
    assert!(
        e.contains("terminal=false") && e.contains("terminal=true"),
        "{e}"
    );
    assert!(s.runc.calls().is_empty());
    assert!(cleanup::Record::read(&bundle).is_none());
}

#[tokio::test]
async fn a_bad_plan_annotation_fails_the_create_before_runc() {
    let s = Setup::new();
    let bundle = s.bundle("p", json!({"vsnap.io/plan": "sometimes"}), json!({}));
    let e = s
        .create("p", &bundle, false)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("vsnap.io/plan"), "{e}");
    assert!(s.runc.calls().is_empty());
    assert!(cleanup::Record::read(&bundle).is_none());
}

#[tokio::test]
async fn a_bundle_without_a_readable_spec_fails_the_create() {
    let s = Setup::new();
    let bundle = s.dir.path().join("none");
    std::fs::create_dir_all(&bundle).unwrap();
    let e = s
        .create("none", &bundle, false)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
    std::fs::write(bundle.join("config.json"), "{").unwrap();
    let e = s
        .create("none", &bundle, false)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("create: bundle"), "{e}");
    assert!(s.runc.calls().is_empty());
}

#[test]
fn runc_state_goes_to_the_configured_root_or_beside_containerds() {
    let bundle = Path::new("/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1");
    assert_eq!(
        runc_root(Some(Path::new("/run/runc-custom")), bundle, NS),
        PathBuf::from("/run/runc-custom/k8s.io")
    );
    assert_eq!(
        runc_root(None, bundle, NS),
        PathBuf::from("/run/containerd/vsnap-runc/k8s.io")
    );
    // A bundle elsewhere (a test's, a second containerd's unusual layout).
    assert_eq!(
        runc_root(None, Path::new("/tmp/bundles/c1"), NS),
        PathBuf::from("/run/vsnap/runc/k8s.io")
    );
}
