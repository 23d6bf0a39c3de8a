//! The `start` command: containerd runs `<shim> ... start` in the bundle and
//! waits for the address of the shim that will serve the container.
//!
//! As containerd's Go shims do, `start` binds the socket itself, hands the
//! listener to the long-running server as fd 3 and answers at once: the
//! server's own start (its runtime, the log fifo, the events connection)
//! overlaps with containerd's first calls, which wait in the socket's
//! backlog. No async runtime runs here.
//!
//! The start parameters come in containerd's two protocols (containerd 2.3+:
//! `BootstrapParams` on stdin, a `BootstrapResult` reply; before: flags,
//! environment and the runtime options on stdin, a JSON reply), as
//! containerd-shim's bootstrap module reads them.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use containerd_shim::bootstrap::{BootstrapParams, BootstrapResult, Extension, LogLevel};
use containerd_shim::{Flags, StartOpts};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Enum, EnumOrUnknown, Message};
use containerd_shim_protos::shim::oci::Options as RuncOptions;
use containerd_shim_protos::TASK_API_VERSION;

use crate::error::{Error, Result};

/// The annotation CRI puts on every container of a pod: one shim per pod.
const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// containerd's events (ttrpc) address, in the environment of the legacy
/// protocol and of the server.
pub const TTRPC_ADDRESS: &str = "TTRPC_ADDRESS";
const GRPC_ADDRESS: &str = "GRPC_ADDRESS";
/// Tells the server that its listener is the inherited fd [`LISTENER_FD`].
pub const LISTENER_ENV: &str = "VSNAP_SHIM_LISTENER_FD";
/// Where the server finds its listener, as containerd's Go shims pass it.
pub const LISTENER_FD: i32 = 3;
/// The bootstrap payload's upper bound, as containerd's.
const MAX_INPUT_SIZE: u64 = 10 << 20;

/// How containerd invoked `start`, which says how to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Bootstrap,
    Legacy,
}

/// `start`: bind the group's socket, start the server on it, answer its address.
pub fn run(flags: &Flags) -> Result<()> {
    let input = read_stdin()?;
    let env = |k| std::env::var(k).unwrap_or_default();
    let (params, protocol) = start_params(&input, flags, env(TTRPC_ADDRESS), env(GRPC_ADDRESS))?;
    let opts = StartOpts::from(params);
    let address = opts.socket_address(&grouping(Path::new("."), &opts.id));
    let reply = encode_reply(&address, protocol)?;
    match listen(&address)? {
        Some(listener) => {
            if let Err(e) = serve_on(&opts, &address, &listener) {
                let _ = std::fs::remove_file(socket_path(&address));
                return Err(e);
            }
        }
        None => write_address(&address)?,
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&reply)
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::io("start: write the reply", e))
}

/// Records the address, spawns the server on `listener` and confines it.
fn serve_on(opts: &StartOpts, address: &str, listener: &UnixListener) -> Result<()> {
    write_address(address)?;
    let mut child = spawn_server(opts, address, listener)?;
    if let Err(e) = confine(opts, child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(())
}

/// The group a container's shim serves: its pod (CRI's sandbox id) or itself.
fn grouping(bundle: &Path, id: &str) -> String {
    crate::bundle_spec::BundleSpec::read(bundle)
        .ok()
        .and_then(|spec| spec.annotation(SANDBOX_ID).map(String::from))
        .unwrap_or_else(|| id.to_string())
}

fn read_stdin() -> Result<Vec<u8>> {
    let stdin = std::io::stdin();
    // Nothing is piped in when the shim is started by hand from a console.
    if stdin.is_terminal() {
        return Ok(Vec::new());
    }
    let mut input = Vec::new();
    stdin
        .lock()
        .take(MAX_INPUT_SIZE)
        .read_to_end(&mut input)
        .map_err(|e| Error::io("start: read the bootstrap params from stdin", e))?;
    Ok(input)
}

/// Whatever containerd passed, as [`BootstrapParams`], and the protocol it used.
fn start_params(
    input: &[u8],
    flags: &Flags,
    ttrpc_address: String,
    grpc_address: String,
) -> Result<(BootstrapParams, Protocol)> {
    let (mut params, protocol) = match bootstrap_params(input, flags)? {
        Some(params) => (params, Protocol::Bootstrap),
        None => {
            let mut params = BootstrapParams {
                instance_id: flags.id.clone(),
                namespace: flags.namespace.clone(),
                containerd_ttrpc_address: ttrpc_address,
                containerd_grpc_address: flags.address.clone(),
                containerd_binary: flags.publish_binary.clone(),
                ..Default::default()
            };
            if params.containerd_grpc_address.is_empty() {
                params.containerd_grpc_address = grpc_address;
            }
            // The runtime options, if any, come as an `Any` on stdin.
            if let Ok(any) = Any::parse_from_bytes(input) {
                if !any.type_url.is_empty() {
                    params.extensions.push(Extension {
                        value: Some(any).into(),
                        ..Default::default()
                    });
                }
            }
            (params, Protocol::Legacy)
        }
    };
    if flags.debug && params.log_level.value() > LogLevel::LOG_LEVEL_DEBUG.value() {
        params.log_level = EnumOrUnknown::new(LogLevel::LOG_LEVEL_DEBUG);
    }
    // The server publishes events there: fail here, where containerd reads
    // the error, not in the detached server.
    if params.containerd_ttrpc_address.is_empty() {
        return Err(Error::InvalidArgument(match protocol {
            Protocol::Bootstrap => "start: the bootstrap params carry no TTRPC address".into(),
            Protocol::Legacy => format!("start: {TTRPC_ADDRESS} is not set"),
        }));
    }
    Ok((params, protocol))
}

/// `input` as containerd 2.3's [`BootstrapParams`]; `None` for the legacy
/// protocol (nothing, or the runtime options, on stdin).
fn bootstrap_params(input: &[u8], flags: &Flags) -> Result<Option<BootstrapParams>> {
    if input.is_empty() {
        return Ok(None);
    }
    let Ok(params) = BootstrapParams::parse_from_bytes(input) else {
        return Ok(None);
    };
    if params.instance_id == flags.id && params.namespace == flags.namespace {
        return Ok(Some(params));
    }
    // A legacy `Any` decodes as BootstrapParams too: its type URL lands in
    // `instance_id`, its value in `namespace`, and nothing else is set.
    let identity_only = BootstrapParams {
        instance_id: params.instance_id.clone(),
        namespace: params.namespace.clone(),
        ..Default::default()
    };
    if params == identity_only {
        return Ok(None);
    }
    Err(Error::InvalidArgument(format!(
        "start: bootstrap params for {}/{} do not match the flags {}/{}",
        params.namespace, params.instance_id, flags.namespace, flags.id
    )))
}

/// The answer to `start` in the protocol containerd used.
fn encode_reply(address: &str, protocol: Protocol) -> Result<Vec<u8>> {
    let encoded = match protocol {
        Protocol::Legacy => serde_json::to_vec(&serde_json::json!({
            "version": TASK_API_VERSION,
            "address": address,
            "protocol": "ttrpc",
        }))
        .map_err(|e| Error::Other(e.to_string())),
        Protocol::Bootstrap => BootstrapResult {
            version: TASK_API_VERSION,
            address: address.to_string(),
            protocol: "ttrpc".to_string(),
            ..Default::default()
        }
        .write_to_bytes()
        .map_err(|e| Error::Other(e.to_string())),
    };
    encoded.map_err(|e| Error::Other(format!("start: encode the reply: {e}")))
}

fn socket_path(address: &str) -> &str {
    address.strip_prefix("unix://").unwrap_or(address)
}

/// A listener on the group's socket; `None` when a live shim already serves
/// it (another container of the same pod): its address is the answer.
fn listen(address: &str) -> Result<Option<UnixListener>> {
    let path = Path::new(socket_path(address));
    let bind = || {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        UnixListener::bind(path)
    };
    let context = |e| Error::io(format!("start: listen on {address}"), e);
    match bind() {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Ok(None);
            }
            // A dead shim's socket: only a socket is removed.
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path).map_err(context)?;
            }
            bind().map(Some).map_err(context)
        }
        Err(e) => Err(context(e)),
    }
}

/// The bundle's `address` file, which containerd and the server read.
fn write_address(address: &str) -> Result<()> {
    std::fs::write("address", address).map_err(|e| Error::io("start: write the address file", e))
}

/// The long-running server: the same binary, serving `listener` (fd 3).
fn spawn_server(opts: &StartOpts, address: &str, listener: &UnixListener) -> Result<Child> {
    let exe = std::env::current_exe().map_err(|e| Error::io("start: the shim's own path", e))?;
    let mut command = Command::new(exe);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .args(["-namespace", &opts.namespace, "-id", &opts.id])
        .args(["-address", &opts.address, "-socket", address])
        .env(LISTENER_ENV, LISTENER_FD.to_string());
    if !opts.ttrpc_address.is_empty() {
        command.env(TTRPC_ADDRESS, &opts.ttrpc_address);
    }
    if opts.debug {
        command.arg("-debug");
    }
    let fd = listener.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            // dup2 onto itself keeps FD_CLOEXEC: clear it by hand then.
            let ok = if fd == LISTENER_FD {
                libc::fcntl(fd, libc::F_SETFD, 0) >= 0
            } else {
                libc::dup2(fd, LISTENER_FD) >= 0
            };
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command
        .spawn()
        .map_err(|e| Error::io("start: spawn the shim server", e))
}

/// Moves the server into the runtime options' `shim_cgroup` (runc's options
/// type only) and sets its OOM score one above containerd's.
fn confine(opts: &StartOpts, pid: u32) -> Result<()> {
    let options = opts
        .extension::<RuncOptions>()
        .map_err(|e| Error::InvalidArgument(format!("start: runtime options: {e}")))?;
    let cgroup = options.map(|o| o.shim_cgroup).unwrap_or_default();
    if !cgroup.is_empty() {
        crate::confine::join_cgroup(Path::new(crate::confine::CGROUP_ROOT), &cgroup, pid)?;
    }
    crate::confine::adjust_oom_score(std::os::unix::process::parent_id(), pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Flags {
        Flags {
            id: "c1".into(),
            namespace: "k8s.io".into(),
            address: "/run/containerd/containerd.sock".into(),
            ..Default::default()
        }
    }

    fn runc_options_any() -> Any {
        let o = RuncOptions {
            shim_cgroup: "/shims".into(),
            ..Default::default()
        };
        Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        }
    }

    #[test]
    fn legacy_protocol_takes_flags_environment_and_the_options_on_stdin() {
        let input = runc_options_any().write_to_bytes().unwrap();
        let (params, protocol) =
            start_params(&input, &flags(), "/ttrpc".into(), "/grpc".into()).unwrap();
        assert_eq!(protocol, Protocol::Legacy);
        let opts = StartOpts::from(params);
        assert_eq!(opts.ttrpc_address, "/ttrpc");
        assert_eq!(opts.address, "/run/containerd/containerd.sock");
        let o = opts.extension::<RuncOptions>().unwrap().unwrap();
        assert_eq!(o.shim_cgroup, "/shims");
        let reply: serde_json::Value =
            serde_json::from_slice(&encode_reply("unix:///s/x", protocol).unwrap()).unwrap();
        assert_eq!(reply["address"], "unix:///s/x");
        assert_eq!(reply["protocol"], "ttrpc");
        assert_eq!(reply["version"], TASK_API_VERSION);
    }

    #[test]
    fn legacy_protocol_without_a_ttrpc_address_is_refused() {
        let err = start_params(&[], &flags(), String::new(), String::new()).unwrap_err();
        assert!(err.to_string().contains("TTRPC_ADDRESS"), "{err}");
    }

    #[test]
    fn bootstrap_protocol_is_answered_in_kind() {
        let params = BootstrapParams {
            instance_id: "c1".into(),
            namespace: "k8s.io".into(),
            containerd_ttrpc_address: "/ttrpc".into(),
            containerd_grpc_address: "/grpc".into(),
            ..Default::default()
        };
        let input = params.write_to_bytes().unwrap();
        let (parsed, protocol) =
            start_params(&input, &flags(), String::new(), String::new()).unwrap();
        assert_eq!(protocol, Protocol::Bootstrap);
        assert_eq!(parsed.containerd_grpc_address, "/grpc");
        let reply =
            BootstrapResult::parse_from_bytes(&encode_reply("unix:///s/x", protocol).unwrap())
                .unwrap();
        assert_eq!(reply.address, "unix:///s/x");
        assert_eq!(reply.version, TASK_API_VERSION);
    }

    #[test]
    fn bootstrap_params_for_another_container_are_refused() {
        let params = BootstrapParams {
            instance_id: "other".into(),
            namespace: "k8s.io".into(),
            containerd_ttrpc_address: "/ttrpc".into(),
            ..Default::default()
        };
        let input = params.write_to_bytes().unwrap();
        let err = start_params(&input, &flags(), String::new(), String::new()).unwrap_err();
        assert!(err.to_string().contains("k8s.io/other"), "{err}");
    }

    #[test]
    fn a_live_socket_is_reused_and_a_dead_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s/sock");
        let address = format!("unix://{}", path.display());
        let live = listen(&address).unwrap().expect("a fresh socket is bound");
        assert!(
            listen(&address).unwrap().is_none(),
            "a live shim's socket is its answer"
        );
        drop(live);
        assert!(
            listen(&address).unwrap().is_some(),
            "a dead socket is bound again"
        );
    }
}
