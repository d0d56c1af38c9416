//! The control socket: a Unix socket (mode 0600) that answers one JSON
//! request per connection with one JSON line. `fleetban status` reads the
//! counters through it; without Redis, `ban`, `unban` and `bans` go through
//! it too, since the embedded list lives in the daemon.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::enforce::{Change, Changes};
use super::stats::Stats;
use crate::bans::{BanList, BanRequest, Mode, Outcome};
use crate::enforce::Element;

pub struct Control {
    pub stats: Arc<Stats>,
    pub bans: Arc<Mutex<BanList>>,
    pub host: String,
    /// To the enforcer and to the pipeline's cache.
    pub changes: Changes,
}

/// Binds the socket (replacing a stale one) with mode 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

impl Control {
    pub async fn serve(self, listener: UnixListener, shutdown: CancellationToken) {
        let this = Arc::new(self);
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
                _ = shutdown.cancelled() => return,
            };
            let this = this.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut line = String::new();
                let mut reader = tokio::io::BufReader::new(r.take(64 * 1024));
                let answer = match tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await {
                    Ok(Ok(_)) => match serde_json::from_str::<Value>(&line) {
                        Ok(req) => this.answer(&req).await,
                        Err(e) => json!({"error": format!("bad request: {e}")}),
                    },
                    _ => json!({"error": "no request"}),
                };
                let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
            });
        }
    }

    async fn answer(&self, req: &Value) -> Value {
        let now = crate::now_ms();
        match req["cmd"].as_str() {
            Some("status") => self.stats.to_json(),
            Some("bans") => match self.bans.lock().await.records(now).await {
                Ok(r) => json!({"bans": r}),
                Err(e) => json!({"error": e.to_string()}),
            },
            Some("ban") => {
                let Some(net) = req["addr"].as_str().and_then(crate::addr::parse_member) else {
                    return json!({"error": "addr is not an address or network"});
                };
                let mode = if req["permanent"].as_bool() == Some(true) {
                    Mode::Permanent
                } else {
                    Mode::For(req["for_ms"].as_i64().unwrap_or(3_600_000).max(1000))
                };
                let r = BanRequest {
                    addr: net,
                    rule: "manual".into(),
                    reason: req["reason"].as_str().unwrap_or("").to_owned(),
                    host: self.host.clone(),
                    hits: 0,
                    mode,
                };
                match self.bans.lock().await.ban(&r, now).await {
                    Ok(Outcome::Banned(rec)) => {
                        let duration = rec.until.map_or("permanent".into(), |u| {
                            humantime::format_duration(Duration::from_secs(((u - now).max(0) / 1000) as u64))
                                .to_string()
                        });
                        tracing::info!(rule = "manual", addr = %crate::addr::AddrText(&net), hits = 0u32,
                            duration = %duration, reason = %r.reason, "Banned.");
                        self.changes.send(Change::Add(vec![Element {
                            net,
                            until: rec.until(),
                        }]));
                        json!({"banned": true, "until": rec.until})
                    }
                    Ok(Outcome::AlreadyBanned(_)) => json!({"banned": false}),
                    Err(e) => json!({"error": e.to_string()}),
                }
            }
            Some("unban") => {
                let Some(net) = req["addr"].as_str().and_then(crate::addr::parse_member) else {
                    return json!({"error": "addr is not an address or network"});
                };
                match self.bans.lock().await.unban(&net, &self.host).await {
                    Ok(removed) => {
                        self.changes.send(Change::Remove(vec![net]));
                        json!({"removed": removed})
                    }
                    Err(e) => json!({"error": e.to_string()}),
                }
            }
            _ => json!({"error": "unknown command: expected status, bans, ban or unban"}),
        }
    }
}

/// The client side, for the CLI: one request, one answer, 5 s at most.
pub fn request(path: &Path, req: &Value) -> Result<Value, String> {
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    writeln!(s, "{req}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("bad answer: {e}"))?;
    match v.get("error").and_then(Value::as_str) {
        Some(e) => Err(e.to_owned()),
        None => Ok(v),
    }
}

pub fn ban_request(req: &BanRequest) -> Value {
    let (for_ms, permanent) = match req.mode {
        Mode::For(ms) => (ms, false),
        Mode::Permanent => (0, true),
        Mode::Auto(p) => (p.duration_ms, false),
    };
    json!({"cmd": "ban", "addr": crate::addr::AddrText(&req.addr).to_string(), "for_ms": for_ms,
           "permanent": permanent, "reason": req.reason})
}

/// `fleetban status` for people.
pub fn render_status(v: &Value) -> String {
    let mut out = String::new();
    out += &format!(
        "redis: {}   bans active: {}   lag: {} ms   lines: {}   unparsed: {}   stale: {}\n",
        if v["redis"]["connected"].as_bool() == Some(true) {
            "connected"
        } else {
            "not connected / embedded"
        },
        v["bans_active"],
        v["lag_ms"],
        v["lines"],
        v["unparsed"],
        v["stale"]
    );
    out += &format!(
        "safety valve: {} ({} refused, limit {}/min)   reloads: {} ({} refused)\n",
        v["safety"]["state"].as_str().unwrap_or("?"),
        v["safety"]["refused"],
        v["safety"]["max_bans_per_minute"],
        v["reloads"],
        v["reload_errors"]
    );
    out += "sources:\n";
    for s in v["sources"].as_array().into_iter().flatten() {
        out += &format!(
            "  {}  offset {}  lines {}  {} lines/s  lag {} ms  {} bytes behind\n",
            s["path"].as_str().unwrap_or("?"),
            s["offset"],
            s["lines"],
            s["lines_per_s"],
            s["lag_ms"],
            s["bytes_behind"]
        );
    }
    out += "rules:\n";
    for r in v["rules"].as_array().into_iter().flatten() {
        out += &format!(
            "  {}  hits {}  bans {}\n",
            r["name"].as_str().unwrap_or("?"),
            r["hits"],
            r["bans"]
        );
    }
    out
}
