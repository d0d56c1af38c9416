//! `limit: { distinct: FIELD }` end to end: `fleetban test` on a generated
//! access log bans a client probing many different 404 paths and not one
//! asking for a single missing page far more often (nor one varying only
//! the query string, nor one spelling one path in many ways nginx serves
//! as one: `%XX`, `//`, `/./`); and the hashes that stand for the values can only
//! make the count low: two values sharing a hash count once, so a ban comes
//! later, never earlier, than the exact count's (docs/design.md §2,
//! "Distinct values"), in the embedded store and in Redis alike.

mod common;

use std::time::Duration;

use common::{cli, combined_line, connect, now_ms, runtime, ConfigDir, MainConfig, Redis, Rule};
use fleetban::config::Distinct;
use fleetban::detect::{value_member, Hit};
use fleetban::limit::{zset_member, Batch, MemoryLimiter, RedisLimiter, RuleLimit, Verdict};
use fleetban::parse::{Format, Parser};
use fleetban::store::Keys;

#[test]
fn test_bans_the_prober_and_not_the_busy_page() {
    let r = ConfigDir::new();
    let t0 = 1_700_000_000_000i64;
    let mut lines = String::new();
    for k in 0..200i64 {
        // A page missing its favicon, asked for 200 times in 100 s.
        lines += &combined_line("198.51.100.20", t0 + k * 500, "/favicon.ico", 404);
        // A search with 200 different queries: one path.
        lines += &combined_line("198.51.100.30", t0 + k * 500, &format!("/search?q={k}"), 404);
        // One missing page in 40 spellings (each letter of `missing`
        // percent-encoded or not, by the bits of k; slashes and dot
        // segments besides): nginx serves one path, `/missing`.
        let spelled: String = "missing"
            .bytes()
            .enumerate()
            .map(|(i, b)| match (k % 40) >> i & 1 {
                1 => format!("%{b:02x}"),
                _ => char::from(b).to_string(),
            })
            .collect();
        let prefix = ["/", "//", "/./", "/x/../"][(k % 4) as usize];
        lines += &combined_line("198.51.100.40", t0 + k * 500, &format!("{prefix}{spelled}?v={k}"), 404);
        if k < 40 {
            // A prober: 40 different missing paths, one every 2 s.
            lines += &combined_line("203.0.113.7", t0 + k * 2000, &format!("/backup-{k}.zip"), 404);
        }
    }
    std::fs::write(&r.log, &lines).unwrap();
    let rules = [
        Rule::new("probing", "/unused", "{ distinct: path, hits: 30, window: 5m }")
            .matching("{ status: [404] }")
            .ban("1h"),
    ];
    r.write(&MainConfig::new(), &rules);
    let out = cli(&r.cfg, &["test", "--json", r.log.to_str().expect("a UTF-8 temp path")]);
    assert_eq!(out.code, 0, "{}", out.text());
    let bans = out.test_bans();
    assert_eq!(bans.len(), 1, "{}", out.stdout);
    assert_eq!(bans[0]["addr"], "203.0.113.7", "{}", out.stdout);
    // Banned on its 31st distinct path: 30 were allowed.
    // (t0 is 2023-11-14T22:13:20Z; the 31st path is asked 60 s later.)
    assert_eq!(bans[0]["at"], "2023-11-14T22:14:20Z", "{}", out.stdout);
    assert_eq!(bans[0]["hits"], 31, "{}", out.stdout);
    // `check` names the algorithm.
    let check = cli(&r.cfg, &["check"]);
    assert_eq!(check.code, 0, "{}", check.text());
    assert!(
        check
            .stdout
            .contains("30 distinct values per 5m (distinct path, a sliding window of values)"),
        "{}",
        check.stdout
    );
}

/// The member of a request for `path` in a window of `hits` values, as the
/// limiter folds it.
fn folded(path: &str, hits: u32) -> i32 {
    let line = combined_line("192.0.2.1", 1_700_000_000_000, path, 404);
    let parser = Parser::new(&Format::Combined).expect("the combined format");
    let req = parser.parse(line.trim_end().as_bytes()).expect("a combined line");
    zset_member(value_member(Distinct::Path, &req), hits)
}

/// A hash collision undercounts: with a limit of 2, the values `a`, `b`
/// (sharing `a`'s 24-bit member), `c` end under the limit where the exact
/// count (3 values) bans at `c`; the next new value bans. Found by search
/// among `/p0`, `/p1`, ... (a 24-bit birthday: a few thousand tries).
#[test]
fn a_hash_collision_counts_two_values_once_and_bans_later_never_earlier() {
    let mut seen = std::collections::HashMap::new();
    let (a, b) = (0..200_000)
        .map(|i| format!("/p{i}"))
        .find_map(|p| seen.insert(folded(&p, 2), p.clone()).map(|first| (first, p)))
        .expect("a 24-bit collision among 200,000 values");
    assert_ne!(a, b);
    let member = |path: &str| {
        let line = combined_line("192.0.2.1", 0, path, 404);
        let req = Parser::new(&Format::Combined)
            .unwrap()
            .parse(line.trim_end().as_bytes())
            .unwrap();
        value_member(Distinct::Path, &req)
    };
    let t = now_ms();
    let hits: Vec<Hit> = [&a, &b, "/c", "/d"]
        .iter()
        .enumerate()
        .map(|(k, p)| Hit {
            time_ms: t + k as i64,
            member: member(p),
            origin: 1,
            offset: 100 * k as u64,
        })
        .collect();
    let rules = vec![RuleLimit::distinct("probing", Distinct::Path, 2, 60_000)];
    let key: ipnet::IpNet = "192.0.2.1/32".parse().unwrap();
    let mut m = MemoryLimiter::new(rules.clone());
    assert_eq!(m.check(0, key, &hits[..3], t), Verdict::Under { count: 2 });
    assert_eq!(m.check(0, key, &hits[3..], t), Verdict::Over { index: 0, count: 2 });

    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("coll", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let mut lim = RedisLimiter::new(con, Keys::new("coll"), "h1", rules);
    let mut out = Vec::new();
    let batch = |hits: &[Hit]| Batch {
        rule: 0,
        key,
        hits: hits.to_vec(),
    };
    rt.block_on(lim.check(&[batch(&hits[..3]), batch(&hits[3..])], &mut out))
        .expect("redis check");
    assert_eq!(
        out,
        vec![Verdict::Under { count: 2 }, Verdict::Over { index: 0, count: 2 }]
    );
}

/// The bound on memory: a value over the limit is never added, so a
/// client's window in Redis holds at most `hits` members however many
/// values it sends (the ZSET read back with ZCARD), and its members carry
/// the latest time each value was seen.
#[test]
fn a_window_never_holds_more_than_hits_values() {
    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("cap", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let rules = vec![RuleLimit::distinct("probing", Distinct::Path, 5, 60_000)];
    let mut lim = RedisLimiter::new(con.clone(), Keys::new("cap"), "h1", rules);
    let key: ipnet::IpNet = "192.0.2.9/32".parse().unwrap();
    let t = now_ms();
    let hit = |k: u64, at: i64| Hit {
        time_ms: at,
        member: 1000 + k,
        origin: 1,
        offset: k,
    };
    // Values 0..5 twice (the second time later), then 15 new ones.
    let mut hits: Vec<Hit> = (0..5).map(|k| hit(k, t)).collect();
    hits.extend((0..5).map(|k| hit(k, t + 10)));
    hits.extend((5..20).map(|k| hit(k, t + 20)));
    let mut out = Vec::new();
    let batch = Batch { rule: 0, key, hits };
    rt.block_on(lim.check(std::slice::from_ref(&batch), &mut out))
        .expect("redis check");
    assert_eq!(out, vec![Verdict::Over { index: 10, count: 5 }]);
    let zset = Keys::new("cap").window(&key, "probing", None);
    let mut c = con;
    let members: Vec<(i64, i64)> = rt
        .block_on(
            redis::cmd("ZRANGE")
                .arg(&zset)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut c),
        )
        .expect("ZRANGE");
    assert_eq!(members.len(), 5, "{members:?}");
    assert!(members.iter().all(|&(_, score)| score == t + 10), "{members:?}");
}

/// The daemon (Redis, log firewall): live lines of a prober and of a busy
/// page. The prober is banned at its 31st distinct path, by `lua/distinct.lua`;
/// the busy page's client, at 200 requests of one path, is not.
#[test]
fn the_daemon_bans_a_prober_by_distinct_paths_and_not_a_busy_page() {
    let r = ConfigDir::new();
    let redis = Redis::start();
    let rules = [Rule::new("probing", &r.log, "{ distinct: path, hits: 30, window: 5m }")
        .matching("{ status: [404] }")
        .ban("1h")];
    r.write(
        &r.main_config().log_firewall().redis(&redis.url(), "hold: 10ms"),
        &rules,
    );
    let d = common::Daemon::start(None, &r.cfg, &r.control);
    let now = now_ms();
    let mut lines = String::new();
    for k in 0..200i64 {
        lines += &combined_line("198.51.100.20", now + k, "/favicon.ico", 404);
        if k < 40 {
            lines += &combined_line("203.0.113.7", now + k, &format!("/backup-{k}.zip"), 404);
        }
    }
    common::append(&r.log, &lines);
    common::wait_until(Duration::from_secs(20), "the prober banned", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.7"]).is_empty()
    });
    common::wait_until(Duration::from_secs(20), "every line read", || {
        d.status()["lines"].as_u64() == Some(240) && d.status()["redis"]["held_hits"] == 0
    });
    let rec: serde_json::Value = redis.record("203.0.113.7");
    assert_eq!(rec["hits"], 31, "{rec}");
    assert_eq!(
        redis.cli(&["ZSCORE", "{fleetban}:bans", "198.51.100.20"]),
        "",
        "{}",
        d.log_text()
    );
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), "1");
}
