//! The engine an activation wakes: the container and process it runs as,
//! the control dir it waits in (its user's), and where it listens.

use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct Target {
    /// The container's id (it names the activation).
    pub container: String,
    /// The engine's init, whose network namespace the listener is probed in.
    pub pid: i32,
    pub control_dir: PathBuf,
    /// The uid the control dir belongs to (the engine's user).
    pub owner: u32,
    /// `None`: every address (probed on loopback).
    pub host: Option<String>,
    pub port: u16,
}
