//! Every algorithm's semantics, three ways: the Redis script against a
//! real redis-server, the in-memory store, and the brute-force model of
//! DESIGN §2. They must agree on every hit, for random sequences with equal
//! and out-of-order timestamps, replays of the same line, bursts and idle
//! gaps, and hits of clients already banned.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::model::{model, rule_limits, Algo, ModelHit, ModelRule};
use common::{connect, now_ms, runtime, Redis};
use fleetban::config::Algorithm;
use fleetban::detect::Hit;
use fleetban::limit::Batch;
use fleetban::limit::{MemoryLimiter, RedisLimiter, RuleLimit, Verdict};
use fleetban::store::{self, Keys};
use ipnet::IpNet;
use proptest::prelude::*;

fn check(rt: &tokio::runtime::Runtime, lim: &mut RedisLimiter, batches: &[Batch]) -> Vec<Verdict> {
    let mut out = Vec::new();
    rt.block_on(lim.check(batches, &mut out)).expect("redis check");
    out
}

fn key_net(k: &str) -> IpNet {
    format!("{k}/32").parse().unwrap()
}

/// Drives a limiter the way the daemon does: hits of banned clients are
/// skipped, a verdict over the limit bans until `at + ban_ms`. `batch` hits
/// of one (rule, key) in a row go in one call.
fn drive(
    hits: &[ModelHit],
    rules: &[ModelRule],
    batch_sizes: &[usize],
    check: impl FnMut(&[Batch]) -> Vec<Verdict>,
) -> Vec<(usize, String, i64)> {
    drive_with(hits, rules, batch_sizes, false, check)
}

/// As [`drive`]; with `resend`, after each batch the two batches before it
/// are sent again, the older one cut in two (a batch resent after a timeout,
/// lines read again after a crash and batched otherwise). What the resent
/// batches are told is ignored (a ban decided again is a no-op): a limiter
/// that counts each line once decides every other batch as without them.
fn drive_with(
    hits: &[ModelHit],
    rules: &[ModelRule],
    batch_sizes: &[usize],
    resend: bool,
    mut check: impl FnMut(&[Batch]) -> Vec<Verdict>,
) -> Vec<(usize, String, i64)> {
    let mut banned_until: HashMap<String, i64> = HashMap::new();
    let mut out = Vec::new();
    let mut sent: Vec<Batch> = Vec::new();
    let mut latest = i64::MIN;
    // When each line was logged: its first hit's time.
    let mut logged: HashMap<u64, i64> = HashMap::new();
    for h in hits {
        logged.entry(h.member).or_insert(h.time);
    }
    let mut i = 0;
    let mut round = 0;
    while i < hits.len() {
        // A run of consecutive hits of the same (rule, key), cut to the batch size.
        let size = batch_sizes[round % batch_sizes.len()].max(1);
        round += 1;
        let first = &hits[i];
        let mut idx = Vec::new();
        let mut j = i;
        while j < hits.len() && idx.len() < size && hits[j].rule == first.rule && hits[j].key == first.key {
            if banned_until.get(&hits[j].key).is_none_or(|&u| hits[j].time >= u) {
                idx.push(j);
            }
            j += 1;
        }
        // A batch stops at a ban: later hits of the run are judged against it.
        if !idx.is_empty() {
            let mut b = Batch {
                rule: first.rule,
                key: key_net(&first.key),
                hits: idx
                    .iter()
                    .map(|&k| Hit {
                        time_ms: hits[k].time,
                        member: hits[k].member,
                        origin: hits[k].origin,
                        offset: hits[k].offset,
                    })
                    .collect(),
            };
            if let Verdict::Over { index, .. } = check(std::slice::from_ref(&b))[0] {
                // What was judged; the hits after it are examined again below.
                b.hits.truncate(index + 1);
                let h = &hits[idx[index]];
                banned_until.insert(h.key.clone(), h.time + rules[h.rule].ban_ms);
                out.push((idx[index], h.key.clone(), h.time));
                // Hits of the run after the one that banned are re-examined
                // against the ban (they may fall after its end).
                j = idx[index] + 1;
            }
            if resend {
                latest = b.hits.iter().map(|h| h.time_ms).fold(latest, i64::max);
                if let [.., older, last] = &sent[..] {
                    // As the daemon reads lines again: at the time they were
                    // logged (not a repeat the sequence made at another
                    // time), recent ones only (older ones are stale), those
                    // of a client banned at their time skipped.
                    let again = |b: &Batch| -> Vec<Hit> {
                        let until = banned_until.get(&b.key.addr().to_string()).copied().unwrap_or(i64::MIN);
                        b.hits
                            .iter()
                            .filter(|h| {
                                logged.get(&h.member) == Some(&h.time_ms)
                                    && h.time_ms > latest - rules[b.rule].window / 2
                                    && h.time_ms >= until
                            })
                            .copied()
                            .collect()
                    };
                    let (older_again, last_again) = (again(older), again(last));
                    let (a, z) = older_again.split_at(older_again.len() / 2);
                    for (part, b) in [(a, older), (z, older), (&last_again[..], last)] {
                        if !part.is_empty() {
                            check(&[Batch {
                                hits: part.to_vec(),
                                ..b.clone()
                            }]);
                        }
                    }
                }
                sent.push(b);
            }
        }
        i = j;
    }
    out
}

fn model_bans(hits: &[ModelHit], rules: &[ModelRule]) -> Vec<(usize, String, i64)> {
    model(hits, rules).into_iter().map(|b| (b.hit, b.key, b.at)).collect()
}

/// Random hit sequences: few keys and rules, times that repeat, go back,
/// burst and jump; some members repeated (a line read twice).
fn sequences() -> impl Strategy<Value = (Vec<ModelHit>, Vec<ModelRule>, Vec<usize>)> {
    sequences_of(Family::Sliding)
}

/// Which algorithm the random rules use.
#[derive(Clone, Copy, Debug)]
enum Family {
    Sliding,
    Prefilter,
    Fixed,
    Bucket,
    Counter,
    /// `distinct:`, whose hits carry one of a few values as their member.
    Distinct,
}

const FAMILIES: [Family; 6] = [
    Family::Sliding,
    Family::Prefilter,
    Family::Fixed,
    Family::Bucket,
    Family::Counter,
    Family::Distinct,
];

fn sequences_of(family: Family) -> impl Strategy<Value = (Vec<ModelHit>, Vec<ModelRule>, Vec<usize>)> {
    sequences_with(family, true)
}

/// As [`sequences_of`]; `jumps`: the clock may go back an hour and a line
/// be dated an hour ahead. Lines read again across such a jump may count
/// again (DESIGN §2, "Time out of order"): the resend properties run
/// without.
fn sequences_with(family: Family, jumps: bool) -> impl Strategy<Value = (Vec<ModelHit>, Vec<ModelRule>, Vec<usize>)> {
    let rules = prop::collection::vec(
        (
            1usize..6,
            prop::sample::select(vec![30_000i64, 60_000, 90_000]),
            prop::sample::select(vec![1_000i64, 20_000, 600_000]),
            0.0f64..1.0,
            // Token intervals: 1 s .. 20 s, some not a whole number of ms.
            prop::sample::select(vec![1_000_000i64, 3_333_333, 7_500_000, 20_000_000]),
        ),
        1..3,
    )
    .prop_map(move |v| {
        v.into_iter()
            .map(|(limit, window, ban_ms, fraction, interval_us)| ModelRule {
                limit,
                window,
                ban_ms,
                algo: match family {
                    Family::Sliding => Algo::Sliding { prefilter: 0 },
                    Family::Prefilter => Algo::Sliding {
                        prefilter: RuleLimit::threshold(fraction, limit as u32) as usize,
                    },
                    Family::Fixed => Algo::Fixed,
                    Family::Bucket => Algo::Bucket { interval_us },
                    Family::Counter => Algo::Counter,
                    Family::Distinct => Algo::Distinct,
                },
            })
            .collect::<Vec<_>>()
    });
    (
        rules,
        prop::collection::vec(
            (
                0usize..3,
                0u8..3,
                -3i64..if jumps { 43 } else { 41 },
                any::<bool>(),
                0u64..3,
                // The value of a distinct rule's hit: few, so that they repeat.
                1u64..6,
            ),
            1..120,
        ),
        prop::collection::vec(1usize..8, 1..4),
    )
        .prop_map(move |(rules, steps, batches)| {
            let mut t = 1_700_000_000_000i64;
            let mut hits: Vec<ModelHit> = Vec::new();
            // Lines of three files (or hosts), each read in offset order.
            let mut ends = [0u64; 3];
            for (n, (key, rule, step, dup, origin, value)) in steps.into_iter().enumerate() {
                // Steps in seconds: negative = out of order; large = idle
                // gap; 41: the clock goes back an hour; 42: one line dated
                // an hour ahead (DESIGN §2, "Time out of order").
                let time = match step {
                    41 => {
                        t -= 3_600_000;
                        t
                    }
                    42 => t + 3_600_000,
                    36.. => {
                        t += 120_000;
                        t
                    }
                    _ => {
                        t += step * 1000;
                        t
                    }
                };
                let again = hits.last().filter(|_| dup).cloned();
                let (member, origin, offset) = match again {
                    Some(h) => (h.member, h.origin, h.offset),
                    None => {
                        ends[origin as usize] += 80 + n as u64;
                        let member = match family {
                            Family::Distinct => value,
                            _ => n as u64 + 1,
                        };
                        (member, origin, ends[origin as usize])
                    }
                };
                hits.push(ModelHit {
                    rule: (rule as usize) % rules.len(),
                    key: format!("192.0.2.{}", key + 1),
                    time,
                    member,
                    origin,
                    offset,
                });
            }
            (hits, rules, batches)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_agrees_with_model((hits, rules, batches) in sequences()) {
        memory_case(&hits, &rules, &batches)?;
    }

    #[test]
    fn memory_prefilter_agrees_with_model((hits, rules, batches) in sequences_of(Family::Prefilter)) {
        memory_case(&hits, &rules, &batches)?;
    }

    #[test]
    fn memory_fixed_window_agrees_with_model((hits, rules, batches) in sequences_of(Family::Fixed)) {
        memory_case(&hits, &rules, &batches)?;
    }

    #[test]
    fn memory_token_bucket_agrees_with_model((hits, rules, batches) in sequences_of(Family::Bucket)) {
        memory_case(&hits, &rules, &batches)?;
    }

    #[test]
    fn memory_sliding_counter_agrees_with_model((hits, rules, batches) in sequences_of(Family::Counter)) {
        memory_case(&hits, &rules, &batches)?;
    }

    #[test]
    fn memory_distinct_agrees_with_model((hits, rules, batches) in sequences_of(Family::Distinct)) {
        memory_case(&hits, &rules, &batches)?;
    }
}

fn memory_case(hits: &[ModelHit], rules: &[ModelRule], batches: &[usize]) -> Result<(), TestCaseError> {
    memory_case_with(hits, rules, batches, false)
}

fn memory_case_with(
    hits: &[ModelHit],
    rules: &[ModelRule],
    batches: &[usize],
    resend: bool,
) -> Result<(), TestCaseError> {
    let mut m = MemoryLimiter::new(rule_limits(rules));
    let wall = now_ms();
    let got = drive_with(hits, rules, batches, resend, |bs| {
        bs.iter().map(|b| m.check(b.rule, b.key, &b.hits, wall)).collect()
    });
    prop_assert_eq!(got, model_bans(hits, rules));
    Ok(())
}

/// The algorithms that count each line once whatever the batches it comes
/// in (the bucket and the counter only for a batch resent as it was).
const EXACTLY_ONCE: [Family; 4] = [Family::Sliding, Family::Prefilter, Family::Fixed, Family::Distinct];

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    // Batches sent again, whole or cut (`drive_with`), change no decision:
    // the model never sees them.

    #[test]
    fn memory_window_counts_lines_sent_again_once((hits, rules, batches) in sequences_with(Family::Sliding, false)) {
        memory_case_with(&hits, &rules, &batches, true)?;
    }

    #[test]
    fn memory_prefilter_counts_lines_sent_again_once((hits, rules, batches) in sequences_with(Family::Prefilter, false)) {
        memory_case_with(&hits, &rules, &batches, true)?;
    }

    #[test]
    fn memory_fixed_window_counts_lines_sent_again_once((hits, rules, batches) in sequences_with(Family::Fixed, false)) {
        memory_case_with(&hits, &rules, &batches, true)?;
    }

    #[test]
    fn memory_distinct_counts_lines_sent_again_once((hits, rules, batches) in sequences_with(Family::Distinct, false)) {
        memory_case_with(&hits, &rules, &batches, true)?;
    }
}

/// Random hit sequences of each of `families` through the scripts on a real
/// redis-server, the embedded store and the model: the three agree. With
/// `resend`, batches are sent again as [`drive_with`] does (the model never
/// sees them). Each case in its own key prefix (`prefix` + its number).
fn redis_agrees_with_model_and_memory(families: &[Family], cases: u32, prefix: &str, resend: bool) {
    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("fbtest", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let case = std::sync::atomic::AtomicU32::new(0);
    for &family in families {
        eprintln!("{family:?}");
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases,
            ..ProptestConfig::default()
        });
        runner
            .run(&sequences_with(family, !resend), |(hits, rules, batches)| {
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // No state shared between cases.
                let keys = Keys::new(&format!("{prefix}{n}"));
                let mut lim = RedisLimiter::new(con.clone(), keys, "h1", rule_limits(&rules));
                let got = drive_with(&hits, &rules, &batches, resend, |bs| check(&rt, &mut lim, bs));
                prop_assert_eq!(&got, &model_bans(&hits, &rules), "{:?}", family);
                let mut m = MemoryLimiter::new(rule_limits(&rules));
                let wall = now_ms();
                let mem = drive_with(&hits, &rules, &batches, resend, |bs| {
                    bs.iter().map(|b| m.check(b.rule, b.key, &b.hits, wall)).collect()
                });
                prop_assert_eq!(got, mem);
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn redis_script_agrees_with_model_and_memory() {
    redis_agrees_with_model_and_memory(&FAMILIES, 100, "fbtest", false);
}

/// As `memory_counts_lines_sent_again_once`, on the scripts: Redis, the
/// embedded store and the model (which never sees the resent batches) agree.
#[test]
fn redis_counts_lines_sent_again_once() {
    redis_agrees_with_model_and_memory(&EXACTLY_ONCE, 60, "again", true);
}

#[test]
fn redis_window_is_the_seeds_zset_with_pexpire() {
    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("fleetban", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let rules = vec![ModelRule {
        limit: 3,
        window: 60_000,
        ban_ms: 1000,
        algo: Algo::Sliding { prefilter: 0 },
    }];
    let mut lim = RedisLimiter::new(con, Keys::new("fleetban"), "h1", rule_limits(&rules));
    let key: IpNet = "203.0.113.7/32".parse().unwrap();
    // Three hits in the same millisecond: three members (no overwrite).
    let b = Batch {
        rule: 0,
        key,
        hits: (1..=3).map(|m| line(1_000_000, m)).collect(),
    };
    assert_eq!(
        check(&rt, &mut lim, std::slice::from_ref(&b)),
        vec![Verdict::Under { count: 3 }]
    );
    let zkey = &Keys::new("fleetban").window(&"203.0.113.7/32".parse().unwrap(), "r0", None);
    assert_eq!(redis.cli(&["ZCARD", zkey]), "3");
    let ttl: i64 = redis.cli(&["PTTL", zkey]).parse().unwrap();
    assert!(ttl > 59_000 && ttl <= 61_000, "PEXPIRE window+1000, got {ttl}");
    // The same lines again (a restart re-reading them): not counted twice, no ban.
    assert_eq!(
        check(&rt, &mut lim, std::slice::from_ref(&b)),
        vec![Verdict::Under { count: 3 }]
    );
    // The fourth distinct hit is over: `>=` test.
    let b4 = Batch {
        rule: 0,
        key,
        hits: vec![line(1_000_500, 4)],
    };
    assert_eq!(
        check(&rt, &mut lim, std::slice::from_ref(&b4)),
        vec![Verdict::Over { index: 0, count: 3 }]
    );
    // 60 s after the first three, they have left the window (score <= now - window).
    let later = Batch {
        rule: 0,
        key,
        hits: vec![line(1_060_000, 5)],
    };
    assert_eq!(check(&rt, &mut lim, &[later]), vec![Verdict::Under { count: 1 }]);

    // NOSCRIPT after SCRIPT FLUSH is recovered inside the pipeline.
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]), "OK");
    let other = Batch {
        rule: 0,
        key: "203.0.113.8/32".parse().unwrap(),
        hits: vec![line(1_000_000, 1)],
    };
    let many = vec![
        other.clone(),
        Batch {
            key: "203.0.113.9/32".parse().unwrap(),
            ..other
        },
    ];
    assert_eq!(
        check(&rt, &mut lim, &many),
        vec![Verdict::Under { count: 1 }, Verdict::Under { count: 1 }]
    );
}

#[test]
fn a_large_flush_is_split_into_bounded_round_trips() {
    let redis = Redis::start();
    let rt = runtime();
    let cfg = redis.config("fleetban", Duration::from_millis(250));
    let con = connect(&rt, &cfg, cfg.timeout);
    let rules = vec![ModelRule {
        limit: 2,
        window: 60_000,
        ban_ms: 1000,
        algo: Algo::Sliding { prefilter: 0 },
    }];
    let mut lim = RedisLimiter::new(con, Keys::new("fleetban"), "h1", rule_limits(&rules));
    // 5,000 clients with 3 hits each: every one goes over on its third hit.
    let batches: Vec<Batch> = (0..5000u32)
        .map(|i| Batch {
            rule: 0,
            key: IpNet::from(std::net::IpAddr::from((0x0a00_0000u32 + i).to_be_bytes())),
            hits: (0..3)
                .map(|k| line(1_000_000 + k, u64::from(i) * 10 + k as u64))
                .collect(),
        })
        .collect();
    let verdicts = check(&rt, &mut lim, &batches);
    assert_eq!(verdicts.len(), 5000);
    assert!(verdicts.iter().all(|v| *v == Verdict::Over { index: 2, count: 2 }));
    let trips = lim.round_trips;
    assert!(
        trips >= 5000 / fleetban::limit::MAX_CALLS_PER_TRIP as u64,
        "{trips} round trips"
    );
    assert!(
        trips <= 2 * (15_000 / fleetban::limit::MAX_HITS_PER_TRIP as u64 + 5),
        "{trips} round trips"
    );
}

fn redis_limiter(redis: &Redis, rt: &tokio::runtime::Runtime, prefix: &str, rules: Vec<RuleLimit>) -> RedisLimiter {
    let con = connect(
        rt,
        &redis.config(prefix, Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    RedisLimiter::new(con, Keys::new(prefix), "h1", rules)
}

fn batch(key: &str, hits: impl IntoIterator<Item = (i64, u64)>) -> Batch {
    Batch {
        rule: 0,
        key: key_net(key),
        hits: hits
            .into_iter()
            .map(|(time_ms, member)| line(time_ms, member))
            .collect(),
    }
}

/// The hit of a line of one file: `member` is also its offset there.
fn line(time_ms: i64, member: u64) -> Hit {
    Hit {
        time_ms,
        member,
        origin: 1,
        offset: member,
    }
}

/// The seeds' warning about fixed windows, on the real scripts: 100 hits just
/// before a window boundary and 100 just after are 200 hits within 2 s, and
/// the fixed window allows every one; the sliding window refuses the 101st.
#[test]
fn fixed_window_allows_twice_the_limit_across_a_boundary_and_sliding_window_refuses() {
    let redis = Redis::start();
    let rt = runtime();
    let boundary = 1_700_000_040_000i64; // a multiple of 60 s
    assert_eq!(boundary % 60_000, 0);
    let hits: Vec<(i64, u64)> = (0..100)
        .map(|k| (boundary - 1000 + k, k as u64 + 1))
        .chain((0..100).map(|k| (boundary + k, k as u64 + 101)))
        .collect();
    for (algo, expect) in [
        (Algorithm::FixedWindow, Verdict::Under { count: 100 }),
        (Algorithm::SlidingWindow, Verdict::Over { index: 100, count: 100 }),
    ] {
        let rules = vec![RuleLimit::new("r0", algo, 100, 60_000)];
        let mut lim = redis_limiter(&redis, &rt, algo.name(), rules.clone());
        // One batch, then the same hits one call each: batching changes nothing.
        assert_eq!(
            check(&rt, &mut lim, &[batch("192.0.2.1", hits.clone())]),
            vec![expect],
            "{algo:?}"
        );
        let mut one_by_one = None;
        for (i, h) in hits.iter().enumerate() {
            if let Verdict::Over { count, .. } = check(&rt, &mut lim, &[batch("192.0.2.2", [*h])])[0] {
                one_by_one = Some((i, count));
                break;
            }
        }
        let mut m = MemoryLimiter::new(rules);
        let mem = m.check(
            0,
            key_net("192.0.2.1"),
            &batch("192.0.2.1", hits.clone()).hits,
            now_ms(),
        );
        assert_eq!(mem, expect, "{algo:?} in memory");
        match expect {
            Verdict::Over { index, count } => assert_eq!(one_by_one, Some((index, count))),
            Verdict::Under { .. } => assert_eq!(one_by_one, None),
        }
    }
    // The fixed window's counters: one per window number, with their expiry.
    let n = boundary / 60_000;
    let fixed = Keys::new("fixed_window").fixed(&"192.0.2.1/32".parse().unwrap(), "r0", None);
    assert_eq!(redis.cli(&["HGET", &format!("{fixed}:{}", n - 1), "c"]), "100");
    assert_eq!(redis.cli(&["HGET", &format!("{fixed}:{n}"), "c"]), "100");
    let ttl: i64 = redis.cli(&["PTTL", &format!("{fixed}:{n}")]).parse().unwrap();
    assert!(ttl > 59_000 && ttl <= 61_000, "{ttl}");
}

/// A batch sent again (a timeout after Redis applied it, a re-read after a
/// crash) is not counted twice by any algorithm: the window by its members,
/// the fixed window and the prefilter by the offset they last counted from
/// the line's file, the bucket and the counter by skipping up to the member
/// of the last hit counted.
#[test]
fn a_batch_sent_again_is_not_counted_twice() {
    let redis = Redis::start();
    let rt = runtime();
    let t = 1_700_000_000_000i64;
    let first: Vec<(i64, u64)> = (0..4).map(|k| (t + k, k as u64 + 1)).collect();
    for rules in [
        vec![RuleLimit::new("r0", Algorithm::SlidingWindow, 5, 60_000)],
        vec![RuleLimit {
            prefilter: 4,
            ..RuleLimit::new("r0", Algorithm::SlidingWindow, 5, 60_000)
        }],
        vec![RuleLimit::new("r0", Algorithm::FixedWindow, 5, 60_000)],
        vec![RuleLimit::bucket("r0", 5, 60_000_000)],
        vec![RuleLimit::new("r0", Algorithm::SlidingCounter, 5, 60_000)],
    ] {
        let (algo, pre) = (rules[0].algorithm, rules[0].prefilter);
        let mut lim = redis_limiter(&redis, &rt, &format!("again{}{pre}", algo.name()), rules.clone());
        let mut m = MemoryLimiter::new(rules);
        let wall = now_ms();
        let mut both = |b: Batch| {
            let r = check(&rt, &mut lim, std::slice::from_ref(&b))[0];
            assert_eq!(m.check(0, b.key, &b.hits, wall), r, "{algo:?}: memory and Redis differ");
            r
        };
        assert!(matches!(both(batch("192.0.2.1", first.clone())), Verdict::Under { .. }));
        // Sent again, then again with one new hit at its end.
        let again = both(batch("192.0.2.1", first.clone()));
        let mut more = first.clone();
        more.push((t + 10, 5));
        let fifth = both(batch("192.0.2.1", more));
        assert!(matches!(again, Verdict::Under { .. }), "{algo:?}: {again:?}");
        assert!(matches!(fifth, Verdict::Under { .. }), "{algo:?}: {fifth:?}");
        // The sixth distinct hit is over the limit of 5.
        let sixth = both(batch("192.0.2.1", [(t + 11, 6)]));
        assert!(matches!(sixth, Verdict::Over { index: 0, .. }), "{algo:?}: {sixth:?}");
    }
}

/// Lines read again after a crash come batched otherwise than the first
/// time: here the first two of four lines alone. The window, the fixed
/// window and the prefilter recognise them (members; offsets per file);
/// the bucket and the counter only know the member of the last hit they
/// counted, not in that batch, and count the two again (docs/design.md §2).
#[test]
fn lines_read_again_in_another_batch_count_once_but_in_bucket_and_counter() {
    let redis = Redis::start();
    let rt = runtime();
    let t = 1_700_000_000_000i64;
    let first: Vec<(i64, u64)> = (0..4).map(|k| (t + k, k as u64 + 1)).collect();
    for (rules, recounts) in [
        (vec![RuleLimit::new("r0", Algorithm::SlidingWindow, 5, 60_000)], false),
        (
            vec![RuleLimit {
                prefilter: 4,
                ..RuleLimit::new("r0", Algorithm::SlidingWindow, 5, 60_000)
            }],
            false,
        ),
        (vec![RuleLimit::new("r0", Algorithm::FixedWindow, 5, 60_000)], false),
        (vec![RuleLimit::bucket("r0", 5, 60_000_000)], true),
        (vec![RuleLimit::new("r0", Algorithm::SlidingCounter, 5, 60_000)], true),
    ] {
        let (algo, pre) = (rules[0].algorithm, rules[0].prefilter);
        let mut lim = redis_limiter(&redis, &rt, &format!("split{}{pre}", algo.name()), rules.clone());
        let mut m = MemoryLimiter::new(rules);
        let wall = now_ms();
        let mut both = |b: Batch| {
            let r = check(&rt, &mut lim, std::slice::from_ref(&b))[0];
            assert_eq!(m.check(0, b.key, &b.hits, wall), r, "{algo:?}: memory and Redis differ");
            r
        };
        assert!(matches!(both(batch("192.0.2.1", first.clone())), Verdict::Under { .. }));
        both(batch("192.0.2.1", first[..2].to_vec()));
        // A fifth line fits a limit of 5 only if the first two counted once.
        let fifth = both(batch("192.0.2.1", [(t + 10, 5)]));
        if recounts {
            assert!(matches!(fifth, Verdict::Over { .. }), "{algo:?}: {fifth:?}");
        } else {
            assert!(matches!(fifth, Verdict::Under { .. }), "{algo:?}: {fifth:?}");
        }
    }
}

/// Several files and hosts feed one fixed window: each origin's marks are
/// its own. Lines of a second file with lower offsets than the first's
/// count; re-sent lines of either do not; the HASH holds the count and one
/// offset per origin, with the counter's expiry.
#[test]
fn fixed_window_marks_are_per_origin() {
    let redis = Redis::start();
    let rt = runtime();
    let rules = vec![RuleLimit::new("r0", Algorithm::FixedWindow, 10, 60_000)];
    let mut lim = redis_limiter(&redis, &rt, "origins", rules.clone());
    let mut m = MemoryLimiter::new(rules);
    let t = 1_700_000_040_000i64; // a window boundary
    let hit = |origin: u64, offset: u64, dt: i64| Hit {
        time_ms: t + dt,
        member: origin << 32 | offset,
        origin,
        offset,
    };
    let key = key_net("192.0.2.1");
    let wall = now_ms();
    let mut both = |hits: Vec<Hit>| {
        let b = Batch { rule: 0, key, hits };
        let r = check(&rt, &mut lim, std::slice::from_ref(&b))[0];
        assert_eq!(m.check(0, key, &b.hits, wall), r, "memory and Redis differ");
        r
    };
    assert_eq!(
        both(vec![hit(7, 5000, 0), hit(7, 5100, 1), hit(9, 40, 2)]),
        Verdict::Under { count: 3 }
    );
    // File 9 behind file 7's offsets, and both sent again: 9's new line only.
    assert_eq!(
        both(vec![hit(9, 40, 2), hit(7, 5100, 1), hit(9, 90, 3), hit(7, 5000, 0)]),
        Verdict::Under { count: 4 }
    );
    let base = format!(
        "{}:{}",
        Keys::new("origins").fixed(&"192.0.2.1/32".parse().unwrap(), "r0", None),
        t / 60_000
    );
    assert_eq!(redis.cli(&["HGET", &base, "c"]), "4");
    assert_eq!(redis.cli(&["HGET", &base, "7"]), "5100");
    assert_eq!(redis.cli(&["HGET", &base, "9"]), "90");
    assert_eq!(redis.cli(&["HLEN", &base]), "3");
    let ttl: i64 = redis.cli(&["PTTL", &base]).parse().unwrap();
    assert!(ttl > 59_000 && ttl <= 61_000, "{ttl}");
}

/// In-order hits of one client, no line read twice.
fn in_order() -> impl Strategy<Value = (Vec<ModelHit>, usize, usize)> {
    (
        1usize..30,
        0.05f64..1.0,
        prop::collection::vec(
            prop_oneof![3 => 0i64..2_000, 1 => 2_000i64..40_000, 1 => Just(130_000i64)],
            1..200,
        ),
    )
        .prop_map(|(limit, fraction, steps)| {
            let mut t = 1_700_000_000_000i64;
            let hits = steps
                .into_iter()
                .enumerate()
                .map(|(n, s)| {
                    t += s;
                    ModelHit {
                        rule: 0,
                        key: "192.0.2.1".into(),
                        time: t,
                        member: n as u64 + 1,
                        origin: 0,
                        offset: n as u64 + 1,
                    }
                })
                .collect();
            (hits, limit, RuleLimit::threshold(fraction, limit as u32) as usize)
        })
}

/// Hits a client got counted (not banned; bans last `ban_ms`) at most, over
/// any span of `window`.
fn most_in_a_window(hits: &[ModelHit], bans: &[(usize, String, i64)], ban_ms: i64, window: i64) -> usize {
    let banned: Vec<i64> = bans.iter().map(|b| b.2).collect();
    let allowed: Vec<i64> = hits
        .iter()
        .enumerate()
        .filter(|(i, h)| {
            !bans.iter().any(|b| b.0 == *i) && !banned.iter().any(|&at| h.time >= at && h.time < at + ban_ms)
        })
        .map(|(_, h)| h.time)
        .collect();
    allowed
        .iter()
        .map(|&start| allowed.iter().filter(|&&t| t >= start && t < start + window).count())
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// What `prefilter` guarantees against the plain sliding window, for
    /// hits in time order without re-read lines: it never bans earlier
    /// (its count is a lower bound of the exact one), and it never lets more
    /// than limit + P hits into one window (P = floor(prefilter x limit)).
    #[test]
    fn prefilter_bans_no_earlier_than_the_window_and_bounds_its_excess((hits, limit, pre) in in_order()) {
        let window = 60_000;
        let ban_ms = 1_000;
        let plain = [ModelRule { limit, window, ban_ms, algo: Algo::Sliding { prefilter: 0 } }];
        let two_tier = [ModelRule { limit, window, ban_ms, algo: Algo::Sliding { prefilter: pre } }];
        let mut m = MemoryLimiter::new(rule_limits(&two_tier));
        let wall = now_ms();
        let got = drive(&hits, &two_tier, &[1, 7], |bs| bs.iter().map(|b| m.check(b.rule, b.key, &b.hits, wall)).collect());
        prop_assert_eq!(&got, &model_bans(&hits, &two_tier));
        let exact = model_bans(&hits, &plain);
        if let Some(first) = got.first() {
            prop_assert!(exact.first().is_some_and(|e| e.0 <= first.0), "prefilter banned at {} before the window: {:?}", first.0, exact);
        }
        prop_assert!(most_in_a_window(&hits, &got, ban_ms, window) <= limit + pre);
        prop_assert!(most_in_a_window(&hits, &exact, ban_ms, window) <= limit);
    }

    /// The sliding counter's error bound, for hits in time order: when it
    /// counts a hit at fraction f of its fixed window, the window ending there
    /// holds fewer than limit x (1 + f) + 1 counted hits: close to the limit
    /// early in a window, never 2 x limit + 1 (a fixed window reaches 2 x limit
    /// anywhere in its window).
    #[test]
    fn sliding_counter_error_is_bounded((hits, limit, _pre) in in_order()) {
        let window = 60_000i64;
        let rules = [ModelRule { limit, window, ban_ms: 1_000, algo: Algo::Counter }];
        let bans = model_bans(&hits, &rules);
        let counted: Vec<i64> = hits
            .iter()
            .enumerate()
            .filter(|(i, h)| !bans.iter().any(|b| b.0 == *i || (h.time >= b.2 && h.time < b.2 + 1_000)))
            .map(|(_, h)| h.time)
            .collect();
        for &now in &counted {
            let f = now.rem_euclid(window) as f64 / window as f64;
            let n = counted.iter().filter(|&&t| t > now - window && t <= now).count();
            prop_assert!((n as f64) < limit as f64 * (1.0 + f) + 1.0, "{} hits at f = {}", n, f);
        }
        prop_assert!(most_in_a_window(&hits, &bans, 1_000, window) <= 2 * limit);
    }
}

/// The daemon reads `zset-max-listpack-entries` at start; a server that
/// forbids CONFIG (here: an ACL user without it) gives None, not an error.
#[test]
fn the_listpack_threshold_is_read_and_a_forbidden_config_is_tolerated() {
    let redis = Redis::start();
    let rt = runtime();
    assert_eq!(redis.cli(&["CONFIG", "SET", "zset-max-listpack-entries", "64"]), "OK");
    assert_eq!(
        redis.cli(&["ACL", "SETUSER", "limited", "on", ">secret", "+@all", "-config", "~*"]),
        "OK"
    );
    let connect_as = |url: String| {
        let mut cfg = redis.config("t", Duration::from_secs(2));
        cfg.url = url;
        connect(&rt, &cfg, Duration::from_secs(5))
    };
    let mut admin = connect_as(redis.url());
    assert_eq!(rt.block_on(store::listpack_threshold(&mut admin)), Some(64));
    let mut limited = connect_as(format!("{}?user=limited&pass=secret", redis.url()));
    assert_eq!(rt.block_on(store::listpack_threshold(&mut limited)), None);
    // The limited user can still run the limiter.
    let mut lim = RedisLimiter::new(
        limited,
        Keys::new("t"),
        "h1",
        vec![RuleLimit::new("r0", Algorithm::SlidingWindow, 2, 60_000)],
    );
    let v = check(
        &rt,
        &mut lim,
        &[batch("192.0.2.1", [(1_000_000, 1), (1_000_001, 2), (1_000_002, 3)])],
    );
    assert_eq!(v, vec![Verdict::Over { index: 2, count: 2 }]);
}

/// `clock: redis`: every algorithm takes `now` from the server (one TIME per
/// call) and the embedded store from the wall clock; hits whose log times
/// are hours apart still fall together.
#[test]
fn every_algorithm_takes_the_server_clock_when_asked() {
    let redis = Redis::start();
    let rt = runtime();
    let hours: Vec<(i64, u64)> = (0..4)
        .map(|k| (1_600_000_000_000 + k * 3_600_000, k as u64 + 1))
        .collect();
    for (n, rule) in [
        RuleLimit::new("r0", Algorithm::SlidingWindow, 3, 60_000),
        RuleLimit {
            prefilter: 1,
            ..RuleLimit::new("r0", Algorithm::SlidingWindow, 3, 60_000)
        },
        RuleLimit::new("r0", Algorithm::FixedWindow, 3, 60_000),
        RuleLimit::bucket("r0", 3, 60_000_000),
        RuleLimit::new("r0", Algorithm::SlidingCounter, 3, 60_000),
    ]
    .into_iter()
    .enumerate()
    {
        let algo = rule.algorithm;
        let log = vec![rule.clone()];
        let server = vec![RuleLimit {
            clock: fleetban::config::Clock::Redis,
            ..rule
        }];
        let mut by_log = redis_limiter(&redis, &rt, &format!("log{n}"), log.clone());
        let mut by_server = redis_limiter(&redis, &rt, &format!("srv{n}"), server.clone());
        let b = batch("192.0.2.1", hours.clone());
        let v = check(&rt, &mut by_log, std::slice::from_ref(&b));
        assert!(matches!(v[0], Verdict::Under { .. }), "{algo:?} log: {v:?}");
        let v = check(&rt, &mut by_server, std::slice::from_ref(&b));
        assert!(matches!(v[0], Verdict::Over { index: 3, .. }), "{algo:?} server: {v:?}");
        let mut m = MemoryLimiter::new(server);
        assert_eq!(m.check(0, b.key, &b.hits, now_ms()), v[0], "{algo:?} memory");
    }
}

/// Time out of order (DESIGN §2): no algorithm judges a hit on hits dated
/// after it. Three lines dated an hour ahead do not make a client's next
/// requests, each more than a window apart, go over a limit of 3 per 5 s;
/// and a log whose clock goes back an hour (its lines repeat the last
/// hour's times) does not ban a client making 2 requests a minute under
/// limits of 3 a minute. Hit by hit, in the scripts on a real redis-server
/// and in the embedded store, whose wall clock follows the log as in
/// `fleetban test`. Fixed windows (and the prefilter's) count per window
/// number and expire in Redis's time: the hour the log returns to has
/// expired in `run` (an hour passed), not in this test's second, so they
/// go back in the embedded store only.
#[test]
fn no_algorithm_judges_a_hit_on_hits_dated_after_it() {
    let redis = Redis::start();
    let rt = runtime();
    let t0 = 1_700_000_000_000i64;
    // Three lines an hour ahead, then ten requests 6 s apart.
    let ahead: Vec<(i64, u64)> = (0..3)
        .map(|k| (t0 + 3_600_000 + k, k as u64 + 1))
        .chain((0..10).map(|k| (t0 + k * 6_000, k as u64 + 10)))
        .collect();
    // 2 requests a minute for an hour, then the clock goes back an hour.
    let back: Vec<(i64, u64)> = (0..120)
        .map(|k| t0 + k * 30_000)
        .chain((0..120).map(|k| t0 + k * 30_000 + 7))
        .enumerate()
        .map(|(i, t)| (t, i as u64 + 1))
        .collect();
    let mut n = 0;
    for (case, hits, limit, window, interval_us) in [
        ("ahead", ahead, 3, 5_000, 2_000_000),
        ("back", back, 30, 600_000, 20_000_000),
    ] {
        for rule in [
            RuleLimit::new("r0", Algorithm::SlidingWindow, limit, window),
            RuleLimit {
                prefilter: limit / 2,
                ..RuleLimit::new("r0", Algorithm::SlidingWindow, limit, window)
            },
            RuleLimit::new("r0", Algorithm::FixedWindow, limit, window),
            RuleLimit::bucket("r0", limit, interval_us),
            RuleLimit::new("r0", Algorithm::SlidingCounter, limit, window),
        ] {
            n += 1;
            let what = format!("{case}, {:?} prefilter {}", rule.algorithm, rule.prefilter);
            let per_window_number = rule.algorithm == Algorithm::FixedWindow || rule.prefilter > 0;
            let mut lim = (case == "ahead" || !per_window_number)
                .then(|| redis_limiter(&redis, &rt, &format!("ooo{n}"), vec![rule.clone()]));
            let mut mem = MemoryLimiter::new(vec![rule]);
            let mut clock = i64::MIN;
            for (i, &(t, m)) in hits.iter().enumerate() {
                let b = batch("192.0.2.1", [(t, m)]);
                if let Some(lim) = lim.as_mut() {
                    let v = check(&rt, lim, std::slice::from_ref(&b));
                    assert!(
                        matches!(v[0], Verdict::Under { .. }),
                        "{what}: Redis, hit {i} at {t}: {v:?}"
                    );
                }
                clock = clock.max(t);
                let v = mem.check(0, b.key, &b.hits, clock);
                assert!(
                    matches!(v, Verdict::Under { .. }),
                    "{what}: memory, hit {i} at {t}: {v:?}"
                );
            }
        }
    }
}

/// The benchmark baseline (`run --bench-one-call-per-hit`: one unpipelined
/// EVALSHA per hit) decides exactly as the pipelined batches, for every
/// algorithm, and makes one round trip per hit sent (a batch stops at its
/// first hit over the limit).
#[test]
fn one_call_per_hit_baseline_decides_as_the_pipelined_batches() {
    let redis = Redis::start();
    let rt = runtime();
    for (n, algorithm) in [
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingCounter,
    ]
    .into_iter()
    .enumerate()
    {
        let rule = match algorithm {
            Algorithm::TokenBucket => RuleLimit::bucket("r", 3, 10_000_000),
            a => RuleLimit::new("r", a, 3, 10_000),
        };
        let mut piped = redis_limiter(&redis, &rt, &format!("p{n}"), vec![rule.clone()]);
        let mut one = redis_limiter(&redis, &rt, &format!("o{n}"), vec![rule]);
        one.one_call_per_hit = true;
        let t0 = 1_700_000_000_000_i64;
        let flushes: Vec<Vec<Batch>> = (0..4u32)
            .map(|f| {
                (0..3u32)
                    .map(|k| {
                        let hits = (0..1 + (k + f) % 4).map(|i| {
                            let t = t0 + i64::from(f) * 4_000 + i64::from(i) * 700 + i64::from(k) * 300;
                            (t, u64::from(f * 100 + k * 10 + i))
                        });
                        batch(&format!("192.0.2.{k}"), hits)
                    })
                    .collect()
            })
            .collect();
        let (mut sent, mut overs) = (0, 0);
        for batches in &flushes {
            let p = check(&rt, &mut piped, batches);
            let o = check(&rt, &mut one, batches);
            assert_eq!(p, o, "{algorithm:?}");
            for (b, v) in batches.iter().zip(&o) {
                sent += match v {
                    Verdict::Over { index, .. } => {
                        overs += 1;
                        index + 1
                    }
                    Verdict::Under { .. } => b.hits.len(),
                } as u64;
            }
        }
        // Comparing verdicts proves little unless some went over the limit.
        assert!(overs > 0, "{algorithm:?}: the sequence never went over the limit");
        assert_eq!(one.round_trips, sent, "{algorithm:?}");
        assert!(piped.round_trips <= 4 + 1, "{algorithm:?}");
    }
}

/// Flushes the way the daemon sends them: many (rule, address) batches at
/// once, several rules interleaved, more addresses than one script call
/// carries ([`fleetban::limit::MAX_GROUPS_PER_CALL`]), some batches sent
/// again. The Redis scripts decide each group as if it were alone: every
/// verdict, counts included, equals the memory store's, flush after flush,
/// for every algorithm.
#[test]
fn many_addresses_in_one_script_call_decide_as_one_call_each() {
    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("fleetban", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let groups = fleetban::limit::MAX_GROUPS_PER_CALL;
    let case = std::sync::atomic::AtomicU32::new(0);
    for family in FAMILIES {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 16,
            ..ProptestConfig::default()
        });
        // Flushes of (rule, address index, hits as (second step, member)).
        let flushes = prop::collection::vec(
            prop::collection::vec(
                (
                    0usize..2,
                    0usize..3 * groups,
                    prop::collection::vec(
                        // Steps in ms: equal times, close, and wider than a window.
                        (prop::sample::select(vec![0i64, 100, 900, 5_000, 40_000]), 0u64..6),
                        1..6,
                    ),
                ),
                1..4 * groups,
            ),
            1..5,
        );
        runner
            .run(&(sequences_of(family), flushes), |((_, rules, _), flushes)| {
                let rules: Vec<ModelRule> = (0..2).map(|i| rules[i % rules.len()]).collect();
                let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut lim = RedisLimiter::new(con.clone(), Keys::new(&format!("many{n}")), "h1", rule_limits(&rules));
                let mut mem = MemoryLimiter::new(rule_limits(&rules));
                let t0 = now_ms() - 30_000;
                let mut previous: Vec<Batch> = Vec::new();
                for (f, flush) in flushes.iter().enumerate() {
                    // One batch per (rule, address) in a flush, as `Pending` makes them.
                    let mut batches: Vec<Batch> = Vec::new();
                    for (rule, addr, hits) in flush {
                        let key: IpNet = format!("10.9.{}.{}/32", addr / 250, addr % 250).parse().unwrap();
                        if batches.iter().any(|b| b.rule == *rule && b.key == key) {
                            continue;
                        }
                        let mut t = t0 + f as i64 * 20_000;
                        let hits = hits
                            .iter()
                            .map(|&(step, m)| {
                                t += step;
                                line(t, (f as u64) << 32 | (*addr as u64) << 8 | m)
                            })
                            .collect();
                        batches.push(Batch { rule: *rule, key, hits });
                    }
                    // A few batches of the previous flush again: lines read twice.
                    for b in previous.iter().take(3) {
                        if !batches.iter().any(|x| x.rule == b.rule && x.key == b.key) {
                            batches.push(b.clone());
                        }
                    }
                    let got = check(&rt, &mut lim, &batches);
                    let want: Vec<Verdict> = batches
                        .iter()
                        .map(|b| mem.check(b.rule, b.key, &b.hits, now_ms()))
                        .collect();
                    prop_assert_eq!(got, want, "flush {} of {} batches", f, batches.len());
                    previous = batches;
                }
                Ok(())
            })
            .unwrap();
    }
}
