//! Sockets tied to the pod's own address. A copy restored into another pod
//! has another IP: CRIU cannot bind a socket to the donor's ("Cannot assign
//! requested address", after the whole restore was set up), and an IPv6 one
//! it binds anyway (`IP_FREEBIND`) serves nothing. A container with a
//! network namespace of its own (a pod's, or one `ctr run` made) is
//! therefore refused at capture, before CRIU, when any socket of its tree
//! is bound to an address other than loopback or the wildcard, naming the
//! process, the socket and the address, and the fix. A container in the
//! host's network namespace is restored on the node it was captured on,
//! whose addresses it keeps: not checked.
//!
//! A connection in a listener's backlog (accepted by the kernel, not yet by
//! the engine) has no descriptor in the tree: not counted.

use std::net::{IpAddr, SocketAddr};

use super::tcp_table::{self, TcpEntry, TcpState};

/// A socket of the tree bound to the pod's own address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tied {
    pub pid: i32,
    pub protocol: &'static str,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: TcpState,
}

/// Whether an address belongs to one host or pod: neither loopback nor the
/// wildcard (a v4-mapped address already reads as IPv4).
pub fn is_pod_address(ip: IpAddr) -> bool {
    !ip.is_loopback() && !ip.is_unspecified()
}

/// Whether the spec gives the container a network namespace other than
/// the host's (an entry of type `network`, with a path or without).
pub fn has_own_network(spec: &serde_json::Value) -> bool {
    spec["linux"]["namespaces"]
        .as_array()
        .is_some_and(|n| n.iter().any(|n| n["type"] == "network"))
}

/// The first row (of `rows`, each table's protocol beside it) held by the
/// tree (`holder` names the process holding a socket inode) bound to a pod
/// address.
pub fn first_tied(
    rows: &[(&'static str, TcpEntry)],
    holder: &dyn Fn(u64) -> Option<i32>,
) -> Option<Tied> {
    rows.iter().find_map(|(protocol, e)| {
        let pid = holder(e.inode).filter(|_| e.inode != 0)?;
        is_pod_address(e.local.ip()).then_some(Tied {
            pid,
            protocol,
            local: e.local,
            remote: e.remote,
            state: e.state,
        })
    })
}

/// The rows of the TCP and UDP tables of `pid`'s network namespace.
pub fn rows_of(pid: i32) -> Vec<(&'static str, TcpEntry)> {
    let mut out = Vec::new();
    for (protocol, tables) in [("TCP", ["tcp", "tcp6"]), ("UDP", ["udp", "udp6"])] {
        for t in tables {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).unwrap_or_default();
            out.extend(tcp_table::parse(&text).into_iter().map(|e| (protocol, e)));
        }
    }
    out
}

/// The refusal for `t` (`comm`: the process's name).
pub fn message(t: &Tied, comm: &str) -> String {
    let what = match (t.protocol, t.state) {
        ("TCP", TcpState::Listen) => format!("a TCP listener on {}", t.local),
        ("TCP", TcpState::Established) => {
            format!("a TCP connection {} -> {}", t.local, t.remote)
        }
        (p, _) => format!("a {p} socket bound to {}", t.local),
    };
    format!(
        "capture: inventory: pid {} ({comm}) holds {what}: {} is this container's own address, \
         which a copy restored in another pod (another IP) cannot have; bind 0.0.0.0 or 127.0.0.1 instead \
         (vLLM on one node: VLLM_HOST_IP=127.0.0.1, GLOO_SOCKET_IFNAME=lo, NCCL_SOCKET_IFNAME=lo; docs/gpu-hosts.md)",
        t.pid,
        t.local.ip()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(local: &str, remote: &str, state: TcpState, inode: u64) -> TcpEntry {
        TcpEntry {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            state,
            inode,
        }
    }

    #[test]
    fn a_socket_on_the_pod_ip_is_named_and_loopback_or_wildcard_is_not() {
        let holder = |inode: u64| (inode < 100).then_some(7);
        let fine = [
            ("TCP", row("0.0.0.0:8000", "0.0.0.0:0", TcpState::Listen, 1)),
            (
                "TCP",
                row(
                    "127.0.0.1:40000",
                    "127.0.0.1:29500",
                    TcpState::Established,
                    2,
                ),
            ),
            ("TCP", row("[::]:8001", "[::]:0", TcpState::Listen, 3)),
            // Outside the tree, or in a backlog (no descriptor, inode 0).
            (
                "TCP",
                row("10.1.0.2:8000", "10.1.0.9:5555", TcpState::Established, 0),
            ),
            (
                "TCP",
                row("10.1.0.2:9000", "0.0.0.0:0", TcpState::Listen, 500),
            ),
        ];
        assert_eq!(first_tied(&fine, &holder), None);
        let mut rows = fine.to_vec();
        rows.push((
            "TCP",
            row("10.1.0.2:29500", "10.1.0.2:41234", TcpState::Established, 9),
        ));
        let tied = first_tied(&rows, &holder).unwrap();
        assert_eq!((tied.pid, tied.local.port()), (7, 29500));
        let m = message(&tied, "python3");
        assert!(
            m.contains("pid 7 (python3) holds a TCP connection 10.1.0.2:29500 -> 10.1.0.2:41234: 10.1.0.2 is this container's own address"),
            "{m}"
        );
        assert!(m.contains("VLLM_HOST_IP=127.0.0.1"), "{m}");
        let udp = [(
            "UDP",
            row("[fd00::7]:5353", "[::]:0", TcpState::Other(7), 4),
        )];
        let m = message(&first_tied(&udp, &holder).unwrap(), "x");
        assert!(m.contains("a UDP socket bound to [fd00::7]:5353"), "{m}");
    }

    #[test]
    fn only_a_container_with_its_own_network_is_checked() {
        let own = serde_json::json!({"linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/cni-1"}]}});
        let host = serde_json::json!({"linux": {"namespaces": [{"type": "pid"}]}});
        assert!(has_own_network(&own) && !has_own_network(&host));
    }
}
