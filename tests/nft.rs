//! The nftables enforcer against a real kernel.
//!
//! Every test makes its own network namespace (the harness's [`NetNs`],
//! deleted on drop, also on panic) and runs nft inside it through the
//! enforcer's argv prefix, so the host's ruleset is never touched. Needs
//! root, `ip` and `nft`; without them the tests fail, saying what is missing.

mod common;

use std::net::IpAddr;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{nft_bans_detailed, now_ms, NetNs, NftElem};
use fleetban::enforce::{Action, Element, EnforceError, Enforcer, NftOptions, Until};
use ipnet::IpNet;
use serde_json::Value;

const HOUR: i64 = 3_600_000;
/// The enforcer's table (its default).
const TABLE: &str = "fleetban";

/// A namespace of its own in which nft runs.
fn netns() -> NetNs {
    let ns = NetNs::new("nft");
    ns.run(&["nft", "list", "ruleset"]);
    ns
}

/// The enforcer's options for nft inside `ns`: the argv prefix
/// `ip netns exec NAME nft`.
fn nft_opts(ns: &NetNs) -> NftOptions {
    NftOptions {
        command: ["ip", "netns", "exec", &ns.name, "nft"].map(String::from).to_vec(),
        ..NftOptions::default()
    }
}

fn enforcer(ns: &NetNs) -> Enforcer {
    Enforcer::nft(nft_opts(ns)).unwrap()
}

/// A fresh namespace and an enforcer in it, initialised at `now`.
async fn initialised() -> (NetNs, Enforcer, i64) {
    let ns = netns();
    let now = now_ms();
    let mut e = enforcer(&ns);
    e.init(now).await.unwrap();
    (ns, e, now)
}

fn nft_json(ns: &NetNs, args: &[&str]) -> Value {
    let argv: Vec<&str> = ["nft", "-j"].iter().chain(args).copied().collect();
    serde_json::from_slice(&ns.run(&argv).stdout).unwrap()
}

/// `nft -f -` with the given text.
fn nft_script(ns: &NetNs, text: &str) -> Output {
    use std::io::Write;
    let mut child = ns
        .exec(&["nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn table_exists(ns: &NetNs) -> bool {
    ns.exec(&["nft", "list", "table", "inet", TABLE])
        .output()
        .unwrap()
        .status
        .success()
}

/// The bans of one family ("v4" or "v6"): the plain set of that name and
/// its interval set (`v4net`/`v6net`); the plain `v6` set's addresses are
/// /64 prefixes and shown as such. Sorted.
fn elements(ns: &NetNs, family: &str) -> Vec<NftElem> {
    nft_bans_detailed(ns, TABLE, family)
}

fn elem_names(ns: &NetNs, family: &str) -> Vec<String> {
    elements(ns, family).into_iter().map(|l| l.elem).collect()
}

/// The rules of our chain as JSON.
fn chain_rules(ns: &NetNs) -> Vec<Value> {
    let v = nft_json(ns, &["list", "chain", "inet", TABLE, "input"]);
    v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i.get("rule").cloned())
        .collect()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|_| IpNet::from(s.parse::<IpAddr>().unwrap()))
}

fn ban(s: &str, until: Until) -> Element {
    Element { net: net(s), until }
}

/// `ms` (whole seconds, as nft lists them) is `want` seconds, give or take 2.
fn assert_about(ms: Option<u64>, want: i64, what: &str) {
    let got = (ms.unwrap_or_else(|| panic!("{what}: no timeout")) / 1000) as i64;
    assert!((got - want).abs() <= 2, "{what}: {got} s, want about {want} s");
}

#[tokio::test]
async fn init_is_idempotent_and_keeps_the_kernels_elements() {
    let (ns, mut e, now) = initialised().await;
    e.init(now).await.unwrap();
    // The fixed sets' two rules; a set per length gets its rule with it.
    assert_eq!(chain_rules(&ns).len(), 2);
    e.add(
        &[
            ban("192.0.2.1", Until::At(now + HOUR)),
            ban("2001:db8::/64", Until::Permanent),
        ],
        now,
    )
    .await
    .unwrap();

    // A restarted daemon: a fresh enforcer, init twice, elements kept.
    let mut again = enforcer(&ns);
    again.init(now_ms()).await.unwrap();
    again.init(now_ms()).await.unwrap();
    assert_eq!((again.len(), again.desired_len()), (2, 2));
    assert_eq!(elem_names(&ns, "v4"), ["192.0.2.1"]);
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8::/64"]);
    assert_eq!(chain_rules(&ns).len(), 2, "rules not duplicated");
    // It knows them: a broader ban replaces the kept one.
    again
        .add(&[ban("192.0.2.0/24", Until::At(now + HOUR))], now_ms())
        .await
        .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["192.0.2.0/24"]);
    assert_eq!(chain_rules(&ns).len(), 3, "v4n24's rule");
    // Read back by another restart: the set per length and its rule kept.
    let mut third = enforcer(&ns);
    third.init(now_ms()).await.unwrap();
    assert_eq!((third.len(), chain_rules(&ns).len()), (2, 3));
}

#[tokio::test]
async fn adds_and_removes_v4_and_v6_with_remaining_timeouts() {
    let (ns, mut e, now) = initialised().await;
    e.add(
        &[
            ban("192.0.2.1", Until::At(now + HOUR)),
            ban("198.51.100.0/24", Until::Permanent),
            ban("2001:db8:1:2:3:4:5:6/64", Until::At(now + HOUR / 2)),
            ban("2001:db8:9::1", Until::At(now + 30 * 24 * HOUR)),
        ],
        now,
    )
    .await
    .unwrap();
    assert_eq!(e.len(), 4);

    let v4 = elements(&ns, "v4");
    assert_eq!(v4[0].elem, "192.0.2.1");
    assert_about(v4[0].timeout_ms, 3_600, "v4 timeout");
    assert_about(v4[0].expires_ms, 3_600, "v4 expires");
    assert_eq!(v4[1].elem, "198.51.100.0/24");
    assert_eq!(
        (v4[1].timeout_ms, v4[1].expires_ms),
        (None, None),
        "permanent has no timeout"
    );
    let v6 = elements(&ns, "v6");
    assert_eq!(v6[0].elem, "2001:db8:1:2::/64", "host bits dropped");
    assert_about(v6[0].timeout_ms, 1_800, "v6 timeout");
    assert_eq!(v6[1].elem, "2001:db8:9::1");
    assert_about(v6[1].timeout_ms, 30 * 86_400, "30-day timeout");

    e.remove(&[net("192.0.2.1"), net("2001:db8:1:2::/64")], now_ms())
        .await
        .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["198.51.100.0/24"]);
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8:9::1"]);
    assert_eq!(e.len(), 2);

    // Adds and removals together, in one transaction.
    let later = Until::At(now + HOUR);
    e.update(&[ban("192.0.2.9", later)], &[net("198.51.100.0/24")], now_ms())
        .await
        .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["192.0.2.9"]);
}

#[tokio::test]
async fn re_adding_refreshes_the_timeout_both_ways() {
    let (ns, mut e, now) = initialised().await;
    for (hours, want) in [(1, 3_600), (2, 7_200), (0, 600)] {
        let until = if hours == 0 { now + 600_000 } else { now + hours * HOUR };
        e.add(
            &[
                ban("203.0.113.7", Until::At(until)),
                ban("2001:db8::/64", Until::At(until)),
            ],
            now,
        )
        .await
        .unwrap();
        assert_about(elements(&ns, "v4")[0].expires_ms, want, "v4 after re-add");
        assert_about(elements(&ns, "v6")[0].expires_ms, want, "v6 after re-add");
    }
    // Permanent to timed and back.
    e.add(&[ban("203.0.113.7", Until::Permanent)], now).await.unwrap();
    assert_eq!(elements(&ns, "v4")[0].timeout_ms, None);
    e.add(&[ban("203.0.113.7", Until::At(now + HOUR))], now).await.unwrap();
    assert_about(elements(&ns, "v4")[0].timeout_ms, 3_600, "timed again");
}

#[tokio::test]
async fn replace_all_adds_missing_removes_stale_refreshes_changed() {
    let (ns, mut e, now) = initialised().await;
    let h = Until::At(now + HOUR);
    e.add(&[ban("10.1.0.1", h), ban("10.1.0.2", h), ban("10.1.0.3", h)], now)
        .await
        .unwrap();

    let want = [
        ban("10.1.0.2", h),
        ban("10.1.0.3", Until::At(now + 3 * HOUR)),
        ban("10.1.0.4", h),
        ban("10.1.0.9", Until::At(now - 1)),
    ];
    let stats = e.replace_all(&want, now).await.unwrap();
    assert_eq!(
        (
            stats.added,
            stats.removed,
            stats.refreshed,
            stats.unchanged,
            stats.expired
        ),
        (1, 1, 1, 1, 1),
        "{stats:?}"
    );
    let v4 = elements(&ns, "v4");
    let names: Vec<&str> = v4.iter().map(|l| l.elem.as_str()).collect();
    assert_eq!(names, ["10.1.0.2", "10.1.0.3", "10.1.0.4"]);
    assert_about(v4[1].expires_ms, 3 * 3_600, "refreshed");

    // The table vanished behind our back (a firewall reload): reconcile restores it.
    ns.run(&["nft", "delete", "table", "inet", "fleetban"]);
    let stats = e.replace_all(&want, now_ms()).await.unwrap();
    assert_eq!(stats.added, 3);
    assert_eq!(elem_names(&ns, "v4"), ["10.1.0.2", "10.1.0.3", "10.1.0.4"]);
    assert_eq!(chain_rules(&ns).len(), 2);
}

#[tokio::test]
async fn overlapping_prefixes_are_covered_and_come_back() {
    let (ns, mut e, now) = initialised().await;
    let h = Until::At(now + HOUR);

    // Broad first, then a narrower one inside it: the kernel keeps the broad one.
    e.add(&[ban("10.0.0.0/24", h)], now).await.unwrap();
    e.add(&[ban("10.0.0.5", h)], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.0/24"]);
    assert_eq!((e.len(), e.desired_len()), (1, 2));
    // Removing the broad one brings the narrow one back.
    e.remove(&[net("10.0.0.0/24")], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.5"]);

    // Narrow first, then the broad one: replaced in one transaction.
    e.add(&[ban("10.0.0.7", h), ban("10.9.0.1", h)], now).await.unwrap();
    e.add(&[ban("10.0.0.0/24", Until::At(now + 2 * HOUR))], now)
        .await
        .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.0/24", "10.9.0.1"]);
    // Both inside one call, and in IPv6.
    e.add(
        &[ban("2001:db8::1", h), ban("2001:db8::/64", h), ban("2001:db8::2", h)],
        now,
    )
    .await
    .unwrap();
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8::/64"]);
    e.remove(&[net("2001:db8::/64")], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8::1", "2001:db8::2"]);
    // Removing a covered element leaves its cover in place.
    e.remove(&[net("10.0.0.5")], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.0/24", "10.9.0.1"]);
    e.remove(&[net("10.0.0.0/24")], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.7", "10.9.0.1"]);
}

#[tokio::test]
async fn covered_element_outliving_its_cover_is_added_back_on_tick() {
    let (ns, mut e, now) = initialised().await;
    e.add(
        &[
            ban("10.0.0.0/24", Until::At(now + 1_000)),
            ban("10.0.0.5", Until::At(now + HOUR)),
        ],
        now,
    )
    .await
    .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.0/24"]);
    let wake = e.next_wakeup().expect("a wakeup for the add-back");
    assert!(wake > now + 1_000 && wake < now + 10_000, "{wake} vs {now}");
    tokio::time::sleep(Duration::from_millis((wake - now_ms()).max(0) as u64)).await;
    e.tick(now_ms()).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.0.0.5"]);
    assert_eq!(e.next_wakeup(), None);
}

#[tokio::test]
async fn expired_elements_are_skipped_and_never_deleted() {
    let (ns, mut e, now) = initialised().await;
    e.add(
        &[
            ban("10.2.0.1", Until::At(now - 1)),
            ban("10.2.0.2", Until::At(now)),
            ban("10.2.0.3", Until::At(now + 500)),
            ban("10.2.0.4", Until::At(now + HOUR)),
        ],
        now,
    )
    .await
    .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.2.0.3", "10.2.0.4"]);
    // 10.2.0.3 expires in the kernel; removing it must not send a delete
    // that would fail the whole transaction (nft 1.0.6 has no `destroy`).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(elem_names(&ns, "v4"), ["10.2.0.4"]);
    e.remove(&[net("10.2.0.3"), net("10.2.0.4")], now_ms()).await.unwrap();
    assert!(elem_names(&ns, "v4").is_empty());
    assert_eq!(e.desired_len(), 0);
}

#[tokio::test]
async fn recovers_when_the_kernel_changed_behind_its_back() {
    let (ns, mut e, now) = initialised().await;
    let h = Until::At(now + HOUR);
    e.add(&[ban("10.3.0.1", h), ban("10.3.0.2", h)], now).await.unwrap();
    // Someone deletes one of ours and adds another by hand.
    let out = nft_script(
        &ns,
        "delete element inet fleetban v4 { 10.3.0.1 }\nadd element inet fleetban v4 { 10.3.1.1 }\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Our delete of 10.3.0.1 fails ("element does not exist"); the retry
    // re-reads the kernel, and its plan also drops the unwanted address.
    e.remove(&[net("10.3.0.1")], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.3.0.2"]);
    // A covering network added by hand (a set per length, without its
    // rule) is not ours: our add does not collide with it, and the next
    // reconcile deletes it (and installs the rule).
    let out = nft_script(
        &ns,
        "add set inet fleetban v4n24 { type ipv4_addr; flags timeout; }\n\
         add element inet fleetban v4n24 { 10.3.2.0 }\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    e.add(&[ban("10.3.2.9", h)], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.3.0.2", "10.3.2.0/24", "10.3.2.9"]);
    e.replace_all(&[ban("10.3.0.2", h), ban("10.3.2.9", h)], now_ms())
        .await
        .unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.3.0.2", "10.3.2.9"]);
}

#[tokio::test]
async fn a_reconcile_lists_the_kernel_up_to_list_max_elements_only() {
    // An element deleted by hand is put back by a reconcile that lists the
    // kernel; above `list_max` the reconcile plans against the bookkeeping
    // (a listing's cost grows with the square of the set), and a failed
    // call still lists.
    for (list_max, listed) in [(NftOptions::default().list_max, true), (2, false)] {
        let ns = netns();
        let now = now_ms();
        let mut e = Enforcer::nft(NftOptions {
            list_max,
            ..nft_opts(&ns)
        })
        .unwrap();
        e.init(now).await.unwrap();
        let h = Until::At(now + HOUR);
        let three = [ban("10.6.0.1", h), ban("10.6.0.2", h), ban("10.6.0.3", h)];
        e.add(&three, now).await.unwrap();
        let out = nft_script(&ns, "delete element inet fleetban v4 { 10.6.0.1 }\n");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let s = e.replace_all(&three, now_ms()).await.unwrap();
        assert_eq!(
            (s.added, s.unchanged),
            if listed { (1, 2) } else { (0, 3) },
            "list_max {list_max}"
        );
        let kernel = elem_names(&ns, "v4");
        assert_eq!(
            kernel.len(),
            if listed { 3 } else { 2 },
            "list_max {list_max}: {kernel:?}"
        );
        // A ban on top goes in by itself either way.
        e.add(&[ban("10.6.0.4", h)], now_ms()).await.unwrap();
        assert!(elem_names(&ns, "v4").contains(&"10.6.0.4".to_owned()));
        // Unbanning the element deleted by hand fails in nft: the retry
        // lists the kernel and the bookkeeping is right again.
        e.remove(&[net("10.6.0.1")], now_ms()).await.unwrap();
        assert_eq!(elem_names(&ns, "v4"), ["10.6.0.2", "10.6.0.3", "10.6.0.4"]);
        let s = e.replace_all(&three[1..], now_ms()).await.unwrap();
        assert_eq!((s.removed, s.unchanged), (1, 2), "list_max {list_max}");
        assert_eq!(elem_names(&ns, "v4"), ["10.6.0.2", "10.6.0.3"]);
    }
}

/// The start's preload: pages taken as they come, planned while nft runs
/// the transaction before; every element of them in the kernel. A
/// transaction that fails (the table deleted by hand meanwhile) stops it,
/// and the first sync after it lists the kernel and puts the list in whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preload_loads_pages_as_they_come_and_a_failure_leaves_the_list_to_the_sync() {
    let (ns, e, now) = initialised().await;
    let page = |k: u32, now: i64| -> Vec<Element> {
        (0..500)
            .map(|i| ban(&format!("10.{k}.{}.{}", i / 250, i % 250 + 1), Until::At(now + HOUR)))
            .collect()
    };
    // Three pages at once: the first goes in alone, the others are planned
    // while it runs and go in together.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for k in 1..=3 {
        tx.send(page(k, now)).unwrap();
    }
    drop(tx);
    let (_e, done) = tokio::spawn(async move {
        let mut e = e;
        let done = e.preload(&mut rx, |_| true).await;
        (e, done)
    })
    .await
    .unwrap();
    assert!(done.failed.is_none(), "{:?}", done.failed);
    assert_eq!(done.loaded, 1500);
    assert!(
        done.transactions >= 2,
        "the pages that came during a transaction wait for the next: {done:?}"
    );
    assert_eq!(elem_names(&ns, "v4").len(), 1500);

    // Again in a fresh namespace: the table deleted between two pages.
    let (ns, e, now) = initialised().await;
    let pages = [page(1, now), page(2, now)];
    let all: Vec<Element> = pages.concat();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let preload = tokio::spawn(async move {
        let mut e = e;
        let done = e.preload(&mut rx, |_| true).await;
        (e, done)
    });
    let sender = {
        let (ns_name, pages) = (ns.name.clone(), pages.clone());
        std::thread::spawn(move || {
            let [first, second] = pages;
            tx.send(first).unwrap();
            let listed = |ns: &str| {
                std::process::Command::new("ip")
                    .args(["netns", "exec", ns, "nft", "list", "set", "inet", TABLE, "v4"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).matches("10.1.").count())
                    .unwrap_or(0)
            };
            // Bounded: the first page is in nft within milliseconds.
            for _ in 0..1000 {
                if listed(&ns_name) >= 500 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns_name, "nft", "delete", "table", "inet", TABLE])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            tx.send(second).unwrap();
        })
    };
    sender.join().unwrap();
    let (mut e, done) = preload.await.unwrap();
    assert_eq!(done.loaded, 500, "{done:?}");
    assert!(
        done.failed.is_some(),
        "the transaction into the deleted table failed: {done:?}"
    );
    assert!(!table_exists(&ns));
    // The first sync lists the kernel (the preload's bookkeeping is not
    // trusted after a failure) and puts every element in.
    let s = e.replace_all(&all, now_ms()).await.unwrap();
    assert_eq!(s.added, 1000, "{s:?}");
    assert_eq!(elem_names(&ns, "v4").len(), 1000);
    // Dropped first: the runtime's threads end before the namespace goes.
    drop(e);
}

#[tokio::test]
async fn failures_are_reported_not_panicked() {
    let ns = netns();
    let now = now_ms();
    // nft refuses twice: a foreign chain in our table references a set of the
    // wrong type, so re-creating the set fails ("Device or resource busy").
    let out = nft_script(
        &ns,
        "table inet fleetban {\n set v4 { type ipv4_addr; }\n chain other { ip saddr @v4 accept; }\n}\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut e = enforcer(&ns);
    let err = e.init(now).await.unwrap_err();
    assert!(matches!(err, EnforceError::Nft { .. }), "{err}");
    assert!(err.to_string().contains("busy"), "stderr included: {err}");
    let err = e.add(&[ban("10.4.0.1", Until::At(now + HOUR))], now).await.unwrap_err();
    assert!(matches!(err, EnforceError::Nft { .. }), "{err}");
    // Once the obstacle is gone, the next call recovers.
    ns.run(&["nft", "delete", "chain", "inet", "fleetban", "other"]);
    e.add(&[ban("10.4.0.2", Until::At(now + HOUR))], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.4.0.1", "10.4.0.2"]);

    // A missing program, and a bad table name, are errors too.
    let opts = NftOptions {
        command: vec!["/nonexistent/nft".into()],
        ..NftOptions::default()
    };
    let err = Enforcer::nft(opts).unwrap().init(now).await.unwrap_err();
    assert!(matches!(err, EnforceError::Spawn { .. }), "{err}");
    for table in ["", "fleet ban", "a;b", "x".repeat(33).as_str()] {
        let opts = NftOptions {
            table: table.into(),
            ..NftOptions::default()
        };
        assert!(matches!(Enforcer::nft(opts), Err(EnforceError::InvalidTable(_))));
    }
}

#[tokio::test]
async fn flush_deletes_the_table() {
    let (ns, mut e, now) = initialised().await;
    e.add(&[ban("10.5.0.1", Until::At(now + HOUR))], now).await.unwrap();
    e.flush().await.unwrap();
    assert!(!table_exists(&ns));
    assert!(e.is_empty());
    e.flush().await.unwrap(); // absent is fine
                              // The next ban re-creates the table.
    e.add(&[ban("10.5.0.2", Until::At(now + HOUR))], now).await.unwrap();
    assert_eq!(elem_names(&ns, "v4"), ["10.5.0.2"]);
    assert_eq!(chain_rules(&ns).len(), 2);
}

/// The protocol of a rule's match: `ip saddr`, or `ip6 saddr & MASK` for
/// the /64 set.
fn proto_of(left: &Value) -> &str {
    let payload = match left.get("&") {
        Some(and) => &and[0]["payload"],
        None => &left["payload"],
    };
    payload["protocol"].as_str().unwrap_or("?")
}

#[tokio::test]
async fn action_and_ports_shape_the_rules() {
    let (ns, mut e, now) = initialised().await;
    let h = Until::At(now + HOUR);
    e.add(
        &[ban("10.6.0.1", h), ban("10.7.0.0/24", h), ban("2001:db8:6::/48", h)],
        now,
    )
    .await
    .unwrap();
    let chain = nft_json(&ns, &["list", "chain", "inet", "fleetban", "input"]);
    let c = chain["nftables"][1]["chain"].clone();
    assert_eq!(
        (c["type"].as_str(), c["hook"].as_str()),
        (Some("filter"), Some("input"))
    );
    assert_eq!((c["prio"].as_i64(), c["policy"].as_str()), (Some(-10), Some("accept")));
    let rules = chain_rules(&ns);
    assert_eq!(rules.len(), 4);
    let sets = [("ip", "@v4"), ("ip6", "@v6"), ("ip", "@v4n24"), ("ip6", "@v6n48")];
    for (rule, (proto, set)) in rules.iter().zip(sets) {
        let expr = rule["expr"].as_array().unwrap();
        assert_eq!(expr.len(), 3, "{rule}");
        assert_eq!(proto_of(&expr[0]["match"]["left"]), proto, "{rule}");
        assert_eq!(expr[0]["match"]["right"], set);
        assert!(expr[1].get("counter").is_some());
        assert!(expr[2].get("drop").is_some());
    }

    // Restart with reject on two ports: the rules are replaced, elements kept.
    let opts = NftOptions {
        action: Action::Reject,
        ports: vec![443, 80, 443],
        ..nft_opts(&ns)
    };
    let mut e = Enforcer::nft(opts).unwrap();
    e.init(now_ms()).await.unwrap();
    let rules = chain_rules(&ns);
    assert_eq!(rules.len(), 4);
    for (rule, proto) in rules.iter().zip(["ip", "ip6", "ip", "ip6"]) {
        let expr = rule["expr"].as_array().unwrap();
        assert_eq!(expr[0]["match"]["left"]["payload"]["protocol"], "tcp");
        assert_eq!(expr[0]["match"]["left"]["payload"]["field"], "dport");
        assert_eq!(expr[0]["match"]["right"]["set"], serde_json::json!([80, 443]));
        assert_eq!(proto_of(&expr[1]["match"]["left"]), proto);
        assert!(expr[2].get("counter").is_some());
        assert!(expr[3].get("reject").is_some(), "{rule}");
    }
    assert_eq!(elem_names(&ns, "v4"), ["10.6.0.1", "10.7.0.0/24"]);
    // Same options again: the rules (and their counters) stay as they are.
    let handles: Vec<Value> = rules.iter().map(|r| r["handle"].clone()).collect();
    let mut e = Enforcer::nft(NftOptions {
        action: Action::Reject,
        ports: vec![80, 443],
        ..nft_opts(&ns)
    })
    .unwrap();
    e.init(now_ms()).await.unwrap();
    let again: Vec<Value> = chain_rules(&ns).iter().map(|r| r["handle"].clone()).collect();
    assert_eq!(handles, again);
}

/// Helper for `drops_packets_from_banned_sources`, run inside the namespace
/// as a child process; does nothing in a normal test run.
#[test]
fn packet_probe_child() {
    common::probe::child();
}

/// Connects from 127.0.0.2 and from 127.0.0.3 inside the namespace; returns
/// the probe lines (`PROBE 127.0.0.10 ok`, ...).
fn probe(ns: &NetNs) -> Vec<String> {
    common::probe::run(ns, "127.0.0.10,127.0.0.11")
}

#[tokio::test]
async fn drops_packets_from_banned_sources() {
    let ns = netns();
    // The enforcer is policy-free; only in this namespace do we ban loopback.
    // Connections to 127.0.0.10 leave from 127.0.0.2, to .11 from 127.0.0.3.
    for (dst, src) in [("127.0.0.10/32", "127.0.0.2"), ("127.0.0.11/32", "127.0.0.3")] {
        ns.run(&[
            "ip", "route", "add", "local", dst, "dev", "lo", "src", src, "table", "local",
        ]);
    }
    let now = now_ms();
    let mut e = enforcer(&ns);
    e.init(now).await.unwrap();
    assert_eq!(probe(&ns), ["PROBE 127.0.0.10 ok", "PROBE 127.0.0.11 ok"]);

    e.add(&[ban("127.0.0.2", Until::At(now + 60_000))], now).await.unwrap();
    let started = Instant::now();
    assert_eq!(probe(&ns), ["PROBE 127.0.0.10 fail", "PROBE 127.0.0.11 ok"]);
    assert!(started.elapsed() < Duration::from_secs(3));
    let counter = &chain_rules(&ns)[0]["expr"][1]["counter"]["packets"];
    assert!(counter.as_u64().unwrap() > 0, "drop rule counted: {counter}");

    e.remove(&[net("127.0.0.2")], now_ms()).await.unwrap();
    assert_eq!(probe(&ns), ["PROBE 127.0.0.10 ok", "PROBE 127.0.0.11 ok"]);
}

#[tokio::test]
async fn loads_100k_elements_in_one_transaction() {
    let (ns, mut e, now) = initialised().await;
    let elems: Vec<Element> = (0..100_000u32)
        .map(|i| Element {
            net: IpNet::from(IpAddr::from((11u32 << 24 | i).to_be_bytes())),
            until: Until::At(now + HOUR + i64::from(i)),
        })
        .collect();
    // The bookkeeping alone (the dry run plans the same way).
    let started = Instant::now();
    Enforcer::log().add(&elems, now).await.unwrap();
    let plan = started.elapsed();
    let started = Instant::now();
    e.add(&elems, now).await.unwrap();
    let load = started.elapsed();
    assert_eq!(e.len(), 100_000);
    let started = Instant::now();
    let listed = elements(&ns, "v4");
    let list = started.elapsed();
    assert_eq!(listed.len(), 100_000);
    assert!(listed.iter().all(|l| l.timeout_ms.is_some()));

    // Costs once the set is large (nft 1.0.6 reads the whole set each time).
    let started = Instant::now();
    e.add(&[ban("12.0.0.1", Until::At(now + HOUR))], now).await.unwrap();
    let one = started.elapsed();
    let started = Instant::now();
    let stats = e.replace_all(&elems, now_ms()).await.unwrap();
    let reconcile = started.elapsed();
    assert_eq!((stats.unchanged, stats.removed), (100_000, 1), "{stats:?}");
    eprintln!(
        "100k v4 elements: load {load:?} (one nft -f -; bookkeeping alone {plan:?}), \
         list {list:?}, one more element {one:?}, reconcile (re-read + delete 1) {reconcile:?}"
    );
}

#[tokio::test]
async fn a_table_in_the_old_two_interval_sets_layout_is_recreated() {
    let ns = netns();
    // DESIGN §4's layout, as a previous version left it.
    let out = nft_script(
        &ns,
        "add table inet fleetban\n\
         add set inet fleetban v4 { type ipv4_addr; flags interval, timeout; }\n\
         add set inet fleetban v6 { type ipv6_addr; flags interval, timeout; }\n\
         add chain inet fleetban input { type filter hook input priority -10; policy accept; }\n\
         add rule inet fleetban input ip saddr @v4 counter drop comment \"fleetban v4 drop\"\n\
         add rule inet fleetban input ip6 saddr @v6 counter drop comment \"fleetban v6 drop\"\n\
         add element inet fleetban v4 { 10.8.0.0/24 timeout 1h }\n",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let now = now_ms();
    let mut e = enforcer(&ns);
    e.init(now).await.unwrap();
    e.replace_all(
        &[
            ban("10.8.0.0/24", Until::At(now + HOUR)),
            ban("10.8.1.1", Until::At(now + HOUR)),
            ban("2001:db8:8::/64", Until::At(now + HOUR)),
        ],
        now,
    )
    .await
    .unwrap();
    assert_eq!(chain_rules(&ns).len(), 3);
    let set = nft_json(&ns, &["list", "set", "inet", "fleetban", "v4"]);
    assert_eq!(set["nftables"][1]["set"]["flags"], serde_json::json!(["timeout"]));
    assert_eq!(elem_names(&ns, "v4"), ["10.8.0.0/24", "10.8.1.1"]);
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8:8::/64"]);
}

/// The table, fixed sets, chain and rules as a version before issue 27
/// left them (no `gc-interval`); each test adds what it needs.
const EARLIER_TABLE: &str = "add table inet fleetban\n\
     add set inet fleetban v4 { type ipv4_addr; flags timeout; }\n\
     add set inet fleetban v6 { type ipv6_addr; flags timeout; }\n\
     add chain inet fleetban input { type filter hook input priority -10; policy accept; }\n\
     add rule inet fleetban input ip saddr @v4 counter drop comment \"fleetban v4 drop\"\n\
     add rule inet fleetban input ip6 saddr & ffff:ffff:ffff:ffff:: @v6 counter drop comment \"fleetban v6 drop\"\n";

#[tokio::test]
async fn a_table_with_the_interval_sets_v4net_v6net_moves_to_sets_per_length() {
    let ns = netns();
    // The layout before issue 27, as a previous version left it.
    let out = nft_script(
        &ns,
        &(EARLIER_TABLE.to_owned()
            + "add set inet fleetban v4net { type ipv4_addr; flags interval, timeout; }\n\
         add set inet fleetban v6net { type ipv6_addr; flags interval, timeout; }\n\
         add rule inet fleetban input ip saddr @v4net counter drop comment \"fleetban v4net drop\"\n\
         add rule inet fleetban input ip6 saddr @v6net counter drop comment \"fleetban v6net drop\"\n\
         add element inet fleetban v4 { 10.9.0.1 timeout 1h }\n\
         add element inet fleetban v4net { 10.9.1.0/24 timeout 1h }\n\
         add element inet fleetban v6net { 2001:db8:9::/48 timeout 1h }\n"),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let now = now_ms();
    let mut e = enforcer(&ns);
    e.init(now).await.unwrap();
    let h = Until::At(now + HOUR);
    let stats = e
        .replace_all(
            &[ban("10.9.0.1", h), ban("10.9.1.0/24", h), ban("2001:db8:9::/48", h)],
            now,
        )
        .await
        .unwrap();
    assert_eq!((stats.added, stats.unchanged), (2, 1), "{stats:?}");
    let sets = nft_json(&ns, &["list", "sets", "inet"]);
    let mut names: Vec<&str> = sets["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["set"]["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["v4", "v4n24", "v6", "v6n48"]);
    assert_eq!(chain_rules(&ns).len(), 4);
    assert_eq!(elem_names(&ns, "v4"), ["10.9.0.1", "10.9.1.0/24"]);
    assert_eq!(elem_names(&ns, "v6"), ["2001:db8:9::/48"]);
}

/// Every set of ours has the kernel walk it for expired elements once a
/// minute, not every second (`script::GC_INTERVAL_S`: with a million
/// elements, each walk held transactions up for ~0.1 s). A table an earlier
/// version made keeps its elements and gets the interval at `init`.
#[tokio::test]
async fn sets_are_collected_once_a_minute_also_those_an_earlier_version_made() {
    let ns = netns();
    let out = nft_script(
        &ns,
        &(EARLIER_TABLE.to_owned()
            + "add set inet fleetban v4n24 { type ipv4_addr; flags timeout; }\n\
         add rule inet fleetban input ip saddr & 255.255.255.0 @v4n24 counter drop comment \"fleetban v4n24 drop\"\n\
         add element inet fleetban v4 { 10.7.0.1 timeout 1h }\n\
         add element inet fleetban v4n24 { 10.7.1.0 timeout 1h }\n"),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let gc = |ns: &NetNs| -> Vec<(String, Option<u64>)> {
        let sets = nft_json(ns, &["list", "sets", "inet"]);
        let mut v: Vec<(String, Option<u64>)> = sets["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["set"]["table"] == TABLE)
            .map(|i| {
                (
                    i["set"]["name"].as_str().unwrap().to_owned(),
                    i["set"]["gc-interval"].as_u64(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert!(gc(&ns).iter().all(|(_, g)| g.is_none()), "{:?}", gc(&ns));
    let now = now_ms();
    let mut e = enforcer(&ns);
    e.init(now).await.unwrap();
    let h = Until::At(now + HOUR);
    e.add(&[ban("10.7.2.0/23", h)], now).await.unwrap();
    let minute = Some(60);
    assert_eq!(
        gc(&ns),
        [("v4", minute), ("v4n23", minute), ("v4n24", minute), ("v6", minute)].map(|(n, g)| (n.to_owned(), g))
    );
    assert_eq!(elem_names(&ns, "v4"), ["10.7.0.1", "10.7.1.0/24", "10.7.2.0/23"]);
    assert_eq!(chain_rules(&ns).len(), 4);
}

/// The table check of an enforcer that runs the system nft asks nf_tables
/// itself for the chain (`enforce/netlink.rs`): it tells the chain from a
/// missing chain, a missing table and a table of another family, and what
/// went is re-created. The table's creation runs the program, so this
/// process never loads libnftables (no test here runs it in-process).
#[test]
fn the_check_asks_nf_tables_for_the_chain_and_never_loads_libnftables() {
    let ns = netns();
    let inside = NftOptions {
        library: true,
        ..NftOptions::default()
    };
    let checks = ns.spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut e = Enforcer::nft(inside).unwrap();
        rt.block_on(e.init(now_ms())).unwrap();
        let mut check = || rt.block_on(e.check(now_ms())).unwrap().is_some();
        let run = |argv: &[&str]| {
            let out = std::process::Command::new("nft").args(argv).output().unwrap();
            assert!(
                out.status.success(),
                "nft {argv:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let present = check();
        run(&["delete", "chain", "inet", TABLE, "input"]);
        let no_chain = check();
        let back = check();
        run(&["delete", "table", "inet", TABLE]);
        run(&["add", "table", "ip", TABLE]);
        run(&["add", "chain", "ip", TABLE, "input"]);
        let other_family = check();
        let last = check();
        [present, no_chain, back, other_family, last]
    });
    let recreated = checks.join().unwrap();
    assert_eq!(recreated, [false, true, false, true, false], "re-created by each check");
    assert!(table_exists(&ns));
    let chains = nft_json(&ns, &["list", "chains", "inet"]);
    assert!(chains.to_string().contains("\"name\":\"input\""), "{chains}");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(!maps.contains("libnftables"), "libnftables loaded:\n{maps}");
}
