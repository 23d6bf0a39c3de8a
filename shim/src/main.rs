//! `containerd-shim-vsnap-v1`: the containerd runtime v2 shim for `io.vsnap.v1`.
//!
//! Ordinary containers run exactly as under containerd's runc shim: every task
//! API call maps onto the runc CLI. Stdio always goes through pipes the shim
//! owns, so a container can later be checkpointed and restored by runc + CRIU.

mod console;
mod container;
mod error;
mod events;
mod exits;
mod labels;
mod options;
mod process;
mod runc;
mod service;
mod snapshot;
mod stdio;
mod task;

/// The runtime name containerd resolves to this binary.
pub const RUNTIME_ID: &str = "io.vsnap.v1";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // `-v` / `-version`, as containerd's shims answer it.
    if std::env::args()
        .skip(1)
        .any(|a| matches!(a.as_str(), "-v" | "-version" | "--version"))
    {
        println!(
            "{}:\n  Runtime: {RUNTIME_ID}\n  Version: {}",
            env!("CARGO_BIN_NAME"),
            env!("CARGO_PKG_VERSION")
        );
        return;
    }
    containerd_shim::asynchronous::run::<service::Service>(RUNTIME_ID, None).await;
}
