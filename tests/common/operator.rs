//! Operator stories told the same way whatever the store (the embedded one
//! through the daemon, or Redis): each runs the real binary against a
//! configuration from [`rig`] or [`redis_rig`] and checks what it printed
//! and what `bans --json` lists after it (tests/operator.rs,
//! tests/operator_redis.rs).

use std::time::Duration;

use super::{cli, wait_until, ConfigDir, Redis, Rule};

/// A daemon's files: `scraper` (at most 5 hits a minute) on `access.log`,
/// 192.0.2.0/24 allowed, the log firewall.
pub fn rig() -> ConfigDir {
    let r = ConfigDir::new();
    r.write(
        &r.main_config()
            .host_id("ops-host")
            .allow("[192.0.2.0/24]")
            .log_firewall(),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

/// As [`rig`], the bans and windows in `redis` (with `options`).
pub fn redis_rig(redis: &Redis, options: &str) -> ConfigDir {
    let r = ConfigDir::new();
    r.write(
        &r.main_config()
            .host_id("ops-host")
            .allow("[192.0.2.0/24]")
            .log_firewall()
            .redis(&redis.url(), options),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

/// The one line of `bans --json` about `addr`.
pub fn ban_of(r: &ConfigDir, addr: &str) -> Option<serde_json::Value> {
    let out = cli(&r.cfg, &["bans", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    out.stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|b| b["addr"] == addr)
}

/// The same story whatever the store: `bans --json` after each step.
pub fn rebanning_never_shortens(r: &ConfigDir) {
    let until = |r: &ConfigDir| ban_of(r, "198.51.100.7").map(|b| (b["until"].clone(), b["reason"].clone()));
    let ban = |args: &[&str]| {
        let mut all = vec!["ban", "198.51.100.7"];
        all.extend_from_slice(args);
        let out = cli(&r.cfg, &all);
        assert_eq!(out.code, 0, "{}", out.text());
        out.stdout
    };
    let out = ban(&["--for", "2h", "--reason", "abuse report"]);
    assert!(out.starts_with("banned 198.51.100.7 until "), "{out}");
    let (two_hours, reason) = until(r).unwrap();
    assert_eq!(reason, "abuse report");
    // Shorter, no reason: kept, reason kept.
    let out = ban(&["--for", "10m"]);
    assert!(out.contains("already banned until") && out.contains("kept"), "{out}");
    assert_eq!(until(r).unwrap(), (two_hours.clone(), reason.clone()));
    // Longer with a reason: extended, the new reason.
    let out = ban(&["--for", "5h", "--reason", "again"]);
    assert!(out.contains("extended to"), "{out}");
    let (five_hours, reason) = until(r).unwrap();
    assert!(
        five_hours.as_str().unwrap() > two_hours.as_str().unwrap(),
        "{five_hours} {two_hours}"
    );
    assert_eq!(reason, "again");
    // Permanent stays permanent.
    assert!(ban(&["--permanent"]).contains("extended to forever"));
    assert!(ban(&["--for", "1h"]).contains("kept"));
    assert_eq!(until(r).unwrap().0, serde_json::Value::Null);
    // Shortening takes --replace; the reason is still kept.
    let out = ban(&["--for", "1h", "--replace"]);
    assert!(out.contains("was banned until forever; replaced"), "{out}");
    let (one_hour, reason) = until(r).unwrap();
    assert!(one_hour.as_str().unwrap() < five_hours.as_str().unwrap());
    assert_eq!(reason, "again");
}

pub fn unban_names_the_wider_ban(r: &ConfigDir) {
    for a in ["198.51.100.0/24", "198.51.100.5", "2001:db8:5::/64"] {
        assert_eq!(cli(&r.cfg, &["ban", a]).code, 0);
    }
    let out = cli(&r.cfg, &["unban", "198.51.100.5"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("unbanned 198.51.100.5"), "{}", out.stdout);
    assert!(
        out.stdout.contains("still banned: 198.51.100.0/24") && out.stdout.contains("fleetban unban 198.51.100.0/24"),
        "{}",
        out.stdout
    );
    // An address inside a banned /64 alone: no ban of its own, the /64 named.
    let out = cli(&r.cfg, &["unban", "2001:db8:5::1"]);
    assert!(out.stdout.contains("had no ban of its own"), "{}", out.stdout);
    assert!(out.stdout.contains("still banned: 2001:db8:5::/64"), "{}", out.stdout);
    // A prefix with host bits set: refused by both, with the network meant.
    for cmd in ["ban", "unban"] {
        let out = cli(&r.cfg, &[cmd, "2001:db8:5::1/64"]);
        assert_eq!(out.code, 2, "{cmd}: {}", out.text());
        assert!(
            out.stderr.contains("host bits set") && out.stderr.contains("`2001:db8:5::/64`"),
            "{}",
            out.stderr
        );
    }
    let out = cli(&r.cfg, &["unban", "2001:db8:5::/64"]);
    assert!(out.stdout.contains("unbanned 2001:db8:5::/64"), "{}", out.stdout);
    assert!(ban_of(r, "2001:db8:5::/64").is_none());
    assert!(ban_of(r, "198.51.100.0/24").is_some());
}

/// Unbanning a network names the narrower bans it leaves, in text and in
/// JSON, whatever the store.
pub fn unban_names_the_narrower_bans(r: &ConfigDir) {
    for a in ["198.51.100.0/24", "198.51.100.9", "198.51.100.91"] {
        assert_eq!(cli(&r.cfg, &["ban", a]).code, 0);
    }
    let out = cli(&r.cfg, &["unban", "198.51.100.0/24"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("unbanned 198.51.100.0/24"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("note: 2 narrower ban(s) inside 198.51.100.0/24 remain: 198.51.100.9, 198.51.100.91"),
        "{}",
        out.stdout
    );
    assert_eq!(cli(&r.cfg, &["ban", "198.51.100.0/24"]).code, 0);
    let out = cli(&r.cfg, &["unban", "198.51.100.0/24", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(
        v["narrower"],
        serde_json::json!(["198.51.100.9", "198.51.100.91"]),
        "{v}"
    );
    assert!(ban_of(r, "198.51.100.9").is_some() && ban_of(r, "198.51.100.0/24").is_none());
}

/// An unbanned address with a partial count, a covered one, an allowed one.
pub fn explain_cases(r: &ConfigDir) {
    let explain = |addr: &str| {
        let out = cli(&r.cfg, &["explain", addr, "--json"]);
        assert_eq!(out.code, 0, "{}", out.text());
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    wait_until(Duration::from_secs(10), "the 3 hits counted", || {
        explain("203.0.113.9")["windows"][0]["count"] == 3
    });
    let e = explain("203.0.113.9");
    assert_eq!(e["banned"], false, "{e}");
    assert_eq!(e["ban"], serde_json::Value::Null);
    assert_eq!(e["never_banned"], serde_json::json!([]));
    assert_eq!(e["windows"][0]["rule"], "scraper");
    assert_eq!(e["windows"][0]["limit"], 5);
    assert_eq!(e["windows"][0]["algorithm"], "sliding_window");
    let human = cli(&r.cfg, &["explain", "203.0.113.9"]).stdout;
    assert!(human.starts_with("203.0.113.9: not banned"), "{human}");
    assert!(
        human.contains("scraper  203.0.113.9  sliding_window      3      5"),
        "{human}"
    );

    assert_eq!(
        cli(&r.cfg, &["ban", "198.51.100.0/24", "--reason", "net abuse"]).code,
        0
    );
    let e = explain("198.51.100.7");
    assert_eq!(e["banned"], true, "{e}");
    assert_eq!(e["ban"], serde_json::Value::Null);
    assert_eq!(e["covering"][0]["addr"], "198.51.100.0/24");
    assert_eq!(e["covering"][0]["reason"], "net abuse");
    assert_eq!(e["covering"][0]["rule"], "manual");

    let e = explain("192.0.2.44");
    assert_eq!(e["never_banned"], serde_json::json!(["allow: 192.0.2.0/24"]), "{e}");
    let e = explain("127.0.0.1");
    assert_eq!(e["never_banned"][0], "loopback (127.0.0.0/8)", "{e}");
}
