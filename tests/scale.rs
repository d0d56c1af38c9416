//! A long ban list (issue 27): a host loads a list whatever its length.
//! Against a redis-server of its own with the daemon's log firewall; the
//! figures (start, memory, one ban on top of 1,000,000) are
//! `bench/scale.sh`'s, never asserted here.

mod common;

use std::time::Duration;

use common::{wait_until, ConfigDir, Daemon, Redis, Rule};

/// The whole list in one reply was unbounded: past `redis.timeout` with
/// 1,000,000 bans (a host retried its first read forever), and here past
/// the server's output limit for a client (1 MB; 100,000 members are
/// ~3 MB of reply), which closes the connection just as deterministically.
/// Read in pages, every entry arrives once, although all 100,000 share one
/// end (one tie across every page boundary).
#[test]
fn a_list_longer_than_one_reply_can_carry_is_loaded_whole() {
    let redis = Redis::start_with(&["--client-output-buffer-limit", "normal 1mb 1mb 0"]);
    let n = 100_000;
    redis.preload_bans(n, common::now_ms() + 3_600_000);
    let r = ConfigDir::new();
    let main = r
        .main_config()
        .host_id("long-list")
        .log_firewall()
        .redis(&redis.url(), "");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    wait_until(Duration::from_secs(120), "the list applied at start", || {
        d.log_text().contains("Ban list applied")
    });
    let log = d.log_text();
    let applied = log.lines().find(|l| l.contains("Ban list applied")).unwrap_or_default();
    assert!(applied.contains(&format!("bans={n}")), "{applied}\n{}", tail(&log));
}

/// The start loads the list's pages into nft as they are read
/// (`daemon::start::preload`, only bans enforced whole that nothing in the
/// kernel overlaps), and the first sync after the read finishes the cover:
/// the kernel ends up holding exactly what one transaction of the whole
/// list used to put in. 10,000 bans (three pages); a /24 holding an
/// allowed address (cut around it), an address inside a /16 (left out
/// while the /16 drops it), and an element the kernel kept from a ban the
/// list no longer has (deleted).
#[test]
fn a_start_loads_the_pages_as_they_are_read_and_the_first_sync_finishes_the_cover() {
    let redis = Redis::start();
    let until = common::now_ms() + 3_600_000;
    let ns = common::NetNs::new("preload");
    let r = ConfigDir::new();
    let main = r
        .main_config()
        .host_id("preload")
        .allow("[10.213.0.7]")
        .redis(&redis.url(), "");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    // A first run leaves 192.0.2.99 in the kernel; the list then loses it.
    redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), "192.0.2.99"]);
    let mut first = Daemon::start(Some(&ns), &r.cfg, &r.control);
    wait_until(Duration::from_secs(60), "the first run's list applied", || {
        first.log_text().contains("Ban list applied")
    });
    first.stop(Duration::from_secs(10));
    redis.cli(&["DEL", "{fleetban}:bans"]);
    let n = 10_000;
    redis.preload_bans(n, until);
    for m in ["10.213.0.0/24", "10.214.0.0/16", "10.214.3.3"] {
        redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), m]);
    }

    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    wait_until(Duration::from_secs(120), "the list applied", || {
        d.log_text().contains("Ban list applied")
    });
    let log = d.log_text();
    assert!(
        log.contains("Ban list loaded into nftables while it was read"),
        "{}",
        tail(&log)
    );
    let v4: std::collections::BTreeSet<String> = common::nft_bans(&ns, "fleetban", "v4")
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    for i in (0..n).filter(|i| i % 4 != 3) {
        let a = format!(
            "{}.{}.{}.{}",
            100 + i / 16_777_216 % 50,
            i / 65536 % 256,
            i / 256 % 256,
            i % 256
        );
        assert!(v4.contains(&a), "{a} not in nft");
    }
    assert!(v4.contains("10.214.0.0/16"));
    assert!(!v4.contains("10.214.3.3"), "inside the /16: left out");
    assert!(!v4.contains("192.0.2.99"), "no longer in the list: deleted");
    assert!(!v4.contains("10.213.0.0/24") && !v4.contains("10.213.0.7"));
    assert!(
        v4.contains("10.213.0.128/25") && v4.contains("10.213.0.6"),
        "the /24 cut around the allowed address"
    );
    // The addresses, the /16 and the /24's eight pieces.
    assert_eq!(
        v4.len() as u64,
        n / 4 * 3 + 1 + 8,
        "{:?}",
        v4.iter().filter(|e| !e.starts_with("100.")).collect::<Vec<_>>()
    );
    assert_eq!(common::nft_bans(&ns, "fleetban", "v6").len() as u64, n / 4);
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Bans decided in bursts with one duration (here five bursts 20 s apart,
/// 40 bans each, 1 h) end as each was decided: every element's time left
/// in the kernel is its own end's, so the list leaves nft spread as it came
/// (no bulk expiry early or late, cs-firewall-bouncer#509). Checked at
/// start (the list read in pages) and after a reconcile.
#[test]
fn bans_of_one_duration_decided_apart_expire_by_their_own_ends() {
    let redis = Redis::start();
    let now = common::now_ms();
    let mut ends = std::collections::BTreeMap::new();
    for burst in 0..5i64 {
        let until = now + 3_600_000 - burst * 20_000;
        for i in 0..40 {
            let addr = format!("198.51.{burst}.{}", i + 1);
            redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), &addr]);
            ends.insert(addr, until);
        }
    }
    let f = following(redis, "spreadend");
    let (ns, redis) = (&f.ns, &f.redis);
    for round in ["at start", "after a reconcile"] {
        if round != "at start" {
            // Each read of the list starts with one ZCOUNT (lua/bans_page.lua):
            // two more reads, so the first one's replacement is applied.
            let before = zcount_calls(redis);
            wait_until(Duration::from_secs(30), "two reconciles", || {
                zcount_calls(redis) >= before + 2
            });
        }
        let (listed_from, elems, listed_to) = (
            common::now_ms(),
            common::nft_bans_detailed(ns, "fleetban", "v4"),
            common::now_ms(),
        );
        assert_eq!(elems.len(), ends.len(), "{round}: {elems:?}");
        for e in &elems {
            let until = ends[&e.elem];
            let left = e
                .expires_ms
                .unwrap_or_else(|| panic!("{round}: {} has no expiry", e.elem)) as i64;
            // nft -j reports whole seconds (rounded down): the end it holds
            // lies within a second of the ban's own, the listing's time aside.
            assert!(
                left >= until - listed_to - 2_000 && left <= until - listed_from + 1_000,
                "{round}: {} expires in {left} ms, its own end is {} ms away",
                e.elem,
                until - listed_from
            );
        }
    }
}

/// A periodic reconcile that can find nothing new (the stream followed
/// without a gap since the last full read) reads nothing of the list and
/// re-adds nothing; a ban another host writes (list + event, as `ban.lua`
/// does) still arrives, from the stream; a member written by hand, with no
/// event, arrives at the full read every `FULL_EVERY` periods. 5,000 bans:
/// more than one page (a list of one page is read at every period).
#[test]
fn a_reconcile_that_can_find_nothing_new_reads_nothing() {
    let (redis, until) = long_list(5_000);
    let f = following(redis, "quiet");
    let (d, redis) = (&f.d, &f.redis);
    let (reads, reconciled) = (zcount_calls(redis), f.count("nftables reconciled"));
    let skipped = f.count("the list not read");
    wait_until(Duration::from_secs(30), "three periods", || {
        f.count("the list not read") >= skipped + 3
    });
    assert_eq!(
        zcount_calls(redis),
        reads,
        "a quiet period read the list\n{}",
        tail(&d.log_text())
    );
    assert_eq!(f.count("nftables reconciled"), reconciled, "{}", tail(&d.log_text()));

    // Another host's ban: its list entry and its event.
    let u = until.to_string();
    redis.cli(&["ZADD", "{fleetban}:bans", &u, "192.0.2.77"]);
    redis.cli(&[
        "XADD",
        "{fleetban}:events",
        "*",
        "op",
        "ban",
        "addr",
        "192.0.2.77",
        "until",
        &u,
        "host",
        "other",
    ]);
    wait_until(Duration::from_secs(30), "the fleet's ban in nft", || {
        f.has("192.0.2.77")
    });
    assert_eq!(zcount_calls(redis), reads, "an event made a full read");

    // Written by hand, no event: the drift repair's full read brings it.
    redis.cli(&["ZADD", "{fleetban}:bans", &u, "192.0.2.78"]);
    wait_until(Duration::from_secs(60), "the hand-written ban in nft", || {
        f.has("192.0.2.78")
    });
    assert!(zcount_calls(redis) > reads);
    let log = d.log_text();
    let last = log
        .lines()
        .rfind(|l| l.contains("nftables reconciled"))
        .unwrap_or_default();
    // Nothing else changed: one element added, none re-added.
    assert!(last.contains("added=1") && last.contains("refreshed=0"), "{last}");
}

/// Past `enforce::LIST_MAX` (50,000) elements the periodic drift repair
/// still reads the whole list, but sends the enforcer and the view only
/// what changed without an event (`fleet::Drift`), not the list: a member
/// written by hand arrives, one deleted by hand is lifted, and nothing is
/// planned against the whole list again (no "nftables reconciled").
#[test]
fn a_drift_repair_of_a_long_list_applies_only_what_changed() {
    let (redis, until) = long_list(60_000);
    let f = following(redis, "drift");
    let (d, redis) = (&f.d, &f.redis);
    let reconciled = f.count("nftables reconciled");
    assert!(f.has("100.0.0.1"));
    // Written and deleted by hand, no event.
    redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), "192.0.2.78"]);
    redis.cli(&["ZREM", "{fleetban}:bans", "100.0.0.1"]);
    wait_until(Duration::from_secs(90), "the drift repair", || {
        f.count("Drift repair") > 0
    });
    let log = d.log_text();
    let repair = log.lines().find(|l| l.contains("Drift repair")).unwrap_or_default();
    assert!(repair.contains("added=1") && repair.contains("removed=1"), "{repair}");
    wait_until(Duration::from_secs(30), "the repair in nft", || {
        f.has("192.0.2.78") && !f.has("100.0.0.1")
    });
    assert_eq!(f.count("nftables reconciled"), reconciled, "{}", tail(&d.log_text()));
}

/// A daemon in a namespace of its own (named after `host`) following
/// the list `redis` holds, with `reconcile_every: 1s`; the list applied.
/// Fields drop in order: the daemon first.
struct Following {
    d: Daemon,
    _r: ConfigDir,
    ns: common::NetNs,
    redis: Redis,
}

impl Following {
    /// How many of the daemon's log lines say `what`.
    fn count(&self, what: &str) -> usize {
        self.d.log_text().matches(what).count()
    }

    /// Whether the kernel's set of addresses holds `addr`.
    fn has(&self, addr: &str) -> bool {
        common::nft_bans(&self.ns, "fleetban", "v4")
            .iter()
            .any(|(e, _)| e == addr)
    }
}

fn following(redis: Redis, host: &str) -> Following {
    let ns = common::NetNs::new(host);
    let r = ConfigDir::new();
    let main = r.main_config().host_id(host).redis(&redis.url(), "reconcile_every: 1s");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    wait_until(Duration::from_secs(120), "the list applied", || {
        d.log_text().contains("Ban list applied")
    });
    Following { d, _r: r, ns, redis }
}

/// A redis-server of its own holding `n` bans that end in an hour, and
/// that end.
fn long_list(n: u64) -> (Redis, i64) {
    let redis = Redis::start();
    let until = common::now_ms() + 3_600_000;
    redis.preload_bans(n, until);
    (redis, until)
}

fn zcount_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_zcount:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap_or(0))
}
