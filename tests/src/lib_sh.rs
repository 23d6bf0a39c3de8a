//! What the harness shares with the project's scripts: the private
//! containerd's config and the root filesystems are defined once, in
//! `scripts/lib.sh`, and made here by running its functions with bash, so a
//! test, a benchmark, the demo and the tour run the same config and folders.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

/// `scripts/lib.sh` of this checkout.
pub const LIB_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/lib.sh");

/// Runs `function args...` of `scripts/lib.sh` under `bash -euo pipefail`
/// and returns what it printed. Panics, with what it said on stderr, when
/// it fails.
fn call(function: &str, args: &[&OsStr]) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"set -euo pipefail; . "$0"; "$@""#)
        .arg(LIB_SH)
        .arg(function)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("bash {LIB_SH} {function}: {e}"));
    assert!(
        out.status.success(),
        "{function} of {LIB_SH} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 from lib.sh")
}

/// Which of containerd's plugins an instance runs besides the core ones
/// (NRI is always off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugins {
    /// CRI off too: instances never share a socket.
    NoCri,
    /// CRI on; its tables follow the config.
    Cri,
}

/// `vsnap_containerd_config`: the config of a private containerd in `dir`
/// (its own root, state and socket), with the debug log `level`. Ends with
/// tables: append only tables to it.
pub fn containerd_config(dir: &Path, level: Option<&str>, plugins: Plugins) -> String {
    let plugins = match plugins {
        Plugins::NoCri => "",
        Plugins::Cri => "cri",
    };
    call(
        "vsnap_containerd_config",
        &[
            dir.as_os_str(),
            OsStr::new(level.unwrap_or("")),
            OsStr::new(plugins),
        ],
    )
}

/// `vsnap_busybox_rootfs`: makes `root` a busybox root filesystem.
pub fn busybox_rootfs(root: &Path) {
    call("vsnap_busybox_rootfs", &[root.as_os_str()]);
}

/// `vsnap_engine_rootfs`: makes `root` a busybox root filesystem with the
/// reference engine `engine` at `/vsnap-ref-engine` and its libraries.
pub fn engine_rootfs(root: &Path, engine: &Path) {
    call(
        "vsnap_engine_rootfs",
        &[root.as_os_str(), engine.as_os_str()],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vsnap-lib-sh-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_config_is_the_instances_own_with_cri_off_unless_asked() {
        let dir = Path::new("/tmp/vsnap-test-1-0-x");
        let off = containerd_config(dir, Some("debug"), Plugins::NoCri);
        assert_eq!(
            off,
            "version = 3\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\", \"io.containerd.nri.v1.nri\"]\n\
             root = \"/tmp/vsnap-test-1-0-x/root\"\n\
             state = \"/tmp/vsnap-test-1-0-x/state\"\n\
             [grpc]\n  address = \"/tmp/vsnap-test-1-0-x/state/containerd.sock\"\n\
             # As docs/kubernetes.md asks of a vsnap node: the dead-shim delete's budget.\n\
             [timeouts]\n  \"io.containerd.timeout.shim.cleanup\" = \"30s\"\n\
             [debug]\n  level = \"debug\"\n"
        );
        let cri = containerd_config(dir, Some("debug"), Plugins::Cri);
        assert_eq!(
            cri,
            off.replace(
                "\"io.containerd.grpc.v1.cri\", \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\", ",
                ""
            )
        );
        let quiet = containerd_config(dir, None, Plugins::NoCri);
        assert_eq!(quiet, off.replace("[debug]\n  level = \"debug\"\n", ""));
    }

    #[test]
    fn a_busybox_rootfs_has_busybox_its_applets_and_folders() {
        if !Path::new("/bin/busybox").exists() {
            eprintln!("skipped: no /bin/busybox (scripts/setup.sh installs busybox-static)");
            return;
        }
        let dir = scratch("busybox");
        let root = dir.join("rootfs");
        busybox_rootfs(&root);
        // Again on the same folder: what is there is kept, nothing fails.
        busybox_rootfs(&root);
        assert!(root.join("bin/busybox").is_file());
        for a in ["sh", "sleep", "true", "wc"] {
            let link = std::fs::read_link(root.join("bin").join(a)).unwrap();
            assert_eq!(link, Path::new("busybox"));
        }
        for d in ["proc", "sys", "dev", "tmp", "etc", "out"] {
            assert!(root.join(d).is_dir(), "{d}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_engine_rootfs_carries_the_binary_and_what_it_links_against() {
        if !Path::new("/bin/busybox").exists() {
            eprintln!("skipped: no /bin/busybox (scripts/setup.sh installs busybox-static)");
            return;
        }
        // Any dynamically linked binary stands in for the engine.
        let engine = Path::new("/bin/ls");
        let dir = scratch("engine");
        let root = dir.join("rootfs");
        engine_rootfs(&root, engine);
        assert!(root.join("vsnap-ref-engine").is_file());
        assert!(root.join("bin/sh").symlink_metadata().is_ok());
        for d in ["run", "lib", "lib64"] {
            assert!(root.join(d).is_dir(), "{d}");
        }
        let ldd = Command::new("ldd").arg(engine).output().unwrap();
        let ldd = String::from_utf8_lossy(&ldd.stdout);
        let libs: Vec<&str> = ldd
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
            .collect();
        assert!(!libs.is_empty(), "{ldd}");
        for lib in libs {
            assert!(root.join(&lib[1..]).is_file(), "{lib} not copied");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
