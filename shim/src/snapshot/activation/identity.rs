//! The identity an activation hands its engine (vsnap_protocol::Identity):
//! the hostname of the engine's UTS namespace, the addresses of its network
//! namespace's interfaces, a fresh seed. Read from the engine's own
//! namespaces, so a copy restored into another pod learns that pod's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use vsnap_protocol::Identity;

/// The identity of the engine `pid` with a fresh seed.
pub fn of_process(pid: i32) -> Result<Identity, String> {
    let hostname = hostname_of(pid)?;
    let fib = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie")).unwrap_or_default();
    let inet6 = std::fs::read_to_string(format!("/proc/{pid}/net/if_inet6")).unwrap_or_default();
    let mut ips: Vec<String> = local_ipv4(&fib).iter().map(|a| a.to_string()).collect();
    ips.extend(local_ipv6(&inet6).iter().map(|a| a.to_string()));
    Identity::fresh(hostname, ips).map_err(|e| format!("identity: read /dev/urandom: {e}"))
}

/// The hostname of `pid`'s UTS namespace, read from a thread that joined it.
pub fn hostname_of(pid: i32) -> Result<String, String> {
    in_uts(pid, || {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .map_err(|e| format!("gethostname: {e}"))
    })
}

/// Sets the hostname of `pid`'s UTS namespace (a restore whose spec gives
/// the container a namespace of its own: CRIU restored the donor's name).
pub fn set_hostname_of(pid: i32, hostname: &str) -> Result<(), String> {
    let name = hostname.to_string();
    in_uts(pid, move || {
        nix::unistd::sethostname(&name).map_err(|e| format!("sethostname {name:?}: {e}"))
    })
}

/// Runs `f` in `pid`'s UTS namespace (ns.rs).
fn in_uts<T: Send + 'static>(
    pid: i32,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    super::ns::in_ns_of(pid, "uts", nix::sched::CloneFlags::CLONE_NEWUTS, f)
}

/// The IPv4 addresses `/proc/<pid>/net/fib_trie` lists as local host
/// routes (`/32 host LOCAL`), loopback left out, each once.
pub fn local_ipv4(fib_trie: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim_start();
        if let Some(a) = t.strip_prefix("|-- ").or_else(|| t.strip_prefix("+-- ")) {
            last = a.split('/').next().and_then(|a| a.trim().parse().ok());
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last.filter(|a| !a.is_loopback() && !out.contains(a)) {
                out.push(a);
            }
        }
    }
    out
}

/// The global IPv6 addresses of `/proc/<pid>/net/if_inet6` (scope 00),
/// loopback left out.
pub fn local_ipv6(if_inet6: &str) -> Vec<Ipv6Addr> {
    if_inet6
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (hex, scope) = (f.first()?, f.get(3)?);
            let n = u128::from_str_radix(hex, 16).ok()?;
            (hex.len() == 32 && *scope == "00").then_some(Ipv6Addr::from(n))
        })
        .filter(|a| !IpAddr::V6(*a).is_loopback())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIB: &str = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 10.201.3.0/24 2 0 2\n        |-- 10.201.3.0\n           /24 link UNICAST\n        |-- 10.201.3.7\n           /32 host LOCAL\n     +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\nLocal:\n  +-- 0.0.0.0/0 3 0 5\n        |-- 10.201.3.7\n           /32 host LOCAL\n";

    #[test]
    fn local_addresses_are_the_pods_own_without_loopback() {
        assert_eq!(local_ipv4(FIB), [Ipv4Addr::new(10, 201, 3, 7)]);
        assert!(local_ipv4("").is_empty());
        let inet6 = "00000000000000000000000000000001 01 80 10 80       lo\nfe800000000000000000000000000001 02 40 20 80     eth0\nfd000000000000000000000000000007 02 40 00 80     eth0\n";
        assert_eq!(local_ipv6(inet6), ["fd00::7".parse::<Ipv6Addr>().unwrap()]);
    }

    #[test]
    fn the_shims_own_identity_names_its_hostname() {
        let me = std::process::id() as i32;
        let id = of_process(me).unwrap();
        let host = nix::unistd::gethostname().unwrap();
        assert_eq!(id.hostname, host.to_string_lossy());
        vsnap_protocol::Schema::check(&id).unwrap();
    }
}
