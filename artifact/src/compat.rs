//! Host compatibility: may an artifact captured on one host be restored on
//! another (or on the same host, later)? Not "is this the same host": the
//! per-host MAC already binds a local artifact to the host that made it,
//! and a fleet signature binds a shared one to the fleet (security.md), so
//! this module asks only what a correct restore needs of the live host.
//! The shim's preflight, `vsnap-hook fingerprint` and `vsnap verify` all
//! apply these rules; docs/fleet.md has them as a table.
//!
//! | field | rule | why |
//! |---|---|---|
//! | `cpu_model` | equal | one microarchitecture: code the engine JIT-compiled or chose at start-up (oneDNN, torch, glibc ifuncs) assumes it |
//! | `cpu_flags` | live has every captured flag | an instruction the restored code already dispatched to must exist; CRIU's own `cpu-cap=fpu` check compares the xsave state the same way, later and less readably. More flags are harmless |
//! | `kernel_release` | same series (major.minor) | a stable series keeps the kernel state CRIU restores and its features; a security update (6.1.0-28 to 6.1.0-29) must not void a fleet's artifacts |
//! | `runc_version`, `criu_version` | equal | CRIU's image format and restore behaviour, runc's restore of the bundle |
//! | `runc_sha256`, `criu_sha256` | may differ | the same version rebuilt (each host building CRIU from the same source) is not byte-identical; a binary swapped under the same version is root's doing, and root is trusted |
//! | `cuda_plugin_sha256`, `cuda_checkpoint_sha256` | equal when the artifact has GPUs, else may differ | neither has a version; their code moves CUDA state, and on a CPU-only tree they do nothing |
//! | `shim_version` | may differ | the artifact's format is the manifest's `schema_version`, which the manifest's parser checks strictly (it reads the current and the previous format; another is refused, naming the versions it reads), and the handshake of a restore is the protocol's; requiring an equal shim would void every artifact at every upgrade of vsnap |
//! | `gpus` | same count, and in order the same model and driver | CUDA state is restored onto device N as it was captured from device N; the driver must be the one that wrote it. Which physical GPU (its UUID) does not matter |
//! | `machine_id` | may differ | identity, not compatibility: the MAC and the signature decide whose artifact is used |

use crate::fingerprint::HostIdentity;
use crate::gpu::Gpu;

pub use crate::cpu::{cpu_flags, RELEVANT_CPU_FLAGS};

/// The kernel series of a release: its first two numbers (`6.1` of
/// `6.1.0-28-amd64`); the whole release when it has no such prefix.
pub fn kernel_series(release: &str) -> String {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|p| !p.is_empty());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}"),
        _ => release.to_string(),
    }
}

/// `name driver` of a `name uuid driver` GPU entry: which GPU it is does
/// not matter, what it is does ([`Gpu::model_and_driver`]). An entry that is
/// no GPU is compared whole.
pub fn gpu_model_and_driver(entry: &str) -> String {
    entry
        .parse::<Gpu>()
        .map(|gpu| gpu.model_and_driver())
        .unwrap_or_else(|_| entry.to_string())
}

/// What a comparison found: the differences that forbid a restore, and
/// those the rules allow (for reports).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub incompatible: Vec<String>,
    pub tolerated: Vec<String>,
}

/// Every field of `live` that forbids restoring what was captured on
/// `captured`, as `host.FIELD: captured X, live Y`. Empty: compatible.
pub fn incompatibilities(captured: &HostIdentity, live: &HostIdentity) -> Vec<String> {
    compare(captured, live).incompatible
}

/// Both lists: see the module's table for each rule.
pub fn compare(captured: &HostIdentity, live: &HostIdentity) -> Comparison {
    // Destructured whole, so a new field of HostIdentity does not compile
    // until it has a rule here.
    let HostIdentity {
        machine_id,
        kernel_release,
        cpu_model,
        cpu_flags,
        runc_version,
        runc_sha256,
        criu_version,
        criu_sha256,
        cuda_plugin_sha256,
        cuda_checkpoint_sha256,
        shim_version,
        gpus,
    } = captured;
    let uses_gpus = !gpus.is_empty();
    let same_series = kernel_series(kernel_release) == kernel_series(&live.kernel_release);
    let mut out = Comparison::default();
    // (field, captured, live, whether a difference forbids the restore)
    for (name, a, b, must_match) in [
        ("machine_id", machine_id, &live.machine_id, false),
        (
            "kernel_release",
            kernel_release,
            &live.kernel_release,
            !same_series,
        ),
        ("cpu_model", cpu_model, &live.cpu_model, true),
        ("runc_version", runc_version, &live.runc_version, true),
        ("runc_sha256", runc_sha256, &live.runc_sha256, false),
        ("criu_version", criu_version, &live.criu_version, true),
        ("criu_sha256", criu_sha256, &live.criu_sha256, false),
        (
            "cuda_plugin_sha256",
            cuda_plugin_sha256,
            &live.cuda_plugin_sha256,
            uses_gpus,
        ),
        (
            "cuda_checkpoint_sha256",
            cuda_checkpoint_sha256,
            &live.cuda_checkpoint_sha256,
            uses_gpus,
        ),
        ("shim_version", shim_version, &live.shim_version, false),
    ] {
        out.check_field(name, a, b, must_match);
    }
    out.check_cpu_flags(cpu_flags, &live.cpu_flags);
    out.check_gpus(gpus, &live.gpus);
    out
}

impl Comparison {
    /// A field compared whole: a difference is incompatible or tolerated
    /// as `must_match` says.
    fn check_field(&mut self, name: &str, a: &str, b: &str, must_match: bool) {
        if a != b {
            let line = format!("host.{name}: captured {a:?}, live {b:?}");
            if must_match {
                self.incompatible.push(line);
            } else {
                self.tolerated.push(line);
            }
        }
    }

    /// The live CPU must have every captured flag; more are harmless.
    fn check_cpu_flags(&mut self, captured: &[String], live: &[String]) {
        let missing: Vec<&str> = captured
            .iter()
            .filter(|f| !live.contains(f))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            self.incompatible.push(format!(
                "host.cpu_flags: captured with {:?}, live lacks them",
                missing.join(" ")
            ));
        }
    }

    /// The same GPU models and drivers in order; other UUIDs are tolerated.
    fn check_gpus(&mut self, captured: &[String], live: &[String]) {
        let models =
            |g: &[String]| -> Vec<String> { g.iter().map(|e| gpu_model_and_driver(e)).collect() };
        let (captured_gpus, live_gpus) = (models(captured), models(live));
        if captured_gpus != live_gpus {
            self.incompatible.push(format!(
                "host.gpus: captured {captured_gpus:?}, live {live_gpus:?} (model and driver, in order)"
            ));
        } else if captured != live {
            self.tolerated
                .push(format!("host.gpus: captured {captured:?}, live {live:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostIdentity {
        HostIdentity {
            machine_id: "aaaa".into(),
            kernel_release: "6.1.0-28-amd64".into(),
            cpu_model: "Intel(R) Xeon(R) Platinum 8480+".into(),
            cpu_flags: ["avx", "avx2", "avx512f", "fpu", "xsave"]
                .map(String::from)
                .to_vec(),
            runc_version: "runc version 1.1.5+ds1".into(),
            runc_sha256: "11".repeat(32),
            criu_version: "Version: 4.2".into(),
            criu_sha256: "22".repeat(32),
            cuda_plugin_sha256: "33".repeat(32),
            cuda_checkpoint_sha256: "absent".into(),
            shim_version: "0.1.0".into(),
            gpus: Vec::new(),
        }
    }

    fn gpu_host() -> HostIdentity {
        HostIdentity {
            gpus: vec![
                "NVIDIA H200 GPU-aaaa-1 570.124.06".into(),
                "NVIDIA H200 GPU-aaaa-2 570.124.06".into(),
            ],
            cuda_checkpoint_sha256: "44".repeat(32),
            ..host()
        }
    }

    /// Only `field` is refused, named with both values.
    fn refused(captured: &HostIdentity, live: &HostIdentity, field: &str, values: &[&str]) {
        let found = incompatibilities(captured, live);
        assert_eq!(found.len(), 1, "{field}: {found:?}");
        assert!(
            found[0].starts_with(&format!("host.{field}: captured ")),
            "{found:?}"
        );
        for v in values {
            assert!(found[0].contains(v), "{v} in {found:?}");
        }
    }

    fn accepted(captured: &HostIdentity, live: &HostIdentity, field: &str) {
        let c = compare(captured, live);
        assert!(c.incompatible.is_empty(), "{field}: {:?}", c.incompatible);
        assert!(
            c.tolerated
                .iter()
                .any(|t| t.starts_with(&format!("host.{field}: "))),
            "{field} is reported as tolerated: {:?}",
            c.tolerated
        );
    }

    #[test]
    fn the_same_host_is_compatible() {
        assert_eq!(compare(&host(), &host()), Comparison::default());
        assert_eq!(compare(&gpu_host(), &gpu_host()), Comparison::default());
    }

    #[test]
    fn another_cpu_model_is_refused() {
        let live = HostIdentity {
            cpu_model: "AMD EPYC 9654".into(),
            ..host()
        };
        refused(&host(), &live, "cpu_model", &["8480+", "EPYC 9654"]);
    }

    #[test]
    fn a_missing_cpu_flag_is_refused_and_an_extra_one_accepted() {
        let mut live = host();
        live.cpu_flags.retain(|f| f != "avx512f");
        let found = incompatibilities(&host(), &live);
        assert_eq!(
            found,
            ["host.cpu_flags: captured with \"avx512f\", live lacks them"]
        );
        let mut more = host();
        more.cpu_flags.push("amx_tile".into());
        assert!(incompatibilities(&host(), &more).is_empty());
    }

    #[test]
    fn another_kernel_series_is_refused() {
        let live = HostIdentity {
            kernel_release: "6.6.13-amd64".into(),
            ..host()
        };
        refused(
            &host(),
            &live,
            "kernel_release",
            &["6.1.0-28-amd64", "6.6.13-amd64"],
        );
    }

    #[test]
    fn another_kernel_of_the_same_series_is_accepted() {
        let live = HostIdentity {
            kernel_release: "6.1.0-29-amd64".into(),
            ..host()
        };
        accepted(&host(), &live, "kernel_release");
    }

    #[test]
    fn another_runc_version_is_refused() {
        let live = HostIdentity {
            runc_version: "runc version 1.2.0".into(),
            ..host()
        };
        refused(&host(), &live, "runc_version", &["1.1.5+ds1", "1.2.0"]);
    }

    #[test]
    fn another_criu_version_is_refused() {
        let live = HostIdentity {
            criu_version: "Version: 4.1".into(),
            ..host()
        };
        refused(&host(), &live, "criu_version", &["4.2", "4.1"]);
    }

    #[test]
    fn another_shim_version_is_tolerated_and_reported() {
        let live = HostIdentity {
            shim_version: "0.2.0".into(),
            ..host()
        };
        accepted(&host(), &live, "shim_version");
        assert_eq!(
            compare(&host(), &live).tolerated,
            ["host.shim_version: captured \"0.1.0\", live \"0.2.0\""]
        );
    }

    #[test]
    fn another_cuda_plugin_is_refused_for_a_gpu_artifact() {
        let live = HostIdentity {
            cuda_plugin_sha256: "55".repeat(32),
            ..gpu_host()
        };
        refused(&gpu_host(), &live, "cuda_plugin_sha256", &["3333", "5555"]);
    }

    #[test]
    fn another_cuda_checkpoint_is_refused_for_a_gpu_artifact() {
        let live = HostIdentity {
            cuda_checkpoint_sha256: "absent".into(),
            ..gpu_host()
        };
        refused(
            &gpu_host(),
            &live,
            "cuda_checkpoint_sha256",
            &["4444", "absent"],
        );
    }

    #[test]
    fn another_gpu_model_or_driver_or_count_is_refused() {
        for gpus in [
            vec![
                "NVIDIA H100 80GB HBM3 GPU-aaaa-1 570.124.06",
                "NVIDIA H200 GPU-aaaa-2 570.124.06",
            ],
            vec![
                "NVIDIA H200 GPU-aaaa-1 570.124.06",
                "NVIDIA H200 GPU-aaaa-2 575.51.03",
            ],
            vec!["NVIDIA H200 GPU-aaaa-1 570.124.06"],
        ] {
            let live = HostIdentity {
                gpus: gpus.iter().map(|g| g.to_string()).collect(),
                ..gpu_host()
            };
            let found = incompatibilities(&gpu_host(), &live);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(
                found[0].starts_with(
                    "host.gpus: captured [\"NVIDIA H200 570.124.06\", \"NVIDIA H200 570.124.06\"], live ["
                ),
                "{found:?}"
            );
            assert!(!found[0].contains("GPU-aaaa"), "no UUIDs: {found:?}");
        }
    }

    #[test]
    fn other_gpus_of_the_same_model_and_driver_are_accepted() {
        let live = HostIdentity {
            gpus: vec![
                "NVIDIA H200 GPU-bbbb-7 570.124.06".into(),
                "NVIDIA H200 GPU-bbbb-3 570.124.06".into(),
            ],
            ..gpu_host()
        };
        accepted(&gpu_host(), &live, "gpus");
    }

    #[test]
    fn another_machine_id_is_accepted() {
        let live = HostIdentity {
            machine_id: "bbbb".into(),
            ..host()
        };
        accepted(&host(), &live, "machine_id");
    }

    #[test]
    fn another_build_of_the_same_runc_and_criu_versions_is_accepted() {
        let live = HostIdentity {
            runc_sha256: "aa".repeat(32),
            ..host()
        };
        accepted(&host(), &live, "runc_sha256");
        let live = HostIdentity {
            criu_sha256: "bb".repeat(32),
            ..host()
        };
        accepted(&host(), &live, "criu_sha256");
    }

    #[test]
    fn cuda_tools_may_differ_for_a_cpu_artifact() {
        let live = HostIdentity {
            cuda_plugin_sha256: "absent".into(),
            ..host()
        };
        accepted(&host(), &live, "cuda_plugin_sha256");
        let live = HostIdentity {
            cuda_checkpoint_sha256: "55".repeat(32),
            ..host()
        };
        accepted(&host(), &live, "cuda_checkpoint_sha256");
    }

    #[test]
    fn every_difference_at_once_is_named_once() {
        let live = HostIdentity {
            machine_id: "x".into(),
            kernel_release: "5.10.0".into(),
            cpu_model: "x".into(),
            cpu_flags: Vec::new(),
            runc_version: "x".into(),
            runc_sha256: "x".into(),
            criu_version: "x".into(),
            criu_sha256: "x".into(),
            cuda_plugin_sha256: "x".into(),
            cuda_checkpoint_sha256: "x".into(),
            shim_version: "x".into(),
            gpus: vec!["x".into()],
        };
        let c = compare(&gpu_host(), &live);
        let fields = |lines: &[String]| -> Vec<String> {
            lines
                .iter()
                .map(|l| l.split(':').next().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            fields(&c.incompatible),
            [
                "host.kernel_release",
                "host.cpu_model",
                "host.runc_version",
                "host.criu_version",
                "host.cuda_plugin_sha256",
                "host.cuda_checkpoint_sha256",
                "host.cpu_flags",
                "host.gpus",
            ]
        );
        assert_eq!(
            fields(&c.tolerated),
            [
                "host.machine_id",
                "host.runc_sha256",
                "host.criu_sha256",
                "host.shim_version"
            ]
        );
    }

    #[test]
    fn cpu_flags_keep_what_a_restore_depends_on() {
        let cpuinfo = "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu vme de pse tsc avx2 avx512f constant_tsc md_clear xsave avx2 hypervisor\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: fpu\n";
        assert_eq!(cpu_flags(cpuinfo), ["avx2", "avx512f", "fpu", "xsave"]);
        let arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics cpuid sve\n";
        assert_eq!(
            cpu_flags(arm),
            ["aes", "asimd", "atomics", "crc32", "fp", "pmull", "sha1", "sha2", "sve"]
        );
        assert!(cpu_flags("").is_empty());
    }

    #[test]
    fn kernel_series_and_gpu_models_parse() {
        assert_eq!(kernel_series("6.1.0-28-amd64"), "6.1");
        assert_eq!(kernel_series("6.12.9+bpo-cloud-amd64"), "6.12");
        assert_eq!(kernel_series("5.15.0-1057-azure"), "5.15");
        assert_eq!(kernel_series("weird"), "weird");
        assert_eq!(kernel_series("6"), "6");
        assert_eq!(
            gpu_model_and_driver("NVIDIA H100 80GB HBM3 GPU-1234 570.124.06"),
            "NVIDIA H100 80GB HBM3 570.124.06"
        );
        assert_eq!(gpu_model_and_driver("x"), "x");
    }
}
