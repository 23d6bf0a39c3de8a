//! Looking at a pod from outside and from another pod: its namespaces, a
//! request made from inside another pod's network namespace, the iptables
//! rules in a pod's namespace.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

/// Runs `f` on a thread that joined the network namespace of `pid`.
pub fn in_netns_of<T: Send + 'static>(pid: i32, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .unwrap_or_else(|e| panic!("open the network namespace of {pid}: {e}"));
    std::thread::spawn(move || {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("join a pod's network namespace");
        f()
    })
    .join()
    .expect("the thread in the pod's network namespace")
}

/// The network, IPC and UTS namespaces of `pid`, as their links read.
pub fn namespaces(pid: i32) -> Vec<String> {
    ["net", "ipc", "uts"]
        .iter()
        .map(|n| {
            std::fs::read_link(format!("/proc/{pid}/ns/{n}"))
                .unwrap_or_else(|e| panic!("/proc/{pid}/ns/{n}: {e}"))
                .display()
                .to_string()
        })
        .collect()
}

/// GETs `path` from `addr` and returns the JSON body of a 200 answer.
pub fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "GET {path}: {head}\n{body}"
    );
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// `iptables -S` and `ip6tables -S` in the network namespace of `pid`.
pub fn iptables_rules(pid: i32) -> String {
    let mut out = String::new();
    for tool in ["iptables", "ip6tables"] {
        let o = std::process::Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args([tool, "-S"])
            .output()
            .unwrap_or_else(|e| panic!("nsenter {tool}: {e}"));
        out.push_str(&String::from_utf8_lossy(&o.stdout));
    }
    out
}
