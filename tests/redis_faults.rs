//! Redis faults that are not an outage, and an outage's messages: `fleetban
//! run` against a redis-server of its own, answering with errors (a damaged
//! ban record, `maxmemory` with `noeviction`) or losing its data. Each case
//! checks the host's state (`status`, the list in Redis) and its log,
//! counted over a bounded period.

mod common;

use std::time::{Duration, Instant};

use common::{append, cli, combined_line, nft_bans, now_ms, wait_until, ConfigDir, Daemon, NetNs, Redis, Rule};

/// A daemon with the log firewall (no nft needed) on `redis`: rule
/// `scraper`, at most 3 GETs a minute, bans of 1h; `redis_options` added.
fn rig(redis: &Redis, redis_options: &str) -> ConfigDir {
    let r = ConfigDir::new();
    let main = r
        .main_config()
        .host_id("fault-host")
        .log_firewall()
        .redis(&redis.url(), redis_options);
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    r
}

/// Lines over the limit for each of `addrs`, appended at once.
fn scrape(r: &ConfigDir, addrs: &[String]) {
    let now = now_ms();
    let mut lines = String::new();
    for a in addrs {
        for i in 0..5 {
            lines += &combined_line(a, now + i, "/page", 200);
        }
    }
    append(&r.log, &lines);
}

fn warnings(log: &str) -> usize {
    log.lines().filter(|l| l.contains("WARN")).count()
}

/// A list entry whose record is not JSON (written by hand, damaged) used
/// to fail `ban.lua` and send the host into outage mode; the new ban now
/// replaces the record, keeping the later end, and the host stays with Redis.
#[test]
fn a_damaged_ban_record_is_replaced_by_the_next_ban_and_is_no_outage() {
    let redis = Redis::start();
    // No reconcile during the test: the hand-written entry stays unknown
    // to the host's view, so its hits reach ban.lua.
    let r = rig(&redis, "reconcile_every: 1h");
    let d = Daemon::start(None, &r.cfg, &r.control);
    let later = now_ms() + 7_200_000;
    redis.cli(&["ZADD", "{fleetban}:bans", &later.to_string(), "203.0.113.95"]);
    redis.cli(&["HSET", "{fleetban}:banrec", "203.0.113.95", "not json"]);

    scrape(&r, &["203.0.113.95".into()]);
    wait_until(Duration::from_secs(10), "the damaged record replaced", || {
        redis.record_text("203.0.113.95").as_deref() != Some("not json")
    });
    let rec = redis.record("203.0.113.95");
    assert_eq!(
        (rec["rule"].as_str(), rec["host"].as_str()),
        (Some("scraper"), Some("fault-host"))
    );
    let score: i64 = redis
        .cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.95"])
        .parse()
        .unwrap();
    assert_eq!(score, later, "the later end (the hand-written one) kept");
    // Another client still bans through Redis: no outage was declared.
    scrape(&r, &["203.0.113.96".into()]);
    wait_until(Duration::from_secs(10), "the next ban in the list", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.96"]).is_empty()
    });
    let st = d.status();
    assert_eq!(st["redis"]["connected"], true, "{st}");
    assert_eq!(st["redis"]["local_decisions"], 0, "{st}");
    assert_eq!(st["redis"]["queued_bans"], 0, "{st}");
    let log = d.log_text();
    assert!(!log.contains("locally"), "decided locally:\n{log}");
    assert_eq!(warnings(&log), 0, "{log}");
}

/// Redis at `maxmemory` with `noeviction` refuses every write: that is
/// said once as OOM, the host stays connected, bans are enforced here and
/// queued, retried with a growing wait (a handful of lines in 5 s, not
/// two every 100 ms), and written once memory is raised.
#[test]
fn redis_out_of_memory_is_reported_as_such_retried_with_backoff_and_recovered() {
    let redis = Redis::start();
    let r = rig(&redis, "reconcile_every: 1h");
    let d = Daemon::start(None, &r.cfg, &r.control);
    // A first ban with memory to spare: the scripts are loaded.
    scrape(&r, &["203.0.113.10".into()]);
    wait_until(Duration::from_secs(10), "a first ban", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.10"]).is_empty()
    });
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let before = d.log_text().lines().count();

    // Five seconds of scrapers, a new one every half second.
    let started = Instant::now();
    let mut addrs = Vec::new();
    for i in 0..10 {
        let a = format!("203.0.113.{}", 20 + i);
        scrape(&r, std::slice::from_ref(&a));
        addrs.push(a);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(started.elapsed() >= Duration::from_secs(5));
    let log = d.log_text();
    let during: Vec<&str> = log.lines().skip(before).collect();
    let st = d.status();
    assert!(
        during
            .iter()
            .any(|l| l.contains("WARN") && l.contains("out of memory") && l.contains("noeviction")),
        "no OOM warning:\n{log}"
    );
    let warned = during.iter().filter(|l| l.contains("WARN")).count();
    assert!(warned <= 4, "{warned} warnings in 5 s:\n{log}");
    assert!(
        during.len() <= 40,
        "{} lines in 5 s (10 bans, one line each, and a few warnings):\n{log}",
        during.len()
    );
    assert_eq!(st["redis"]["connected"], true, "an OOM is no outage: {st}");
    assert!(st["redis"]["queued_bans"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert!(redis.cli(&["ZSCORE", "{fleetban}:bans", &addrs[0]]).is_empty());

    // Memory raised: the queued bans reach the list.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_until(Duration::from_secs(15), "the queued bans written", || {
        d.status()["redis"]["queued_bans"] == 0
    });
    let listed = addrs
        .iter()
        .filter(|a| !redis.cli(&["ZSCORE", "{fleetban}:bans", a]).is_empty())
        .count();
    assert_eq!(listed, addrs.len(), "queued bans not written:\n{}", d.log_text());
    assert!(d.log_text().contains("takes bans again"), "{}", d.log_text());
}

/// One of two hosts sharing `redis`, in its own namespace (its own nft
/// table), reconciling every second.
fn host(redis: &Redis, id: &str) -> (ConfigDir, NetNs, Daemon) {
    let r = ConfigDir::new();
    let main = r.main_config().host_id(id).redis(&redis.url(), "reconcile_every: 1s");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let ns = NetNs::new(&id.replace('-', ""));
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    (r, ns, d)
}

fn in_set(ns: &NetNs, elem: &str) -> bool {
    nft_bans(ns, "fleetban", "v4").iter().any(|(e, _)| e == elem)
}

/// Redis coming back empty (FLUSHALL; a restart without persistence) is a
/// lost list, not a fleet of unbans: the hosts write back the bans they
/// enforce, with their ends and records, and say so; an unban after that
/// still lifts a ban everywhere, and stays lifted.
#[test]
fn a_ban_list_redis_lost_is_written_back_and_a_real_unban_still_works() {
    let mut redis = Redis::start();
    let (ra, nsa, a) = host(&redis, "host-a");
    let (rb, nsb, b) = host(&redis, "host-b");
    // An operator's ban through host A's config, and a rule's ban on host B.
    let out = cli(
        &ra.cfg,
        &["ban", "198.51.100.7", "--for", "2h", "--reason", "abuse report"],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    scrape(&rb, &["203.0.113.50".into()]);
    let banned = ["198.51.100.7", "203.0.113.50"];
    wait_until(Duration::from_secs(10), "both bans on both hosts", || {
        banned.iter().all(|e| in_set(&nsa, e) && in_set(&nsb, e))
    });
    let ends: Vec<String> = banned
        .iter()
        .map(|e| redis.cli(&["ZSCORE", "{fleetban}:bans", e]))
        .collect();
    let recs: Vec<serde_json::Value> = banned.iter().map(|e| redis.record(e)).collect();
    // Each host has taken the fleet's epoch and the records (one reconcile).
    std::thread::sleep(Duration::from_millis(1500));

    let restored = |redis: &Redis, what: &str| {
        wait_until(Duration::from_secs(15), what, || {
            banned
                .iter()
                .zip(&ends)
                .all(|(e, end)| &redis.cli(&["ZSCORE", "{fleetban}:bans", e]) == end)
        });
        // The same fields and values (a host writes back what it kept,
        // not the text it read).
        for (e, rec) in banned.iter().zip(&recs) {
            assert!(rec.is_object(), "a record of {e} before the loss: {rec}");
            assert_eq!(&redis.record(e), rec, "the record of {e}");
        }
        // Still enforced by both, across more reconciles.
        std::thread::sleep(Duration::from_millis(2500));
        for e in banned {
            assert!(
                in_set(&nsa, e) && in_set(&nsb, e),
                "{e} lifted after {what}:\nA:\n{}\nB:\n{}",
                a.log_text(),
                b.log_text()
            );
        }
        assert_eq!(a.status()["bans_active"], 2);
        assert_eq!(b.status()["bans_active"], 2);
    };
    let warned = || {
        format!("{}{}", a.log_text(), b.log_text())
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("ban list was lost"))
            .count()
    };

    redis.cli(&["FLUSHALL"]);
    restored(&redis, "FLUSHALL");
    let after_flush = warned();
    assert!(
        (1..=2).contains(&after_flush),
        "one warning per host at most, got {after_flush}"
    );

    redis.restart();
    restored(&redis, "a restart without persistence");
    assert!(warned() > after_flush, "no warning after the restart");

    // A real unban is not undone: gone from the list and both sets, and stays gone.
    let out = cli(&ra.cfg, &["unban", "198.51.100.7"]);
    assert_eq!(out.code, 0, "{}", out.text());
    wait_until(Duration::from_secs(10), "the unban on both hosts", || {
        !in_set(&nsa, "198.51.100.7") && !in_set(&nsb, "198.51.100.7")
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(redis.cli(&["ZSCORE", "{fleetban}:bans", "198.51.100.7"]), "");
    assert!(!in_set(&nsa, "198.51.100.7") && !in_set(&nsb, "198.51.100.7"));
    assert!(in_set(&nsa, "203.0.113.50") && in_set(&nsb, "203.0.113.50"));
}

/// A host down while Redis lost the list (a restart without persistence)
/// finds the fleet's epoch changed since it last ran (`state_dir/epoch`):
/// it writes back what its nft set kept instead of lifting it, and says so.
#[test]
fn a_host_started_after_redis_lost_the_list_writes_back_what_its_set_kept() {
    let mut redis = Redis::start();
    let (r, ns, mut d) = host(&redis, "late-host");
    let banned = ["198.51.100.41", "198.51.100.42", "198.51.100.43"];
    for a in banned {
        let out = cli(&r.cfg, &["ban", a, "--for", "2h"]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
    wait_until(Duration::from_secs(10), "the bans in nft", || {
        banned.iter().all(|a| in_set(&ns, a))
    });
    d.stop(Duration::from_secs(10));
    redis.restart();

    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    wait_until(Duration::from_secs(10), "the bans written back", || {
        banned
            .iter()
            .all(|a| !redis.cli(&["ZSCORE", "{fleetban}:bans", a]).is_empty())
    });
    // Across reconciles, still enforced.
    std::thread::sleep(Duration::from_millis(2500));
    for a in banned {
        assert!(in_set(&ns, a), "{a} lifted:\n{}", d.log_text());
    }
    let said: Vec<String> = d
        .log_text()
        .lines()
        .filter(|l| l.contains("lost while this host was down"))
        .map(str::to_owned)
        .collect();
    assert_eq!(said.len(), 1, "{}", d.log_text());
    assert!(said[0].contains("count=3"), "{}", said[0]);
}

/// An outage's messages: the fleet sync's failures once (not every 2 s), a
/// ban decided here while Redis is down logged as "Banned." like any
/// other, without an error of ban.lua; written to the list when Redis is back.
#[test]
fn an_outage_is_warned_once_and_a_local_ban_logs_banned() {
    let mut redis = Redis::start();
    let r = rig(&redis, "reconcile_every: 1s");
    let d = Daemon::start(None, &r.cfg, &r.control);
    redis.kill();
    let before = d.log_text().lines().count();
    scrape(&r, &["203.0.113.60".into()]);
    wait_until(Duration::from_secs(10), "the local ban queued", || {
        d.status()["redis"]["queued_bans"] == 1
    });
    std::thread::sleep(Duration::from_secs(8));
    let log = d.log_text();
    let during: Vec<&str> = log.lines().skip(before).collect();
    let count = |what: &str| during.iter().filter(|l| l.contains(what)).count();
    assert!(count("Reconcile with the ban list failed") <= 1, "{log}");
    assert!(count("Following ban events failed") <= 1, "{log}");
    assert!(count("WARN") <= 4, "{} warnings in 8 s:\n{log}", count("WARN"));
    let banned: Vec<&&str> = during
        .iter()
        .filter(|l| l.contains("Banned.") && l.contains("203.0.113.60"))
        .collect();
    assert_eq!(banned.len(), 1, "{log}");
    assert!(
        banned[0].contains("locally") && banned[0].contains("rule=scraper"),
        "{}",
        banned[0]
    );
    assert!(!log.contains("unexpected reply"), "{log}");

    redis.restart();
    wait_until(Duration::from_secs(15), "the queued ban written", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.60"]).is_empty()
    });
}

/// A megabyte of garbage as a list member and as an event's address is
/// skipped with a warning that shows its first 64 bytes and its size, not
/// the whole of it.
#[test]
fn a_poisoned_member_is_echoed_capped() {
    let redis = Redis::start();
    let r = rig(&redis, "reconcile_every: 1s");
    let d = Daemon::start(None, &r.cfg, &r.control);
    let big = vec![b'x'; 1 << 20];
    redis.cli_last_from_stdin(&["ZADD", "{fleetban}:bans", "+inf"], &big);
    redis.cli_last_from_stdin(
        &["XADD", "{fleetban}:events", "*", "op", "ban", "until", "inf", "addr"],
        &big,
    );
    wait_until(Duration::from_secs(10), "both warnings", || {
        let log = d.log_text();
        log.contains("Ban list entry is not an address")
            && log.contains("Ban event for something that is not an address")
    });
    let log = d.log_text();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 1000, "a line of {longest} bytes");
    assert!(
        log.contains(&format!("{}… ({} bytes)", "x".repeat(64), 1 << 20)),
        "no capped echo"
    );
}

/// Item 1's third case: the events stream has exhausted its ids (an entry
/// written by hand at the last possible id), so `ban.lua`'s XADD fails.
/// That is a refusal, not an outage: the host stays with Redis, enforces
/// the bans here and queues them, and they are written once the stream
/// can take entries again.
#[test]
fn an_events_stream_out_of_ids_is_a_refusal_not_an_outage() {
    let redis = Redis::start();
    let r = rig(&redis, "reconcile_every: 1h");
    let d = Daemon::start(None, &r.cfg, &r.control);
    scrape(&r, &["203.0.113.40".into()]);
    wait_until(Duration::from_secs(10), "a first ban", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.40"]).is_empty()
    });
    let last = "18446744073709551615-18446744073709551615";
    assert_eq!(redis.cli(&["XADD", "{fleetban}:events", last, "op", "x"]), last);

    scrape(&r, &["203.0.113.41".into()]);
    wait_until(Duration::from_secs(10), "the ban queued", || {
        d.status()["redis"]["queued_bans"].as_u64().unwrap_or(0) >= 1
    });
    let st = d.status();
    assert_eq!(st["redis"]["connected"], true, "a refusal is no outage: {st}");
    let bans = cli(&r.cfg, &["bans"]).stdout;
    assert!(bans.contains("203.0.113.41"), "enforced here meanwhile: {bans}");

    // The stream can take entries again: the queued ban is written.
    redis.cli(&["DEL", "{fleetban}:events"]);
    wait_until(Duration::from_secs(15), "the queued ban written", || {
        d.status()["redis"]["queued_bans"] == 0
    });
    assert!(!redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.41"]).is_empty());
    assert!(
        !d.log_text().contains("Redis is down"),
        "taken for an outage:\n{}",
        d.log_text()
    );
}

/// How many times Redis ran `cmd` since it started (INFO commandstats).
fn calls(redis: &Redis, cmd: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The shipped ACL user without `+xread` (issue 25, item 6): each failed
/// read of the events stream schedules a snapshot of the list, and each
/// snapshot's success used to reset the read's backoff and its warning, so
/// the host read the whole list ~16 times a second and warned ~8 times a
/// second. Now the read backs off by its own failures: in 8 s a handful of
/// snapshots and one warning. `check --online` names the missing right.
#[test]
fn a_read_that_keeps_failing_backs_off_by_its_own_failures_and_warns_once() {
    let redis = Redis::start();
    redis.add_acl_user(&[]);
    assert_eq!(redis.cli(&["ACL", "SETUSER", "fleetban", "-xread"]), "OK");
    let url = format!("{}?user=fleetban&pass={}", redis.url(), common::ACL_PASSWORD);
    let r = rig(&redis, "");
    let main = r.main_config().host_id("fault-host").log_firewall().redis(&url, "");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    let before = calls(&redis, "zrange");
    std::thread::sleep(Duration::from_secs(8));
    let snapshots = calls(&redis, "zrange") - before;
    let log = d.log_text();
    let warned = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("Following ban events failed"))
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("xread"), "the warning names the command: {log}");
    // 100 ms doubling: at most ~7 waits fit in 8 s (the old loop: ~130).
    assert!((1..=12).contains(&snapshots), "{snapshots} snapshots in 8 s:\n{log}");

    let out = cli(&r.cfg, &["check", "--online"]);
    assert!(!out.success());
    assert!(out.text().contains("may not run xread"), "{}", out.text());
}
