//! Reading the kernel's state back: `nft -j list table inet fleetban` with
//! 100,000 elements, in the exact shape nft 1.0.6 prints (one line, `", "`
//! and `": "` separators; checked against a real listing of such a table in
//! a network namespace): 75,000 IPv4 addresses in `v4` and 25,000 IPv6 /64s
//! in `v6`, each with its timeout and time left, a few networks in the sets
//! per prefix length `v4n16`/`v4n31`/`v6n48`, the chain and its five rules. One iteration parses
//! the whole listing as the enforcer does at start. `cargo bench --bench listing`.

use std::fmt::Write;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetban::enforce::{bench_parse_listing, NftOptions};

const V4: u32 = 75_000;
const V6: u32 = 25_000;

/// `{"set": {...}}` with its elements, as nft lists a set.
fn set(out: &mut String, name: &str, ty: &str, handle: u32, flags: &str, elems: &[String]) {
    let _ = write!(
        out,
        r#", {{"set": {{"family": "inet", "name": "{name}", "table": "fleetban", "type": "{ty}", "handle": {handle}, "flags": {flags}, "elem": [{}]}}}}"#,
        elems.join(", ")
    );
}

/// An element with a timeout: `val` is its JSON (an address, a prefix, a range).
fn timed(val: &str, i: u32) -> String {
    // Ban durations as escalation makes them (1 h doubling up to 1 d), and
    // some time already gone.
    let timeout = [3_600, 7_200, 14_400, 86_400][i as usize % 4];
    let expires = timeout - 1 - (i * 7) % (timeout / 2);
    format!(r#"{{"elem": {{"val": {val}, "timeout": {timeout}, "expires": {expires}}}}}"#)
}

fn listing() -> String {
    let mut out = String::from(
        r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "fleetban", "handle": 1}}"#,
    );
    let v4: Vec<String> = (0..V4)
        .map(|i| timed(&format!("\"{}\"", Ipv4Addr::from(0x6400_0000 + i * 3)), i))
        .collect();
    set(&mut out, "v4", "ipv4_addr", 1, r#"["timeout"]"#, &v4);
    let v6: Vec<String> = (0..V6)
        .map(|i| {
            let net = Ipv6Addr::new(0x2001, 0xdb8, (i >> 8) as u16, (i * 0x9e37) as u16, 0, 0, 0, 0);
            timed(&format!("\"{net}\""), i)
        })
        .collect();
    set(&mut out, "v6", "ipv6_addr", 2, r#"["timeout"]"#, &v6);
    let v4n16 = [timed(r#""10.0.0.0""#, 1), timed(r#""20.0.0.0""#, 2)];
    set(&mut out, "v4n16", "ipv4_addr", 3, r#"["timeout"]"#, &v4n16);
    set(
        &mut out,
        "v4n31",
        "ipv4_addr",
        4,
        r#"["timeout"]"#,
        &[r#""30.0.0.0""#.to_string()],
    );
    let v6n48 = [timed(r#""2001:db8:1::""#, 1), timed(r#""2001:db8:2::""#, 2)];
    set(&mut out, "v6n48", "ipv6_addr", 5, r#"["timeout"]"#, &v6n48);
    out.push_str(r#", {"chain": {"family": "inet", "table": "fleetban", "name": "input", "handle": 6, "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}}"#);
    for (handle, name, left) in [
        (6, "v4", r#"{"payload": {"protocol": "ip", "field": "saddr"}}"#),
        (
            7,
            "v6",
            r#"{"&": [{"payload": {"protocol": "ip6", "field": "saddr"}}, "ffff:ffff:ffff:ffff::"]}"#,
        ),
        (
            8,
            "v4n16",
            r#"{"&": [{"payload": {"protocol": "ip", "field": "saddr"}}, "255.255.0.0"]}"#,
        ),
        (
            9,
            "v4n31",
            r#"{"&": [{"payload": {"protocol": "ip", "field": "saddr"}}, "255.255.255.254"]}"#,
        ),
        (
            10,
            "v6n48",
            r#"{"&": [{"payload": {"protocol": "ip6", "field": "saddr"}}, "ffff:ffff:ffff::"]}"#,
        ),
    ] {
        let _ = write!(
            out,
            r#", {{"rule": {{"family": "inet", "table": "fleetban", "chain": "input", "handle": {handle}, "comment": "fleetban {name} drop", "expr": [{{"match": {{"op": "==", "left": {left}, "right": "@{name}"}}}}, {{"counter": {{"packets": 0, "bytes": 0}}}}, {{"drop": null}}]}}}}"#
        );
    }
    out.push_str("]}\n");
    out
}

fn bench(c: &mut Criterion) {
    let json = listing();
    let opts = NftOptions::default();
    let now = 1_767_225_600_000;
    let mut g = c.benchmark_group("listing");
    g.throughput(Throughput::Elements(u64::from(V4 + V6)));
    g.sample_size(20).measurement_time(Duration::from_secs(8));
    let read = bench_parse_listing(json.as_bytes(), &opts, now).expect("the listing parses");
    assert_eq!(read, (100_005, 0), "every element read");
    g.bench_function("parse_100k", |b| {
        b.iter(|| bench_parse_listing(black_box(json.as_bytes()), &opts, now).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
