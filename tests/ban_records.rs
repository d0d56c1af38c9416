//! The ban records in Redis (docs/design.md §3, "The records"; issue 27):
//! what an active ban costs Redis (list member, record, end), records of
//! any text read back as written, records an older version wrote (JSON)
//! still shown and converted when rewritten, and nothing left behind by an
//! unban or an expiry. A redis-server of the test's own.

mod common;

use std::time::Duration;

use common::{cli, now_ms, Redis};
use fleetban::bans::{BanList, BanRecord, BanRequest, Mode, Outcome};
use fleetban::config::BanPolicy;
use fleetban::store::Keys;
use ipnet::IpNet;

/// Issue 27's bound on what one active ban costs Redis.
const MAX_BYTES_PER_BAN: i64 = 150;

fn policy() -> BanPolicy {
    BanPolicy {
        duration_ms: 3_600_000,
        factor: 2.0,
        max_ms: 86_400_000,
        forget_after_ms: 86_400_000,
        network: None,
    }
}

/// The `i`-th address of the benchmarks' list (`bench/scale.rs`): 3/4
/// IPv4 addresses, 1/4 IPv6 /64s.
fn member(i: u32) -> IpNet {
    let text = if i % 4 == 3 {
        format!("2001:db8:{:x}:{:x}::/64", i / 65536, i % 65536)
    } else {
        format!(
            "{}.{}.{}.{}/32",
            100 + (i / 16_777_216) % 50,
            (i / 65536) % 256,
            (i / 256) % 256,
            i % 256
        )
    };
    text.parse().expect("a network")
}

/// A rule's ban of `addr` as the daemon asks for it: the reason as
/// `Limit::reason` words it, hits over a limit of 100, one of three hosts.
fn rule_ban(addr: IpNet, i: u32) -> BanRequest {
    let hits = 101 + i % 7;
    BanRequest {
        addr,
        rule: "nginx-scraper".into(),
        reason: format!("{hits} hits within 1m"),
        host: format!("web-{}", 1 + i % 3),
        hits,
        mode: Mode::Auto(policy()),
    }
}

fn list(redis: &Redis, rt: &tokio::runtime::Runtime) -> BanList {
    let con = common::connect(
        rt,
        &redis.config("fleetban", Duration::from_secs(5)),
        Duration::from_secs(5),
    );
    BanList::redis(con, Keys::new("fleetban"))
}

/// 100,000 rules' bans written by `ban.lua` cost Redis at most 150 B each,
/// list member, record and end together (main: ~306 B: a JSON record in
/// one big hash). Memory, not time: the same bytes on every run of one
/// Redis build; 100,000 and not fewer because the 4,096 record buckets
/// cost ~0.4 MB however few bans they hold (at 20,000: ~168 B per ban).
/// Measured here 145-147 B (redis 7.0.15, jemalloc; the key table's
/// shrink after the offence counts are deleted moves it by a byte or two):
/// little headroom, on purpose: the bound is the issue's.
#[test]
fn an_active_ban_costs_redis_at_most_150_bytes_at_100000_bans() {
    const BANS: u32 = 100_000;
    let redis = Redis::start();
    let rt = common::runtime();
    let mut bans = list(&redis, &rt);
    let before = redis.used_memory();
    let now = now_ms();
    // Eight connections at once: the round trips overlap.
    const LANES: u32 = 8;
    let lanes = (0..LANES).map(|lane| {
        let mut bans = list(&redis, &rt);
        async move {
            for i in (lane..BANS).step_by(LANES as usize) {
                let out = bans.ban(&rule_ban(member(i), i), now).await.expect("ban.lua");
                assert!(matches!(out, Outcome::Banned(_)), "{i}: {out:?}");
            }
        }
    });
    rt.block_on(futures_util::future::join_all(lanes));
    // What a ban writes besides the list and its record, bounded or not
    // per ban: the events stream (MAXLEN 100,000) and the offence counts
    // (escalation's, until forget_after), taken out of the figure.
    let keys = Keys::new("fleetban");
    redis.cli(&["DEL", &keys.events()]);
    let offences: Vec<String> = (0..BANS).map(|i| keys.offences(&member(i))).collect();
    for some in offences.chunks(1000) {
        let mut args = vec!["DEL"];
        args.extend(some.iter().map(String::as_str));
        assert_eq!(redis.cli(&args), some.len().to_string());
    }
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), BANS.to_string());
    // Redis shrinks its key tables, grown by the offence counts, within
    // a few of its 100 ms crons.
    std::thread::sleep(Duration::from_secs(1));
    let per_ban = (redis.used_memory() - before) / i64::from(BANS);
    eprintln!("Redis memory: {per_ban} B per ban at {BANS} bans");
    assert!(
        per_ban <= MAX_BYTES_PER_BAN,
        "{per_ban} B per ban (list member, record, end) > {MAX_BYTES_PER_BAN}"
    );
    // Every record compact (none in the JSON hash), in listpacks.
    assert_eq!(redis.cli(&["HLEN", "{fleetban}:banrec"]), "0");
    assert_eq!(redis.compact_records(), u64::from(BANS));
    assert_eq!(redis.cli(&["OBJECT", "ENCODING", "{fleetban}:banrec:7"]), "listpack");
    // And read back as written.
    let sample: Vec<u32> = vec![0, 3, 4_097, 99_999];
    let recs = rt.block_on(bans.records(now + 1)).expect("records");
    assert_eq!(recs.len(), BANS as usize);
    for i in sample {
        let want = rule_ban(member(i), i).record(now, Some(now + 3_600_000), 1);
        let got = recs.iter().find(|r| r.addr == member(i)).expect("a record");
        assert_eq!(got, &want);
    }
}

/// A record reads back as it was written whatever its text: a reason with
/// the address or the hits in it, control bytes, a rule with a newline,
/// a long reason (which must not turn its bucket from a listpack into a
/// hash table), an operator's permanent ban.
#[test]
fn records_read_back_as_written_whatever_their_text() {
    let redis = Redis::start();
    let rt = common::runtime();
    let mut bans = list(&redis, &rt);
    let now = now_ms();
    let long = "a reason longer than a listpack value may be: ".repeat(8);
    let cases: Vec<(&str, &str, &str, u32)> = vec![
        ("203.0.113.1/32", "scraper", "", 7),
        ("203.0.113.2/32", "scraper", "101 hits within 1m", 101),
        (
            "198.51.100.0/24",
            "scraper",
            "5 addresses of 198.51.100.0/24 banned within 10m (rule scraper)",
            0,
        ),
        ("203.0.113.3/32", "scraper", "7 of 7: 7", 7),
        ("203.0.113.4/32", "scraper", "bytes \u{1} and \u{2} in it", 3),
        ("203.0.113.5/32", "two\nlines", "für 🚫", 0),
        ("2001:db8::/64", "scraper", &long, 2),
    ];
    let mut want: Vec<BanRecord> = Vec::new();
    rt.block_on(async {
        for (i, (addr, rule, reason, hits)) in cases.iter().enumerate() {
            let req = BanRequest {
                addr: addr.parse().unwrap(),
                rule: (*rule).into(),
                reason: (*reason).into(),
                host: format!("host-{i}"),
                hits: *hits,
                mode: Mode::Auto(policy()),
            };
            match bans.ban(&req, now).await.expect("ban.lua") {
                Outcome::Banned(rec) => want.push(rec),
                other => panic!("{addr}: {other:?}"),
            }
        }
        let op = BanRequest::manual(
            "192.0.2.9/32".parse().unwrap(),
            Mode::Permanent { replace: false },
            "by hand",
            "ops",
        );
        match bans.ban(&op, now).await.expect("ban.lua") {
            Outcome::Banned(rec) => want.push(rec),
            other => panic!("{other:?}"),
        }
        let mut got = bans.records(now + 1).await.expect("records");
        got.sort_by_key(|r| r.addr);
        want.sort_by_key(|r| r.addr);
        assert_eq!(got, want);
    });
    // Only the two that cannot be compact (control bytes; a newline in
    // the rule) are JSON.
    assert_eq!(redis.cli(&["HLEN", "{fleetban}:banrec"]), "2");
    assert_eq!(redis.compact_records(), want.len() as u64 - 2);
    for key in redis.cli(&["--scan", "--pattern", "{fleetban}:banrec:*"]).lines() {
        if !key.ends_with(":meta") {
            assert_eq!(redis.cli(&["OBJECT", "ENCODING", key]), "listpack", "{key}");
        }
    }
}

/// A fleet upgraded from a version that wrote JSON records: `fleetban bans`
/// shows them as before; an operator's ban over one keeps its rule, host,
/// start and count and rewrites it compact; a record an older version
/// writes over a compact one (a mixed fleet) is the one read.
#[test]
fn json_records_of_an_older_version_are_shown_and_rewritten_compact() {
    let redis = Redis::start();
    let r = common::operator::redis_rig(&redis, "");
    let until = now_ms() + 3_600_000;
    let old = |addr: &str, rule: &str, host: &str| {
        redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), addr]);
        let rec = format!(
            r#"{{"rule":"{rule}","reason":"121 hits within 1m","host":"{host}","since":1764700000000,"until":{until},"count":2,"hits":121}}"#
        );
        redis.cli(&["HSET", "{fleetban}:banrec", addr, &rec]);
    };
    old("203.0.113.30", "scraper", "web-1");
    old("2001:db8:5::/64", "api", "web-2");
    let shown = |addr: &str| common::operator::ban_of(&r, addr).unwrap_or_else(|| panic!("{addr} not shown"));
    for (addr, rule, host) in [
        ("203.0.113.30", "scraper", "web-1"),
        ("2001:db8:5::/64", "api", "web-2"),
    ] {
        let b = shown(addr);
        assert_eq!(
            (
                b["rule"].as_str(),
                b["host"].as_str(),
                b["reason"].as_str(),
                b["hits"].as_u64(),
                b["count"].as_u64()
            ),
            (Some(rule), Some(host), Some("121 hits within 1m"), Some(121), Some(2)),
            "{b}"
        );
        assert!(b["since"].is_string(), "{b}");
        assert!(b["left_s"].as_i64().is_some_and(|l| l <= 3600), "{b}");
    }
    let since = shown("203.0.113.30")["since"].clone();

    // An operator's longer ban over the first: extended, its record kept
    // and now compact.
    let out = cli(&r.cfg, &["ban", "203.0.113.30", "--for", "3h", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(redis.cli(&["HEXISTS", "{fleetban}:banrec", "203.0.113.30"]), "0");
    assert_eq!(redis.compact_records(), 1);
    let b = shown("203.0.113.30");
    assert_eq!(
        (
            b["rule"].as_str(),
            b["host"].as_str(),
            b["hits"].as_u64(),
            b["count"].as_u64()
        ),
        (Some("scraper"), Some("web-1"), Some(121), Some(2)),
        "{b}"
    );
    assert_eq!(b["since"], since, "{b}");
    assert!(b["left_s"].as_i64().is_some_and(|l| l > 3600), "{b}");

    // An older version's operator ban writes JSON over the compact record:
    // that one is read.
    redis.cli(&[
        "HSET",
        "{fleetban}:banrec",
        "203.0.113.30",
        r#"{"rule":"manual","reason":"old version","host":"ops","since":1,"until":null,"count":1,"hits":0}"#,
    ]);
    assert_eq!(shown("203.0.113.30")["reason"], "old version");
}

/// An unban and an expiry take the record with the entry, whichever form
/// it has; nothing is left in the buckets.
#[test]
fn unban_and_expiry_leave_no_record_behind() {
    let redis = Redis::start();
    let rt = common::runtime();
    let mut bans = list(&redis, &rt);
    let now = now_ms();
    rt.block_on(async {
        for i in 0..20 {
            let mut req = rule_ban(member(i), i);
            if i % 2 == 1 {
                // Short operator bans, to expire.
                req = BanRequest::manual(
                    member(i),
                    Mode::For {
                        ms: 1000,
                        replace: false,
                    },
                    "soon over",
                    "ops",
                );
            }
            bans.ban(&req, now).await.expect("ban.lua");
        }
        // A record an older version wrote, of an entry unbanned below.
        redis.cli(&["HSET", "{fleetban}:banrec", "100.0.0.0", r#"{"rule":"old"}"#]);
        assert_eq!(redis.compact_records(), 20);
        for i in (0..20).step_by(2) {
            assert!(bans.unban(&member(i), "ops").await.expect("unban.lua"));
        }
        // The next ban after their end sweeps the expired ones out.
        bans.ban(&rule_ban(member(100), 100), now + 2000)
            .await
            .expect("ban.lua");
    });
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), "1");
    assert_eq!(redis.compact_records(), 1);
    assert_eq!(redis.cli(&["HLEN", "{fleetban}:banrec"]), "0");
}
