//! Blocklist load and refresh costs (issue 16), a `[[bench]]` target
//! without libtest that measures only when named `load` on its command line
//! (so `cargo test --bench '*'` and a bare `cargo bench` run nothing).
//!
//! In a network namespace of its own (the host's ruleset is never touched):
//! a generated netset of N networks (default 100,000; 20 garbage lines) is
//! read (`blocklist::from_text`: parse, merge, subtract) and loaded into the
//! table's `block4` set by the nft enforcer at "start" (one transaction);
//! then two refreshes changing 1%: additions only (sent as the difference)
//! and half deletions (the set re-filled whole, `enforce::block`); then the
//! cost of one ban transaction with the blocklist loaded, and without it.
//! REPS repetitions (default 3), a fresh namespace each.
//!
//! Usage: `cargo bench --bench blocklist -- load` (env N, REPS).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::NetNs;
use fleetban::blocklist::{self, Format, Spec};
use fleetban::enforce::{Element, Enforcer, NftOptions, Until};
use ipnet::IpNet;

fn main() {
    if !std::env::args().any(|a| a == "load") {
        eprintln!("usage: cargo bench --bench blocklist -- load   (env N=100000, REPS=3)");
        return;
    }
    let n: u32 = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let reps: u32 = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "N={n} networks, {} ; columns in seconds",
        String::from_utf8_lossy(
            &std::process::Command::new("nft")
                .arg("--version")
                .output()
                .unwrap()
                .stdout
        )
        .trim()
    );
    println!("rep  read   load  refresh+1%  refresh-0.5%+0.5%  ban(with)  ban(without)");
    for rep in 0..reps {
        rt.block_on(one(rep, n));
    }
}

fn spec() -> Spec {
    Spec {
        file: "/generated".into(),
        format: Format::Netset,
        refresh: std::time::Duration::from_secs(3600),
        max_entries: 1_000_000,
    }
}

/// `n` /24s two apart; `shift` picks which 1% are replaced (and how).
fn text(n: u32, change: u8) -> String {
    let mut t = String::with_capacity(n as usize * 16);
    for i in 0..n {
        let base: u32 = match change {
            1 if i % 100 == 0 => 60 << 24, // replaced: old ones stay, 1% new
            2 if i % 200 == 0 => 60 << 24, // 0.5% replaced: deletions
            _ => 20 << 24,
        };
        t.push_str(&format!("{}/24\n", std::net::Ipv4Addr::from(base + (i << 9))));
        if change == 1 && i % 100 == 0 {
            t.push_str(&format!("{}/24\n", std::net::Ipv4Addr::from((20u32 << 24) + (i << 9))));
        }
        if i % 5000 == 0 {
            t.push_str("garbage\n");
        }
    }
    t
}

async fn one(rep: u32, n: u32) {
    let ns = NetNs::new("bench");
    let opts = NftOptions {
        command: ["ip", "netns", "exec", &ns.name, "nft"].map(String::from).to_vec(),
        ..NftOptions::default()
    };
    let allowed: Vec<IpNet> = fleetban::addr::loopback().to_vec();
    let mut e = Enforcer::nft(opts.clone()).unwrap();
    e.init(common::now_ms()).await.unwrap();
    let source = text(n, 0);
    let t = Instant::now();
    let l = blocklist::from_text(&source, &spec(), &allowed);
    let read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let a = e.set_blocklist(&l.nets).await.unwrap();
    let load = t.elapsed().as_secs_f64();
    assert!(a.full && a.total == n as usize);
    let l1 = blocklist::from_text(&text(n, 1), &spec(), &allowed);
    let t = Instant::now();
    let a = e.set_blocklist(&l1.nets).await.unwrap();
    let add = t.elapsed().as_secs_f64();
    assert_eq!((a.added, a.deleted), (n as usize / 100, 0));
    let l2 = blocklist::from_text(&text(n, 2), &spec(), &allowed);
    let t = Instant::now();
    e.set_blocklist(&l2.nets).await.unwrap();
    let refill = t.elapsed().as_secs_f64();
    let now = common::now_ms();
    let ban = |s: &str| Element {
        net: s.parse().unwrap(),
        until: Until::At(now + 3_600_000),
    };
    let t = Instant::now();
    e.add(&[ban("198.51.100.1/32")], now).await.unwrap();
    let with = t.elapsed().as_secs_f64();
    e.remove_blocklist().await.unwrap();
    let t = Instant::now();
    e.add(&[ban("198.51.100.2/32")], now).await.unwrap();
    let without = t.elapsed().as_secs_f64();
    println!("{rep:>3}  {read:.3}  {load:.3}  {add:.3}       {refill:.3}              {with:.3}      {without:.3}");
}
