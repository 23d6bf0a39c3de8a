//! Failure injection, driven by environment variables, so tests and demos can make the
//! engine misbehave in each phase the way a real engine might. See docs/protocol.md.

use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::IntoRawFd;
use std::time::Duration;

use vsnap_protocol::Oracle;

use crate::failure::Failure;
use crate::log;
use crate::model::{token_text, VOCAB};

/// How the recovered canary is perturbed (VSNAP_ENGINE_CANARY_DRIFT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// `1` or `logprob`: the logprob moves by 0.01, ten times the tolerance.
    Logprob,
    /// `token`: a different token comes out.
    Token,
}

#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// VSNAP_ENGINE_FAIL_PHASE: write error.json and exit 1 on entering the phase.
    pub fail: Option<String>,
    /// VSNAP_ENGINE_HANG_PHASE: stop making progress on entering the phase.
    pub hang: Option<String>,
    /// VSNAP_ENGINE_ERROR_NO_EXIT: write error.json, then hang instead of exiting.
    pub error_no_exit: Option<String>,
    /// VSNAP_ENGINE_EXIT_SILENT: exit 3 without error.json.
    pub exit_silent: Option<String>,
    /// VSNAP_ENGINE_CANARY_DRIFT: perturb the recovery canary of a copy.
    pub drift: Option<Drift>,
    /// VSNAP_ENGINE_IO_URING=1: hold an io_uring instance open.
    pub io_uring: bool,
    /// VSNAP_ENGINE_OUTSIDE_TCP=host:port: hold an established TCP connection.
    pub outside_tcp: Option<String>,
    /// VSNAP_ENGINE_UNDUMPABLE=1: hold a perf_event fd, a file CRIU cannot dump
    /// (and vsnap's inventory does not look for), so the checkpoint itself fails.
    pub undumpable: bool,
    /// VSNAP_ENGINE_SELF_TCP=IP: hold a TCP connection to itself on that
    /// address of the container (`auto`: its first non-loopback IPv4), as
    /// vLLM's rendezvous store does; the recovery checks it still carries
    /// bytes both ways.
    pub self_tcp: Option<String>,
    /// VSNAP_ENGINE_HOLD_DEVICE=PATH: hold a file (a character device) open.
    pub hold_device: Option<String>,
    /// VSNAP_ENGINE_BACKLOG=1: hold a listener on every address with one
    /// connection the kernel accepted and the engine never did (a client
    /// that connected during start-up): in flight at capture.
    pub backlog: bool,
    /// VSNAP_ENGINE_EXIT_DELAY_MS=N: after a failure's error.json, take N ms
    /// to exit, as a real engine's teardown (workers, CUDA) does.
    pub exit_delay: Option<Duration>,
}

/// Both ends of the self connection, for the recovery to use.
static SELF_TCP: std::sync::OnceLock<(TcpStream, TcpStream)> = std::sync::OnceLock::new();

/// What to do on entering a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    None,
    ExitSilently,
    Hang,
    ReportAndHang,
    Fail,
}

impl Faults {
    pub fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let drift = match var("VSNAP_ENGINE_CANARY_DRIFT").as_deref() {
            None | Some("0") => None,
            Some("1") | Some("logprob") => Some(Drift::Logprob),
            Some("token") => Some(Drift::Token),
            Some(other) => {
                return Err(format!(
                    "VSNAP_ENGINE_CANARY_DRIFT={other:?}: expected 1, logprob or token"
                ))
            }
        };
        Ok(Faults {
            fail: var("VSNAP_ENGINE_FAIL_PHASE"),
            hang: var("VSNAP_ENGINE_HANG_PHASE"),
            error_no_exit: var("VSNAP_ENGINE_ERROR_NO_EXIT"),
            exit_silent: var("VSNAP_ENGINE_EXIT_SILENT"),
            drift,
            io_uring: var("VSNAP_ENGINE_IO_URING").is_some_and(|v| v != "0"),
            outside_tcp: var("VSNAP_ENGINE_OUTSIDE_TCP"),
            undumpable: var("VSNAP_ENGINE_UNDUMPABLE").is_some_and(|v| v != "0"),
            self_tcp: var("VSNAP_ENGINE_SELF_TCP"),
            hold_device: var("VSNAP_ENGINE_HOLD_DEVICE"),
            backlog: var("VSNAP_ENGINE_BACKLOG").is_some_and(|v| v != "0"),
            exit_delay: match var("VSNAP_ENGINE_EXIT_DELAY_MS") {
                None => None,
                Some(ms) => Some(Duration::from_millis(ms.parse().map_err(|_| {
                    format!("VSNAP_ENGINE_EXIT_DELAY_MS={ms:?}: expected milliseconds")
                })?)),
            },
        })
    }

    /// The injection for `phase`. A switch names a phase exactly or its prefix before
    /// ": " ("rehearsal" matches "rehearsal: canary").
    pub fn on_enter(&self, phase: &str) -> Injected {
        let hit = |switch: &Option<String>| {
            switch.as_deref().is_some_and(|s| {
                phase == s
                    || phase
                        .strip_prefix(s)
                        .is_some_and(|rest| rest.starts_with(": "))
            })
        };
        if hit(&self.exit_silent) {
            Injected::ExitSilently
        } else if hit(&self.hang) {
            Injected::Hang
        } else if hit(&self.error_no_exit) {
            Injected::ReportAndHang
        } else if hit(&self.fail) {
            Injected::Fail
        } else {
            Injected::None
        }
    }

    /// The recovered canary as the drift switch distorts it.
    pub fn drifted(&self, mut canary: Oracle) -> Oracle {
        match self.drift {
            None => {}
            Some(Drift::Logprob) => canary.sampled_token_logprob -= 0.01,
            Some(Drift::Token) => {
                if let Some(token) = canary.token_ids.first_mut() {
                    *token = (*token + 1) % VOCAB as u32;
                    canary.text = token_text(*token);
                }
            }
        }
        canary
    }

    /// Opens the resources a checkpoint must refuse (an io_uring instance, a TCP
    /// connection to a peer outside the container) and keeps them open for the life of
    /// the process. A kernel without io_uring is logged, not fatal.
    pub fn hold_resources(&self) -> Result<(), Failure> {
        if self.io_uring {
            match open_io_uring() {
                Ok(fd) => log(&format!("holding io_uring fd {fd}")),
                Err(e) => log(&format!(
                    "io_uring_setup refused ({e}); continuing without it"
                )),
            }
        }
        if let Some(peer) = &self.outside_tcp {
            let fd = connect(peer)
                .map_err(|e| Failure::engine(format!("VSNAP_ENGINE_OUTSIDE_TCP={peer}: {e}")))?;
            log(&format!("holding TCP connection to {peer} on fd {fd}"));
        }
        if self.undumpable {
            let fd = open_perf_event().map_err(|e| {
                Failure::engine(format!("VSNAP_ENGINE_UNDUMPABLE: perf_event_open: {e}"))
            })?;
            log(&format!("holding perf_event fd {fd}"));
        }
        if let Some(path) = &self.hold_device {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| Failure::engine(format!("VSNAP_ENGINE_HOLD_DEVICE={path}: {e}")))?;
            log(&format!("holding {path} on fd {}", file.into_raw_fd()));
        }
        if self.backlog {
            let port = listen_with_backlog()
                .map_err(|e| Failure::engine(format!("VSNAP_ENGINE_BACKLOG: {e}")))?;
            log(&format!(
                "holding a listener on 0.0.0.0:{port} with a connection in its backlog"
            ));
        }
        if let Some(ip) = &self.self_tcp {
            let pair = connect_to_self(ip)
                .map_err(|e| Failure::engine(format!("VSNAP_ENGINE_SELF_TCP={ip}: {e}")))?;
            log(&format!(
                "holding a TCP connection to itself: {} -> {}",
                pair.0
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                pair.0
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            ));
            let _ = SELF_TCP.set(pair);
        }
        Ok(())
    }

    /// After a restore: the self connection (when held) carries a message
    /// each way, proving CRIU restored both of its ends.
    pub fn check_resources(&self) -> Result<(), Failure> {
        let Some((a, b)) = SELF_TCP.get() else {
            return Ok(());
        };
        exchange(a, b)
            .and_then(|()| exchange(b, a))
            .map_err(|e| Failure::engine(format!("the TCP connection to itself: {e}")))
    }
}

/// The listener of VSNAP_ENGINE_BACKLOG, kept for the life of the process.
static BACKLOG: std::sync::OnceLock<std::net::TcpListener> = std::sync::OnceLock::new();

/// Listens on 0.0.0.0 and connects to it once over loopback, never
/// accepting: the kernel completes the handshake into the accept queue. The
/// client end is closed (it belongs to no process of the tree), so what the
/// listener holds is a connection in flight. Returns the port.
fn listen_with_backlog() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    let port = listener.local_addr()?.port();
    drop(TcpStream::connect(("127.0.0.1", port))?);
    let _ = BACKLOG.set(listener);
    Ok(port)
}

/// Listens on `ip` (or, for `auto`, the first non-loopback IPv4 address of
/// this network namespace), connects to it and accepts: both ends here.
fn connect_to_self(ip: &str) -> std::io::Result<(TcpStream, TcpStream)> {
    let ip: std::net::IpAddr = if ip == "auto" {
        first_global_ipv4()?
    } else {
        ip.parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{e}")))?
    };
    let listener = std::net::TcpListener::bind((ip, 0))?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    // The listener goes: only the established pair remains.
    Ok((client, server))
}

/// The IPv4 address this network namespace sends from by its default
/// route (a UDP socket "connected" to a documentation address: no packet
/// leaves). Never loopback.
fn first_global_ipv4() -> std::io::Result<std::net::IpAddr> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0")?;
    probe.connect("192.0.2.1:9")?;
    let ip = probe.local_addr()?.ip();
    if ip.is_loopback() || ip.is_unspecified() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no non-loopback IPv4 address (the default route gives {ip})"),
        ));
    }
    Ok(ip)
}

/// Writes a line on `from` and reads it back on `to`, within 5 s.
fn exchange(from: &TcpStream, to: &TcpStream) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let msg = b"vsnap-self-tcp\n";
    (&*from).write_all(msg)?;
    to.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut got = [0u8; 15];
    (&*to).read_exact(&mut got)?;
    if &got != msg {
        return Err(std::io::Error::other(format!("read back {got:?}")));
    }
    Ok(())
}

/// A software CPU-clock counter of this process, user space only (allowed at
/// perf_event_paranoid 2 without privileges).
fn open_perf_event() -> std::io::Result<i64> {
    // struct perf_event_attr (PERF_ATTR_SIZE_VER7, 128 bytes): type, size, config,
    // then flag bits at offset 40: disabled (bit 0), exclude_kernel (bit 5), exclude_hv (bit 6).
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    // config 0: PERF_COUNT_SW_CPU_CLOCK
    attr[40..48].copy_from_slice(&((1u64) | (1 << 5) | (1 << 6)).to_ne_bytes());
    // SAFETY: perf_event_open reads `attr` (size given inside it), which lives
    // across the call; pid 0 / cpu -1 measure this process on any CPU.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

fn open_io_uring() -> std::io::Result<i64> {
    // struct io_uring_params is 120 bytes; all zero asks for defaults.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes only the params struct we pass, which is
    // large enough and lives across the call.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

fn connect(peer: &str) -> std::io::Result<i32> {
    let mut last = std::io::Error::other("no address");
    for addr in peer.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            // Deliberately leaked: the connection must stay open while the process lives.
            Ok(stream) => return Ok(stream.into_raw_fd()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(fail: &str) -> Faults {
        Faults {
            fail: Some(fail.into()),
            ..Default::default()
        }
    }

    #[test]
    fn switch_matches_phase_and_its_steps() {
        assert_eq!(faults("recover").on_enter("recover"), Injected::Fail);
        assert_eq!(
            faults("rehearsal").on_enter("rehearsal: canary"),
            Injected::Fail
        );
        assert_eq!(
            faults("recover").on_enter("recovery: canary"),
            Injected::None
        );
        assert_eq!(faults("serve").on_enter("server"), Injected::None);
    }

    #[test]
    fn drift_moves_logprob_or_token() {
        let canary = Oracle {
            sampled_token_logprob: -1.0,
            text: "a".into(),
            token_ids: vec![65],
        };
        let mut f = Faults {
            drift: Some(Drift::Logprob),
            ..Default::default()
        };
        assert!(canary
            .check_matches(&f.drifted(canary.clone()), "t")
            .is_err());
        f.drift = Some(Drift::Token);
        let moved = f.drifted(canary.clone());
        assert_eq!(moved.token_ids, vec![66]);
        assert_eq!(moved.text, "b");
    }
}
