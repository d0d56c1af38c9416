//! End to end as a sysadmin would see it: nginx (Debian's) serves HTTP in a
//! network namespace and writes its access log; fleetban runs in the same
//! namespace with a real Redis; two clients in namespaces of their own make
//! real requests with curl. Once the scraper goes over the limit its new
//! connections fail, while the other client's still succeed.

mod common;

use std::time::Duration;

use common::{http_get, veth_pair, wait_until, ConfigDir, Daemon, NetNs, Nginx, Redis, Rule};

#[test]
fn a_scraper_is_dropped_and_a_normal_client_is_not() {
    let redis = Redis::start();
    let server = NetNs::new("srv");
    let scraper = NetNs::new("scr");
    let visitor = NetNs::new("vis");
    veth_pair(&server, "10.213.1.1/24", &scraper, "10.213.1.2/24");
    veth_pair(&server, "10.213.2.1/24", &visitor, "10.213.2.2/24");
    let nginx = Nginx::start(&server, "0.0.0.0:8080", None);

    let files = ConfigDir::new();
    let rule = Rule::new("scraper", nginx.access_log(), "{ hits: 10, window: 60s }")
        .matching("{ method: [GET, HEAD], status: [2xx, 3xx, 404] }")
        .ignoring("{ path: '^/static/' }")
        .ban("10m");
    files.write(&files.main_config().redis(&redis.url(), ""), &[rule]);
    let daemon = Daemon::start(Some(&server), &files.cfg, &files.control);

    let to_a = |ns: &NetNs| http_get(ns, "http://10.213.1.1:8080/page", Duration::from_secs(2));
    let to_b = |ns: &NetNs| http_get(ns, "http://10.213.2.1:8080/page", Duration::from_secs(2));

    // Static files are ignored: any number of them.
    for _ in 0..15 {
        assert_eq!(
            http_get(&visitor, "http://10.213.2.1:8080/static/app.js", Duration::from_secs(2)),
            Ok(200)
        );
    }
    // The scraper: ten pages are allowed, the eleventh bans.
    for i in 0..11 {
        assert_eq!(to_a(&scraper), Ok(200), "request {i} before the ban");
    }
    wait_until(Duration::from_secs(10), "scraper's connections to fail", || {
        to_a(&scraper).is_err()
    });
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), "1");
    assert!(redis
        .cli(&["ZSCORE", "{fleetban}:bans", "10.213.1.2"])
        .parse::<f64>()
        .is_ok());
    // The visitor still gets through, even with a few pages of its own.
    for _ in 0..5 {
        assert_eq!(to_b(&visitor), Ok(200));
    }
    assert!(to_a(&scraper).is_err());
    let st = daemon.status();
    assert_eq!(st["rules"][0]["bans"], 1, "{st}");
    assert_eq!(st["unparsed"], 0, "{st}");
}
