//! Whether packets from an address pass a namespace's firewall: the test
//! binary runs itself inside the namespace (its `packet_probe_child` test,
//! which calls [`child`]), listens there and connects to each target
//! address, one TCP connect each.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::NetNs;

/// The body of a test binary's `packet_probe_child` test: nothing in a
/// normal run; in the child [`run`] starts, one `PROBE ADDR ok|fail` line
/// per target.
pub fn child() {
    let Ok(targets) = std::env::var("FLEETBAN_PROBE") else {
        return;
    };
    // `[::]` takes IPv4 too (dual stack, a namespace's default).
    let listener = TcpListener::bind("[::]:0")
        .or_else(|_| TcpListener::bind("0.0.0.0:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    for target in targets.split(',') {
        let addr = SocketAddr::new(target.parse::<IpAddr>().unwrap(), port);
        let ok = TcpStream::connect_timeout(&addr, Duration::from_millis(700)).is_ok();
        println!("PROBE {target} {}", if ok { "ok" } else { "fail" });
    }
}

/// Runs this test binary's `packet_probe_child` in `ns` against `targets`
/// (comma-separated addresses); the probe lines, sorted.
pub fn run(ns: &NetNs, targets: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().expect("a UTF-8 test binary path");
    let out = ns
        .exec(&[exe, "packet_probe_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("FLEETBAN_PROBE", targets)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        // libtest may print "test packet_probe_child ... " on the same line.
        .filter_map(|l| l.find("PROBE ").map(|i| l[i..].to_owned()))
        .collect();
    lines.sort();
    lines
}
