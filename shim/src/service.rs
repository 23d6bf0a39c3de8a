//! The short shim commands besides `start` (bootstrap.rs): `delete`, which
//! containerd runs in the bundle after a shim died, and `-info`.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use crate::cleanup;
use crate::error::{Error, Result};
use crate::lifecycle::create::runc_root;
use containerd_shim::util::convert_to_timestamp;
use containerd_shim::{api, Flags};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};

/// Cleans up after a shim that died: containerd runs `delete` in the
/// bundle. What the shim recorded there (cleanup.rs) says which runc to
/// ask and what was in flight; runc and CRIU are stopped and their mounts
/// undone before runc's state goes. The answer goes to stdout.
pub async fn delete(flags: &Flags) -> Result<()> {
    crate::server::start_reaper()?;
    let bundle = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let config = crate::options::from_any(None).unwrap_or_default();
    let fallback = cleanup::default_runc(
        config.runc_binary,
        runc_root(config.runc_root.as_deref(), &bundle, &flags.namespace),
        config.systemd_cgroup,
    )
    .await;
    cleanup::dead_shim_delete(&bundle, &flags.id, fallback).await;
    let response = api::DeleteResponse {
        exited_at: MessageField::some(convert_to_timestamp(Some(time::OffsetDateTime::now_utc()))),
        // As containerd's runc shim: the task was killed.
        exit_status: 128 + libc::SIGKILL as u32,
        ..Default::default()
    };
    write_stdout("delete", &response)
}

/// `-info`: the runtime options on stdin, a `RuntimeInfo` on stdout.
pub fn info(runtime_id: &str) -> Result<()> {
    let mut input = Vec::new();
    let stdin = std::io::stdin();
    // Nothing is piped in when it is run by hand from a console.
    if !stdin.is_terminal() {
        stdin
            .lock()
            .read_to_end(&mut input)
            .map_err(|e| Error::io("info: read the runtime options from stdin", e))?;
    }
    let options =
        if input.is_empty() {
            None
        } else {
            Some(Any::parse_from_bytes(&input).map_err(|e| {
                Error::InvalidArgument(format!("info: runtime options on stdin: {e}"))
            })?)
        };
    write_stdout(
        "info",
        &crate::info::runtime_info(runtime_id, options.as_ref()),
    )
}

fn write_stdout<M: Message>(phase: &str, message: &M) -> Result<()> {
    let bytes = message
        .write_to_bytes()
        .map_err(|e| Error::Other(format!("{phase}: encode the answer: {e}")))?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::io(format!("{phase}: write the answer"), e))
}
