//! `fleetban bans` on a list too long to print on a terminal (issue 27):
//! a redis-server of the test's own holds thousands of bans with their
//! records (each its own start, end, rule and host). On a terminal, and
//! with `--limit N` anywhere, the bans ending last and the list's count
//! and ends; `--summary` the counts by kind, rule and host, which are the
//! list's; `--all`, `--json` and a pipe every ban, each once (also past the
//! length that is sorted, streamed a page at a time); `--rule`, `--host`
//! and `--in` keep exactly the bans they name.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::operator::redis_rig;
use common::{cli, cli_on_terminal, now_ms, ConfigDir, Redis};

const RULES: [&str; 3] = ["scraper", "login", "manual"];

/// The `i`th ban of [`preload`]: 1 in 4 an IPv6 /64, 1 in 20 (of the
/// others) an IPv4 /24, the rest IPv4 addresses.
fn member(i: u64) -> String {
    if i % 4 == 3 {
        format!("2001:db8:{:x}::/64", i)
    } else if i % 20 == 1 {
        format!("10.{}.{}.0/24", i / 256, i % 256)
    } else {
        format!("100.0.{}.{}", i / 256, i % 256)
    }
}

fn rule(i: u64) -> &'static str {
    RULES[(i % 3) as usize]
}

fn host(i: u64) -> String {
    format!("web-{}", i % 5 + 1)
}

/// `n` active bans with records as `ban.lua` writes them: the `i`th
/// started `(n - i) / 10` seconds before `t0` (the last is the newest), ends two
/// hours after its start plus `i % 7` seconds.
fn preload(redis: &Redis, n: u64, t0: i64) {
    let script = "local n, t0 = tonumber(ARGV[1]), tonumber(ARGV[2]) \
        local rules = {'scraper', 'login', 'manual'} \
        for i = 0, n - 1 do \
          local m \
          if i % 4 == 3 then m = string.format('2001:db8:%x::/64', i) \
          elseif i % 20 == 1 then m = string.format('10.%d.%d.0/24', math.floor(i / 256), i % 256) \
          else m = string.format('100.0.%d.%d', math.floor(i / 256), i % 256) end \
          local since = t0 - (n - i) * 100 \
          local u = since + 7200000 + (i % 7) * 1000 \
          redis.call('ZADD', KEYS[1], u, m) \
          redis.call('HSET', KEYS[2], m, cjson.encode({rule = rules[i % 3 + 1], reason = 'r' .. i, \
            host = 'web-' .. (i % 5 + 1), since = since, ['until'] = u, count = 1, hits = 10})) \
        end return n";
    redis.cli(&[
        "EVAL",
        script,
        "2",
        "{fleetban}:bans",
        "{fleetban}:banrec",
        &n.to_string(),
        &t0.to_string(),
    ]);
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), n.to_string());
}

/// The `k` bans of [`preload`]'s `n` ending last, oldest first (as
/// `bans` shows them). Ends are `i * 100 + (i % 7) * 1000` ms apart from a
/// common origin, all distinct.
fn ending_last(n: u64, k: u64) -> Vec<String> {
    let mut by_end: Vec<u64> = (0..n).collect();
    by_end.sort_by_key(|&i| i * 100 + (i % 7) * 1000);
    let mut last: Vec<u64> = by_end[(n - k) as usize..].to_vec();
    last.sort_unstable();
    last.into_iter().map(member).collect()
}

/// The lines a long list seen without reading it ends with.
fn assert_span(out: &str, n: u64, shown: u64) {
    let head = if shown == 0 {
        format!("{n} active ban(s); list them with --all, --json or --limit N")
    } else {
        format!(
            "{n} active ban(s); the {shown} ending last shown (every one: --all or --json; another number: --limit N)"
        )
    };
    assert!(out.lines().any(|l| l == head), "no line {head:?} in:\n{}", tail(out));
    assert!(
        out.lines()
            .any(|l| l.starts_with("  ending:  soonest ") && l.contains(", latest ")),
        "{}",
        tail(out)
    );
    assert!(
        out.lines()
            .any(|l| l == "  kinds, rules and hosts: --summary (reads every ban's record)"),
        "{}",
        tail(out)
    );
}

/// A rig over `n` preloaded bans.
fn long_list(n: u64) -> (Redis, ConfigDir) {
    let redis = Redis::start();
    preload(&redis, n, now_ms());
    let r = redis_rig(&redis, "");
    (redis, r)
}

/// The addresses of the table rows of `bans` output, in order.
fn rows(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<ipnet::IpNet>().is_ok() || w.parse::<std::net::IpAddr>().is_ok())
        .map(str::to_owned)
        .collect()
}

/// Every line of `bans --json`, parsed.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The summary lines `bans` ends with for bans `0..n` (the kinds, rules
/// and hosts lines, counted here from the preload's own rules).
fn summary_lines(which: impl Iterator<Item = u64>) -> Vec<String> {
    let (mut kinds, mut rules, mut hosts) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for i in which {
        let kind = if i % 4 == 3 {
            "IPv6 /64s"
        } else if i % 20 == 1 {
            "IPv4 /24s"
        } else {
            "IPv4 addresses"
        };
        *kinds.entry(kind).or_insert(0u64) += 1;
        *rules.entry(rule(i).to_owned()).or_insert(0u64) += 1;
        *hosts.entry(host(i)).or_insert(0u64) += 1;
    }
    // Largest first, ties by name (as the command orders them).
    let order = |m: BTreeMap<String, u64>, count_first: bool| {
        let mut v: Vec<(String, u64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.iter()
            .map(|(k, n)| {
                if count_first {
                    format!("{n} {k}")
                } else {
                    format!("{k} {n}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let kinds = kinds.into_iter().map(|(k, n)| (k.to_owned(), n)).collect();
    vec![
        format!("  kinds:   {}", order(kinds, true)),
        format!("  rules:   {}", order(rules, false)),
        format!("  hosts:   {}", order(hosts, false)),
    ]
}

fn assert_summary(out: &str, which: impl Iterator<Item = u64>) {
    for line in summary_lines(which) {
        assert!(out.lines().any(|l| l == line), "no line {line:?} in:\n{}", tail(out));
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("  ending:  soonest ") && l.contains(", latest ")),
        "{}",
        tail(out)
    );
}

/// The last lines of a long output, for failure messages.
fn tail(out: &str) -> String {
    let lines: Vec<&str> = out.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}

#[test]
fn with_a_limit_bans_shows_the_bans_ending_last_then_the_count_and_ends() {
    let n = 5_000;
    let (_redis, r) = long_list(n);
    let out = cli(&r.cfg, &["bans", "--limit", "100"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(rows(&out.stdout), ending_last(n, 100), "{}", tail(&out.stdout));
    assert!(out.stdout.starts_with("ADDRESS "), "{}", &out.stdout[..200]);
    assert_span(&out.stdout, n, 100);

    // With the counts of every ban: the same rows, the list's counts.
    let out = cli(&r.cfg, &["bans", "--limit", "100", "--summary"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(rows(&out.stdout), ending_last(n, 100), "{}", tail(&out.stdout));
    assert!(
        out.stdout.lines().any(|l| l
            == "5000 active ban(s); the 100 ending last shown (every one: --all or --json; another number: --limit N)"),
        "{}",
        tail(&out.stdout)
    );
    assert_summary(&out.stdout, 0..n);

    // The count and ends alone.
    let out = cli(&r.cfg, &["bans", "--limit", "0"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(rows(&out.stdout).is_empty(), "{}", out.stdout);
    assert!(out.stdout.starts_with("5000 active ban(s); "), "{}", out.stdout);
    assert_span(&out.stdout, n, 0);
    let out = cli(&r.cfg, &["bans", "--limit", "0", "--summary"]);
    assert_summary(&out.stdout, 0..n);

    // As JSON lines, nothing else on stdout.
    let out = cli(&r.cfg, &["bans", "--limit", "3", "--json"]);
    let lines = json_lines(&out.stdout);
    let addrs: Vec<&str> = lines.iter().map(|l| l["addr"].as_str().unwrap()).collect();
    assert_eq!(addrs, ending_last(n, 3));
    let i = (0..n).find(|&i| member(i) == addrs[2]).unwrap();
    assert_eq!(
        (lines[2]["rule"].as_str(), lines[2]["host"].as_str()),
        (Some(rule(i)), Some(host(i).as_str()))
    );

    // A list no longer than the limit is printed whole, as it always was.
    let out = cli(&r.cfg, &["bans", "--limit", "5000"]);
    assert_eq!(rows(&out.stdout), (0..n).map(member).collect::<Vec<_>>());
    assert!(
        out.stdout.lines().any(|l| l == "5000 active ban(s)"),
        "{}",
        tail(&out.stdout)
    );
}

#[test]
fn on_a_terminal_a_long_list_is_the_thousand_ending_last_and_its_count_and_ends() {
    let n = 5_000;
    let (_redis, r) = long_list(n);
    let screen = cli_on_terminal(&r.cfg, &["bans"]);
    assert_eq!(screen.code, 0, "{}", screen.text());
    let screen = screen.stdout;
    assert_eq!(rows(&screen), ending_last(n, 1000), "{}", tail(&screen));
    assert_span(&screen, n, 1000);

    // Piped, the same command prints every ban (scripts see no change).
    let out = cli(&r.cfg, &["bans"]);
    assert_eq!(rows(&out.stdout).len() as u64, n, "{}", tail(&out.stdout));
}

#[test]
fn all_and_json_print_every_ban_once_oldest_first() {
    let n = 5_000;
    let (_redis, r) = long_list(n);
    let every: Vec<String> = (0..n).map(member).collect();
    let out = cli(&r.cfg, &["bans", "--all"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(rows(&out.stdout), every, "{}", tail(&out.stdout));
    assert!(
        out.stdout.lines().any(|l| l == "5000 active ban(s)"),
        "{}",
        tail(&out.stdout)
    );
    assert_summary(&out.stdout, 0..n);

    let out = cli(&r.cfg, &["bans", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines = json_lines(&out.stdout);
    let addrs: Vec<&str> = lines.iter().map(|l| l["addr"].as_str().unwrap()).collect();
    assert_eq!(addrs, every);
    for (i, l) in lines.iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            (l["rule"].as_str(), l["host"].as_str()),
            (Some(rule(i)), Some(host(i).as_str()))
        );
        assert_eq!(l["reason"], format!("r{i}"));
    }
}

#[test]
fn past_the_sorted_length_every_ban_streams_once_in_the_lists_order() {
    // More than bans.rs's SORTED_UP_TO (10,000) and three pages of 4,096.
    let n = 12_345;
    let (_redis, r) = long_list(n);
    let out = cli(&r.cfg, &["bans", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines = json_lines(&out.stdout);
    assert_eq!(lines.len() as u64, n);
    let addrs: BTreeSet<&str> = lines.iter().map(|l| l["addr"].as_str().unwrap()).collect();
    let every: Vec<String> = (0..n).map(member).collect();
    assert_eq!(addrs, every.iter().map(String::as_str).collect::<BTreeSet<_>>());
    // The list's order: by end, soonest first.
    let ends: Vec<&str> = lines.iter().map(|l| l["until"].as_str().unwrap()).collect();
    assert!(ends.windows(2).all(|w| w[0] <= w[1]), "not by end");

    let out = cli(&r.cfg, &["bans", "--all"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let listed = rows(&out.stdout);
    assert_eq!(listed.len() as u64, n);
    assert_eq!(listed.iter().collect::<BTreeSet<_>>().len() as u64, n);
    assert_eq!(out.stdout.matches("ADDRESS ").count(), 1, "one header");
    assert!(
        out.stdout.lines().any(|l| l == "12345 active ban(s)"),
        "{}",
        tail(&out.stdout)
    );
    assert_summary(&out.stdout, 0..n);
}

#[test]
fn rule_host_and_in_keep_exactly_the_bans_they_name() {
    let n = 5_000;
    let (_redis, r) = long_list(n);
    let listed = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["bans", "--json"];
        all.extend_from_slice(args);
        let out = cli(&r.cfg, &all);
        assert_eq!(out.code, 0, "{}", out.text());
        json_lines(&out.stdout)
            .iter()
            .map(|l| l["addr"].as_str().unwrap().to_owned())
            .collect()
    };
    let want = |keep: &dyn Fn(u64) -> bool| -> Vec<String> { (0..n).filter(|&i| keep(i)).map(member).collect() };

    assert_eq!(listed(&["--rule", "login"]), want(&|i| rule(i) == "login"));
    assert_eq!(
        listed(&["--rule", "login", "--rule", "manual"]),
        want(&|i| rule(i) != "scraper")
    );
    assert_eq!(
        listed(&["--host", "web-2", "--rule", "scraper"]),
        want(&|i| host(i) == "web-2" && rule(i) == "scraper")
    );
    let inside: ipnet::IpNet = "100.0.3.0/24".parse().unwrap();
    let got = listed(&["--in", "100.0.3.0/24"]);
    assert_eq!(
        got,
        want(&|i| member(i).parse::<std::net::IpAddr>().is_ok_and(|a| inside.contains(&a)))
    );
    assert_eq!(
        got.len(),
        179,
        "the addresses in 100.0.3.0/24, none of the IPv6 or 10.x /24 bans"
    );
    assert_eq!(
        listed(&["--in", "2001:db8::/32", "--host", "web-1"]),
        want(&|i| i % 4 == 3 && host(i) == "web-1")
    );
    assert!(listed(&["--rule", "no-such-rule"]).is_empty());

    // For people: how many match of how many, and the summary of those.
    let out = cli(&r.cfg, &["bans", "--rule", "login", "--limit", "10"]);
    let matched = (0..n).filter(|&i| rule(i) == "login").count();
    assert!(
        out.stdout.lines().any(|l| l.starts_with(&format!(
            "{matched} of 5000 active ban(s) match; the 10 ending last shown"
        ))),
        "{}",
        tail(&out.stdout)
    );
    let mut login: Vec<u64> = (0..n).filter(|&i| rule(i) == "login").collect();
    login.sort_by_key(|&i| i * 100 + (i % 7) * 1000);
    let mut last: Vec<u64> = login[matched - 10..].to_vec();
    last.sort_unstable();
    assert_eq!(rows(&out.stdout), last.into_iter().map(member).collect::<Vec<_>>());
    assert_summary(&out.stdout, (0..n).filter(|&i| rule(i) == "login"));

    // A target that is not a network is refused as `ban` refuses it.
    let out = cli(&r.cfg, &["bans", "--in", "100.0.3.1/24"]);
    assert_eq!(out.code, 2, "{}", out.text());
}

/// A fleet sync of host `web-1` on `redis`, and the receiver of its changes.
fn fleet_sync(
    rt: &tokio::runtime::Runtime,
    redis: &Redis,
) -> (
    fleetban::fleet::FleetSync,
    tokio::sync::mpsc::UnboundedReceiver<fleetban::enforce::Change>,
) {
    use std::time::Duration;
    let cfg = redis.config("fleetban", Duration::from_secs(5));
    let keys = fleetban::store::Keys::new("fleetban");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let fleet = fleetban::fleet::FleetSync {
        events: common::connect(rt, &cfg, Duration::from_secs(5)),
        list: fleetban::bans::BanList::redis(common::connect(rt, &cfg, Duration::from_secs(5)), keys.clone()),
        host: "web-1".to_owned(),
        keys,
        reconcile_every: Duration::from_secs(60),
        changes: fleetban::enforce::Changes::to(vec![tx]),
        gaps: 0,
        listed: 0,
        held: Default::default(),
        news: None,
        marks_id: "0-0".to_owned(),
        remembered: Default::default(),
        story: Default::default(),
        health: Default::default(),
        early: None,
    };
    (fleet, rx)
}

/// What a full read by `fleet` of a list of `n` (`repair` or not) returned,
/// with what [`write_events_until`] wrote while it ran.
fn read_beside_writer(
    rt: &tokio::runtime::Runtime,
    redis: &Redis,
    fleet: &mut fleetban::fleet::FleetSync,
    n: u64,
    repair: bool,
) -> (
    Written,
    (String, Vec<fleetban::enforce::Element>, Option<fleetban::fleet::Drift>),
) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let stop = AtomicBool::new(false);
    let (started_tx, started) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let writer = s.spawn(|| write_events_until(&redis.url(), n, &stop, started_tx));
        started
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer starts");
        let read = rt.block_on(fleet.snapshot(repair)).expect("the list is read");
        stop.store(true, Relaxed);
        (writer.join().unwrap(), read)
    })
}

/// The bans and unbans [`read_beside_writer`] writes while the list is
/// read, as `ban.lua` and `unban.lua` write them
/// (the list's entry and its event in one call): (event id, member, the
/// ban's end or None for an unban).
type Written = Vec<(String, String, Option<i64>)>;

fn write_events_until(
    url: &str,
    n: u64,
    stop: &std::sync::atomic::AtomicBool,
    started: std::sync::mpsc::Sender<()>,
) -> Written {
    use std::sync::atomic::Ordering::Relaxed;
    let script = redis::Script::new(
        "if ARGV[1] == 'ban' then redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2]) \
         else redis.call('ZREM', KEYS[1], ARGV[2]) end \
         return redis.call('XADD', KEYS[2], '*', 'op', ARGV[1], 'addr', ARGV[2], 'until', ARGV[3])",
    );
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let until = now_ms() + 3_600_000;
    let mut out = Written::new();
    // Bounded: the read ends long before (a few hundred ms).
    for i in 0..50_000u64 {
        if stop.load(Relaxed) {
            break;
        }
        // A new address, an unban of an entry spread over the list's
        // pages (read already or not yet), or a ban of one again with a
        // later end, which moves it past the others (read twice, maybe).
        // Bans only at first: an unban the read did not follow is drift.
        let (op, member, end) = match if i < 300 { i % 2 * 2 } else { i % 3 } {
            0 => ("ban", format!("198.51.{}.{}", i / 768, (i / 3) % 256), Some(until)),
            1 => ("unban", member((i * 7919) % n), None),
            _ => ("ban", member((i * 7907) % n), Some(until + 3 * 3_600_000)),
        };
        let id: String = script
            .key("{fleetban}:bans")
            .key("{fleetban}:events")
            .arg(op)
            .arg(&member)
            .arg(end.unwrap_or(0))
            .invoke(&mut con)
            .unwrap();
        out.push((id, member, end));
        if i == 0 {
            let _ = started.send(());
        }
    }
    out
}

#[test]
fn a_full_read_follows_the_events_between_its_pages() {
    use fleetban::enforce::{Change, Until};
    use fleetban::fleet::StreamId;
    // Eight pages of 4,096.
    let n = 8 * 4096;
    let redis = Redis::start();
    preload(&redis, n, now_ms());
    let before: Vec<String> = redis
        .cli(&["ZRANGE", "{fleetban}:bans", "0", "-1", "WITHSCORES"])
        .lines()
        .map(str::to_owned)
        .collect();
    let mut expected: BTreeMap<ipnet::IpNet, Until> = before
        .chunks_exact(2)
        .map(|p| {
            (
                fleetban::addr::parse_member(&p[0]).unwrap(),
                Until::At(p[1].parse().unwrap()),
            )
        })
        .collect();
    assert_eq!(expected.len() as u64, n);

    let rt = common::runtime();
    let (mut fleet, mut rx) = fleet_sync(&rt, &redis);
    let (written, (last, entries, _)) = read_beside_writer(&rt, &redis, &mut fleet, n, false);

    // Each event the read followed came as a change before it returned:
    // the events written after its first id, up to the last it read.
    let mut sent = Vec::new();
    while let Ok(c) = rx.try_recv() {
        match c {
            Change::Add(elems) => sent.extend(elems.into_iter().map(|e| (e.net, Some(e.until)))),
            Change::Remove(nets) => sent.extend(nets.into_iter().map(|n| (n, None))),
            Change::Replace(_) => panic!("a snapshot sends no Replace itself"),
        }
    }
    assert!(!sent.is_empty(), "no event was followed during a read of 8 pages");
    let last = StreamId::parse(&last).unwrap();
    let upto: Vec<_> = written
        .iter()
        .filter(|(id, _, _)| StreamId::parse(id).unwrap() <= last)
        .map(|(_, m, end)| (fleetban::addr::parse_member(m).unwrap(), end.map(Until::At)))
        .collect();
    assert!(upto.len() >= sent.len());
    assert_eq!(sent, upto[upto.len() - sent.len()..], "the events followed, in order");

    // The list returned is the list as of its last event: every ban and
    // unban up to it applied, whatever page its entry was read in.
    for (net, end) in upto {
        match end {
            Some(u) => expected.insert(net, u),
            None => expected.remove(&net),
        };
    }
    let got: BTreeMap<ipnet::IpNet, Until> = entries.into_iter().map(|e| (e.net, e.until)).collect();
    let diff: Vec<_> = expected
        .iter()
        .filter(|(k, v)| got.get(k) != Some(v))
        .chain(got.iter().filter(|(k, _)| !expected.contains_key(k)))
        .take(5)
        .collect();
    let touched_after: Vec<_> = written
        .iter()
        .filter(|(id, _, _)| StreamId::parse(id).unwrap() > last)
        .filter(|(_, m, _)| diff.iter().any(|(k, _)| fleetban::addr::parse_member(m) == Some(**k)))
        .collect();
    assert!(
        diff.is_empty(),
        "{} entries, {} expected; first differences: {diff:?}; written after: {touched_after:?}",
        got.len(),
        expected.len()
    );
}

#[test]
fn a_drift_repair_beside_events_finds_only_what_changed_without_one() {
    use fleetban::enforce::{Change, Element, Until};
    use fleetban::fleet::StreamId;
    type List = BTreeMap<ipnet::IpNet, Until>;
    // Longer than the enforcer lists the kernel for (50,000): a repair
    // compares its pages as they come, while events change the list.
    let n = 14 * 4096;
    let redis = Redis::start();
    preload(&redis, n, now_ms());
    let rt = common::runtime();
    let (mut fleet, mut rx) = fleet_sync(&rt, &redis);
    // The start's read: the list as this host knows it.
    let (_, read, _) = rt.block_on(fleet.snapshot(false)).expect("the list is read");
    assert_eq!(read.len(), n as usize);
    let net = |m: &str| fleetban::addr::parse_member(m).unwrap();
    // The list in Redis and as this host knows it, followed by the test.
    let mut redis_list: List = read.into_iter().map(|e| (e.net, e.until)).collect();
    let mut known = redis_list.clone();
    let mut last_seen = StreamId::ZERO;
    let mut repair = |redis_list: &mut List, label: &str| {
        let (written, (last, _, drift)) = read_beside_writer(&rt, &redis, &mut fleet, n, true);
        let drift = drift.expect("a repair of a long list returns its drift");
        let last = StreamId::parse(&last).unwrap();
        // Redis as of the read's last event: every event up to it (those
        // the last read's writer wrote after it too).
        for (id, m, end) in &written {
            let id = StreamId::parse(id).unwrap();
            if id > last_seen && id <= last {
                match end {
                    Some(u) => redis_list.insert(net(m), Until::At(*u)),
                    None => redis_list.remove(&net(m)),
                };
            }
        }
        // The host: what it knew, with the events the read followed.
        let mut here = std::mem::replace(&mut known, redis_list.clone());
        let mut followed = 0;
        while let Ok(c) = rx.try_recv() {
            match c {
                Change::Add(elems) => elems.into_iter().for_each(|e| {
                    here.insert(e.net, e.until);
                    followed += 1;
                }),
                Change::Remove(nets) => nets.into_iter().for_each(|n| {
                    here.remove(&n);
                    followed += 1;
                }),
                Change::Replace(_) => panic!("a snapshot sends no Replace itself"),
            }
        }
        assert!(followed > 0, "{label}: no event was followed during the read");
        // The drift is what differs between the two, nothing else: not
        // the events the read followed, wherever their entries were read.
        let mut want_adds: Vec<Element> = redis_list
            .iter()
            .filter(|(n, u)| here.get(n) != Some(u))
            .map(|(&net, &until)| Element { net, until })
            .collect();
        let want_removes: Vec<ipnet::IpNet> = here.keys().filter(|n| !redis_list.contains_key(n)).copied().collect();
        let mut adds = drift.adds.clone();
        adds.sort_by_key(|e| e.net);
        want_adds.sort_by_key(|e| e.net);
        let mut removes = drift.removes.clone();
        removes.sort_unstable();
        assert_eq!(adds, want_adds, "{label}: {followed} events followed");
        assert_eq!(removes, want_removes, "{label}: {followed} events followed");
        // The bans known here and those the read found are counted alike
        // (an unban beside the read on neither side): the nets are sorted
        // only when a ban went missing.
        assert_eq!(drift.sorted, !want_removes.is_empty(), "{label}");
        last_seen = last;
        (want_adds, want_removes)
    };

    // Changes without an event: a member written by hand, another end
    // for one. The bans and unbans beside the read are events: no drift.
    let until = now_ms() + 5 * 3_600_000;
    redis.cli(&["ZADD", "{fleetban}:bans", &until.to_string(), "203.0.113.7"]);
    redis.cli(&["ZADD", "{fleetban}:bans", "XX", &(until + 1).to_string(), &member(1234)]);
    redis_list.insert(net("203.0.113.7"), Until::At(until));
    redis_list.insert(net(&member(1234)), Until::At(until + 1));
    let (adds, removes) = repair(&mut redis_list, "first repair");
    assert!(adds.iter().any(|e| e.net == net("203.0.113.7")), "{adds:?}");
    assert!(removes.is_empty(), "the writer begins with bans: {removes:?}");

    // A member deleted by hand: the removes name it.
    let gone = member(4321);
    redis.cli(&["ZREM", "{fleetban}:bans", &gone]);
    redis_list.remove(&net(&gone));
    let (_, removes) = repair(&mut redis_list, "second repair");
    assert!(removes.contains(&net(&gone)), "{removes:?}");
}
