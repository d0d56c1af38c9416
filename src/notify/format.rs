//! The bodies a target is sent, per format (README: Notifications):
//! `json` one object per event or summary; `slack` an incoming-webhook
//! message, `{"text": ...}` with `&`, `<`, `>` escaped as Slack asks;
//! `ntfy` the same sentence as plain text, with a `Title` and `Tags` header.

use serde_json::json;

use super::fold::{Message, Summary};
use super::{BanEvent, Event};
use crate::addr::AddrText;
use crate::config::NotifyFormat;

/// A request body with its content type and extra headers.
#[derive(Clone, Debug, PartialEq)]
pub struct Body {
    pub content_type: &'static str,
    /// Header name and value; values carry no CR, LF or other control character.
    pub headers: Vec<(&'static str, String)>,
    pub bytes: Vec<u8>,
}

fn rfc(ms: i64) -> String {
    crate::rfc3339(ms)
}

fn addr(net: &ipnet::IpNet) -> String {
    AddrText(net).to_string()
}

/// The JSON object of a message.
pub fn json(message: &Message) -> serde_json::Value {
    match message {
        Message::Event(Event::Ban(b)) => json!({
            "event": "ban", "addr": addr(&b.addr), "rule": b.rule, "reason": b.reason,
            "host": b.host, "hits": b.hits, "at": rfc(b.at_ms),
            "until": b.until_ms.map(rfc), "network": b.network,
        }),
        Message::Event(Event::Unban { addr: a, host, at_ms }) => json!({
            "event": "unban", "addr": addr(a), "host": host, "at": rfc(*at_ms),
        }),
        Message::Event(Event::Valve {
            tripped,
            host,
            at_ms,
            refused,
            max_bans_per_minute,
        }) => json!({
            "event": "valve", "state": if *tripped { "tripped" } else { "cleared" }, "host": host,
            "at": rfc(*at_ms), "refused": refused, "max_bans_per_minute": max_bans_per_minute,
        }),
        Message::Event(Event::Redis { down, host, at_ms }) => json!({
            "event": "redis", "state": if *down { "down" } else { "up" }, "host": host, "at": rfc(*at_ms),
        }),
        Message::Event(Event::Test { host, at_ms }) => json!({
            "event": "test", "host": host, "at": rfc(*at_ms),
        }),
        Message::Summary(s) => json!({
            "event": "summary", "host": s.host, "from": rfc(s.from_ms), "to": rfc(s.to_ms),
            "bans": s.bans, "unbans": s.unbans,
            "top_rules": s.rules.iter().map(|(r, n)| json!({"rule": r, "bans": n})).collect::<Vec<_>>(),
            "top_networks": s.networks.iter().map(|(net, n)| json!({"network": addr(net), "bans": n})).collect::<Vec<_>>(),
        }),
    }
}

/// A title and a sentence, for people (slack, ntfy).
pub fn text(message: &Message) -> (String, String) {
    match message {
        Message::Event(Event::Ban(b)) => ban_text(b),
        Message::Event(Event::Unban { addr: a, host, .. }) => (
            format!("fleetban: unbanned {}", addr(a)),
            format!("Unbanned {} on {host}.", addr(a)),
        ),
        Message::Event(Event::Valve {
            tripped: true,
            host,
            refused,
            max_bans_per_minute,
            ..
        }) => (
            format!("fleetban: safety valve tripped on {host}"),
            format!(
                "The safety valve on {host} refuses bans: more than {max_bans_per_minute} a minute ({refused} refused so far)."
            ),
        ),
        Message::Event(Event::Valve { host, .. }) => (
            format!("fleetban: safety valve cleared on {host}"),
            format!("The safety valve on {host} has refused no ban for a minute."),
        ),
        Message::Event(Event::Redis { down: true, host, .. }) => (
            format!("fleetban: Redis down ({host})"),
            format!("{host} cannot reach Redis: deciding as redis.on_down says."),
        ),
        Message::Event(Event::Redis { host, .. }) => (
            format!("fleetban: Redis up ({host})"),
            format!("{host} reaches Redis again."),
        ),
        Message::Event(Event::Test { host, .. }) => (
            "fleetban: test".to_owned(),
            format!("A test notification from {host} (fleetban check --online --notify-test)."),
        ),
        Message::Summary(s) => summary_text(s),
    }
}

fn ban_text(b: &BanEvent) -> (String, String) {
    let what = if b.network { "network" } else { "address" };
    let until = b
        .until_ms
        .map_or("permanently".to_owned(), |u| format!("until {}", rfc(u)));
    let reason = match b.reason.is_empty() {
        true => String::new(),
        false => format!(": {}", b.reason),
    };
    (
        format!("fleetban: banned {}", addr(&b.addr)),
        format!(
            "Banned {what} {} {until} (rule {}, {} hits, host {}){reason}.",
            addr(&b.addr),
            b.rule,
            b.hits,
            b.host
        ),
    )
}

fn summary_text(s: &Summary) -> (String, String) {
    let secs = ((s.to_ms - s.from_ms).max(0) + 999) / 1000;
    let rules: Vec<String> = s.rules.iter().map(|(r, n)| format!("{r} {n}")).collect();
    let nets: Vec<String> = s.networks.iter().map(|(net, n)| format!("{} {n}", addr(net))).collect();
    let unbans = match s.unbans {
        0 => String::new(),
        n => format!(" and {n} unbans"),
    };
    (
        format!("fleetban: {} bans on {}", s.bans, s.host),
        format!(
            "{} bans{unbans} in the last {secs} s on {} (more than a few a second: summarised). Top rules: {}. Top networks: {}.",
            s.bans,
            s.host,
            or_none(&rules),
            or_none(&nets)
        ),
    )
}

fn or_none(v: &[String]) -> String {
    match v.is_empty() {
        true => "none".to_owned(),
        false => v.join(", "),
    }
}

/// Slack's escaping of message text.
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A header value: control characters (CR, LF) become spaces.
fn header_value(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// The body of `message` in `format`.
pub fn body(format: NotifyFormat, message: &Message) -> Body {
    match format {
        NotifyFormat::Json => Body {
            content_type: "application/json",
            headers: Vec::new(),
            bytes: json(message).to_string().into_bytes(),
        },
        NotifyFormat::Slack => {
            let (_, text) = text(message);
            Body {
                content_type: "application/json",
                headers: Vec::new(),
                bytes: json!({ "text": slack_escape(&text) }).to_string().into_bytes(),
            }
        }
        NotifyFormat::Ntfy => {
            let (title, text) = text(message);
            let tags = match message {
                Message::Event(Event::Ban(_)) | Message::Summary(_) => "no_entry",
                Message::Event(Event::Unban { .. }) => "white_check_mark",
                _ => "warning",
            };
            Body {
                content_type: "text/plain; charset=utf-8",
                headers: vec![("Title", header_value(&title)), ("Tags", tags.to_owned())],
                bytes: text.into_bytes(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban() -> Message {
        Message::Event(Event::Ban(BanEvent {
            addr: "203.0.113.7/32".parse().unwrap(),
            rule: "scraper".into(),
            reason: "a <b> & c\r\nX-Evil: 1".into(),
            host: "web-1".into(),
            hits: 120,
            at_ms: 1_700_000_000_000,
            until_ms: Some(1_700_003_600_000),
            network: false,
        }))
    }

    #[test]
    fn json_has_the_documented_fields() {
        let v = json(&ban());
        let want = json!({"event":"ban","addr":"203.0.113.7","rule":"scraper","reason":"a <b> & c\r\nX-Evil: 1",
            "host":"web-1","hits":120,"at":"2023-11-14T22:13:20Z","until":"2023-11-14T23:13:20Z","network":false});
        assert_eq!(v, want);
    }

    #[test]
    fn slack_escapes_and_ntfy_headers_carry_no_line_break() {
        let s: serde_json::Value = serde_json::from_slice(&body(NotifyFormat::Slack, &ban()).bytes).unwrap();
        let text = s
            .as_object()
            .and_then(|o| o.get("text"))
            .and_then(|t| t.as_str())
            .unwrap();
        assert!(text.contains("a &lt;b&gt; &amp; c"), "{text}");
        let n = body(NotifyFormat::Ntfy, &ban());
        assert_eq!(n.headers[0], ("Title", "fleetban: banned 203.0.113.7".to_owned()));
        assert!(n.headers.iter().all(|(_, v)| !v.contains(['\r', '\n'])));
    }
}
