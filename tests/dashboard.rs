//! The Grafana dashboard (`dashboards/fleetban.json`), checked without
//! Grafana: it loads as a dashboard (a schema version, panels with unique
//! ids and a place on the grid, a datasource variable every panel and
//! query uses), and every metric name its queries read is in the
//! `/metrics` of a running daemon (Redis, the decision endpoint and a
//! `notify:` target configured, a ban made, so every family has samples).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::metrics::http_get;
use common::receiver::Receiver;
use common::{append, combined_lines, free_port, wait_until, ConfigDir, Daemon, Redis, Rule};

fn dashboard() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/fleetban.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Every `fleetban_...` name in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("fleetban_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

fn panels(d: &serde_json::Value) -> Vec<serde_json::Value> {
    d["panels"].as_array().expect("panels").clone()
}

#[test]
fn the_dashboard_loads_as_a_dashboard_with_a_datasource_variable_every_panel_uses() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["uid"].as_str().is_some_and(|t| !t.is_empty()));
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(
        (&ds["name"], &ds["query"]),
        (&"datasource".into(), &"prometheus".into())
    );
    let uses_var = |v: &serde_json::Value| v["uid"] == "${datasource}" && v["type"] == "prometheus";
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert!(
            uses_var(&v["datasource"]),
            "variable {} uses the datasource variable",
            v["name"]
        );
    }
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for p in panels(&d) {
        let id = p["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].as_u64().is_some(), "panel {id}: gridPos.{k}");
        }
        assert!(
            p["title"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id}: a title"
        );
        if p["type"] == "row" {
            continue;
        }
        assert!(
            uses_var(&p["datasource"]),
            "panel {id} ({}) uses ${{datasource}}",
            p["title"]
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {id}: a query");
        for t in targets {
            assert!(uses_var(&t["datasource"]), "panel {id}: a query uses ${{datasource}}");
            let expr = t["expr"].as_str().expect("expr");
            assert!(!metric_names(expr).is_empty(), "panel {id}: {expr}");
            assert!(
                expr.contains("$instance"),
                "panel {id} follows the host variable: {expr}"
            );
            queries += 1;
        }
        assert!(
            p["description"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id}: says what it shows"
        );
    }
    assert!(queries >= 12, "{queries} queries");
    // The panels the issue asks for.
    let titles: Vec<String> = panels(&d)
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_owned())
        .collect();
    for want in [
        "Bans per minute by rule",
        "Bans per minute by host",
        "Active bans",
        "Top banned networks",
        "Lines per second by host",
        "Lag by host",
        "Redis state",
        "Redis round trip p99",
        "Redis errors",
        "/check rate",
        "/check p99",
        "Safety valve",
        "Notification failures",
    ] {
        assert!(titles.iter().any(|t| t == want), "a panel {want:?} in {titles:?}");
    }
}

#[test]
fn every_metric_the_dashboard_queries_is_exposed_by_a_running_daemon() {
    let redis = Redis::start();
    let receiver = Receiver::start(&[]);
    let c = ConfigDir::new();
    let (metrics, http) = (free_port(), free_port());
    c.write(
        &c.main_config()
            .log_firewall()
            .metrics(&format!("127.0.0.1:{metrics}"))
            .http(&format!("{{ listen: '127.0.0.1:{http}' }}"))
            .notify(&format!("[{{ url: '{}' }}]", receiver.url("/")))
            .redis(&redis.url(), "hold: 0s"),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &c.cfg, &c.control);
    append(&c.log, &combined_lines("203.0.113.44", 4, "/", 200));
    wait_until(Duration::from_secs(30), "the ban", || d.status()["bans"] == 1);
    let text = http_get(&format!("127.0.0.1:{metrics}"), "/metrics");
    let exposed: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    let dash = dashboard();
    let mut exprs: Vec<String> = Vec::new();
    for p in panels(&dash) {
        for t in p["targets"].as_array().cloned().unwrap_or_default() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            exprs.push(q.to_owned());
        }
    }
    let mut checked = 0;
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(
                exposed.contains(&name),
                "{name} (in `{expr}`) is not in /metrics:\n{text}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "{checked} names checked");
    assert!(
        text.contains("fleetban_banned_network_bans{network=\"203.0.113.0/24\"} 1"),
        "{text}"
    );
}
