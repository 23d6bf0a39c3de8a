//! `containerd-shim-vsnap-v1`: the containerd runtime v2 shim for `io.vsnap.v1`.
//!
//! Ordinary containers run exactly as under containerd's runc shim: every task
//! API call maps onto the runc CLI. Stdio always goes through pipes the shim
//! owns, so a container can later be checkpointed and restored by runc + CRIU.

mod any;
mod bootstrap;
mod bundle_spec;
mod capture_task;
mod cleanup;
mod confine;
mod console;
mod container;
mod deadline;
mod error;
mod events;
mod exits;
#[cfg(test)]
mod fakes;
mod grpc;
mod inflight;
mod info;
mod init_start;
mod init_state;
mod labels;
mod lifecycle;
// Not called until task.rs wires stats and TaskOOM to them.
mod cgroup_stats;
mod mounts;
mod netns_holder;
mod oom;
mod options;
mod pipes;
mod prepared;
mod process;
mod requests;
mod runc;
mod server;
mod service;
mod shared;
mod snapshot;
mod stdio;
mod task;
mod vsnap_cli;

use std::os::unix::net::UnixListener;

/// The runtime name containerd resolves to this binary.
pub const RUNTIME_ID: &str = "io.vsnap.v1";

/// How long a blocking-pool thread (tokio::fs, spawn_blocking) outlives its
/// last task: an idle shim keeps only its runtime's thread.
const BLOCKING_THREAD_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(500);

fn main() {
    // Taken first: nothing else may see or inherit it.
    let listener = server::inherited_listener();
    let args: Vec<_> = std::env::args_os().collect();
    let arg = |names: &[&str]| args.iter().skip(1).any(|a| names.iter().any(|n| a == n));
    // `-v` / `-version`, as containerd's shims answer it.
    if arg(&["-v", "-version", "--version"]) {
        println!(
            "{}:\n  Runtime: {RUNTIME_ID}\n  Version: {}",
            env!("CARGO_BIN_NAME"),
            env!("CARGO_PKG_VERSION")
        );
        return;
    }
    if arg(&["-h", "-help", "--help"]) {
        print!("{}", usage());
        return;
    }
    let done = containerd_shim::parse(&args[1..])
        .map_err(|e| error::Error::InvalidArgument(e.to_string()))
        .and_then(|flags| run(flags, listener));
    if let Err(e) = done {
        eprintln!("{RUNTIME_ID}: {e}");
        std::process::exit(1);
    }
}

/// One shim command. `start` and `-info` run without an async runtime; a
/// runtime (one thread) is built only for `delete` and the server.
fn run(flags: containerd_shim::Flags, listener: Option<UnixListener>) -> error::Result<()> {
    if flags.info {
        return service::info(RUNTIME_ID);
    }
    match flags.action.as_str() {
        "start" => bootstrap::run(&flags),
        "delete" => {
            server::set_subreaper()?;
            runtime().block_on(service::delete(&flags))
        }
        _ => {
            server::set_subreaper()?;
            runtime().block_on(server::serve(flags, listener))
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .build()
        .expect("the shim's runtime starts")
}

/// `-h` / `--help`: the flags containerd passes, as its shims print them.
fn usage() -> String {
    format!(
        "Usage of {bin} ({RUNTIME_ID}), started by containerd:\n\
         \x20 {bin} [flags] start|delete\n\
         \x20 -namespace string   namespace that owns the shim\n\
         \x20 -id string          id of the task\n\
         \x20 -address string     grpc address back to main containerd\n\
         \x20 -publish-binary string  (unused: events go over ttrpc)\n\
         \x20 -bundle string      path to the bundle if not workdir\n\
         \x20 -debug              enable debug output in logs\n\
         \x20 -socket string      socket path to serve\n\
         \x20 -v, -version        show the shim version and exit\n\
         \x20 -h, -help           show this help and exit\n\
         Runtime options: docs/configuration.md (TOML at the runtime's ConfigPath).\n",
        bin = env!("CARGO_BIN_NAME")
    )
}
