//! Log rotation torture, against the real daemon and a real Redis: a writer
//! appends 1,000,000 lines as fast as it can while a rotator rotates the log
//! every 100,000 lines, in turn by rename+create, copytruncate,
//! delete+recreate, and Debian's own `logrotate` (`create`, then
//! `copytruncate`) with a config and state file in a temp dir. The daemon
//! follows it (`firewall: log`, a limit nothing reaches) and at the end every
//! line must be in Redis exactly once.
//!
//! How a line is recognised in Redis: line `seq` belongs to client address
//! `seq / PER_ADDR` and carries the time `T0 + seq % PER_ADDR` seconds, so each
//! window ZSET must hold exactly `PER_ADDR` members whose scores are those
//! `PER_ADDR` distinct seconds, each once. A lost line is a missing score, a
//! line counted twice (read again under another identity) a repeated one.
//!
//! The writer behaves like nginx: it keeps writing to the file it has open and
//! only notices a rotation (another inode, or no file at the path) every
//! `REOPEN_EVERY` lines, so every rename or delete leaves lines to drain from
//! the old file; it never reopens in the middle of a rotation (nginx reopens
//! when logrotate's postrotate signals it): a file the writer created in the
//! instant between logrotate's rename and its create would be replaced by
//! logrotate's before any follower could open it. The daemon is never killed
//! while a deleted file still has unread lines: nothing can open it again. Copytruncate is the one exception, because it loses lines by
//! design: whatever is written between the copy and the truncation exists only
//! in the copy. For both copytruncate rotations the writer pauses and the test
//! waits until the daemon has committed the whole file before copying (see
//! README, "Log rotation"); nothing else waits for the daemon.
//!
//! `torture_with_sigkills` does the same while killing the daemon with SIGKILL
//! at random moments and restarting it. `nginx_reopen_after_rename_loses_no_request`
//! has Debian's nginx write the log, renamed away and reopened with SIGUSR1.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    combined_line, http_get, now_ms, require, run_ok, wait_until, web_and_client, ConfigDir, Daemon, Redis, Rng, Rule,
};

const LINES: u64 = 1_000_000;
const PER_ROTATION: u64 = 100_000;
/// Lines per client address; far below the rule's limit, so nothing is banned.
const PER_ADDR: u64 = 50;
/// Lines per write(2), like nginx's `access_log ... buffer=`.
const BATCH: u64 = 100;
/// The writer looks for a rotation this often (nginx: when it is signalled).
const REOPEN_EVERY: u64 = 2_000;
const ROTATIONS: u64 = LINES / PER_ROTATION - 1;
const RULE: &str = "all";
/// The warm-up address (not one of the counted ones).
const WARMUP_ADDR: &str = "198.19.255.254";

#[derive(Clone, Copy, Debug)]
enum Style {
    RenameCreate,
    CopyTruncate,
    DeleteRecreate,
    LogrotateCreate,
    LogrotateCopyTruncate,
}

const STYLES: [Style; 5] = [
    Style::RenameCreate,
    Style::CopyTruncate,
    Style::DeleteRecreate,
    Style::LogrotateCreate,
    Style::LogrotateCopyTruncate,
];

struct Rig {
    /// The daemon's config, state and socket; the log in `logs/` of it,
    /// where the rotated files go too.
    files: ConfigDir,
    /// Held while a crash would lose lines whatever the daemon does.
    no_kill: Arc<Mutex<()>>,
    /// The daemon gets killed: wait for deleted files to be drained.
    kills: bool,
}

impl Rig {
    fn new(redis: &Redis, kills: bool) -> Rig {
        let files = ConfigDir::with_log("logs/access.log");
        let main = files
            .main_config()
            .host_id("torture")
            .log_firewall()
            .redis(&redis.url(), "timeout: 2s");
        let rule = Rule::new(RULE, &files.log, "{ hits: 1000, window: 1h }").format("combined");
        files.write(&main, &[rule]);
        for (name, mode) in [("create.conf", "create"), ("copytruncate.conf", "copytruncate")] {
            fs::write(
                files.path().join(name),
                format!(
                    "{} {{\n    rotate 10\n    {mode}\n    missingok\n    nocompress\n}}\n",
                    files.log.display()
                ),
            )
            .unwrap();
        }
        Rig {
            files,
            no_kill: Arc::default(),
            kills,
        }
    }

    fn start(&self) -> Daemon {
        Daemon::start(None, &self.files.cfg, &self.files.control)
    }

    fn logrotate(&self, conf: &str) {
        run_ok(
            Command::new(require("logrotate"))
                .arg("-f")
                .arg("-s")
                .arg(self.files.path().join("logrotate.state"))
                .arg(self.files.path().join(conf)),
        );
    }

    /// The committed entry of `path` in `offsets.json`: (inode, offset).
    fn committed(&self, path: &Path) -> Option<(u64, u64)> {
        let text = fs::read_to_string(self.files.state.join("offsets.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let e = &v["files"][path.to_str()?];
        Some((e["ino"].as_u64()?, e["offset"].as_u64()?))
    }

    /// `offsets.json` still has the rotated file `ino` to drain.
    fn draining(&self, ino: u64) -> bool {
        let text = fs::read_to_string(self.files.state.join("offsets.json")).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        v["rotated"]
            .as_array()
            .is_some_and(|r| r.iter().any(|e| e["ino"].as_u64() == Some(ino)))
    }

    /// Waits until the daemon has committed the file at the log path up to
    /// its current size (the writer must be paused).
    fn wait_committed(&self, daemon: &Mutex<Option<Daemon>>) {
        let m = fs::metadata(&self.files.log).unwrap();
        wait_until(Duration::from_secs(120), "daemon to commit the whole log", || {
            if let Some(d) = daemon.lock().unwrap().as_ref() {
                let _ = d.status(); // panics with its log if it died
            }
            self.committed(&self.files.log) == Some((m.ino(), m.len()))
        });
    }
}

/// Hour/day of a unix time in seconds as nginx writes it: `17/May/2015:10:05:03 +0000`.
fn nginx_time(secs: i64) -> String {
    let line = combined_line("192.0.2.1", secs * 1000, "/", 200);
    let open = line.find('[').unwrap();
    let close = line.find(']').unwrap();
    line[open + 1..close].to_owned()
}

/// Line `seq`, as described in the module docs.
fn line(seq: u64, times: &[String]) -> String {
    let a = seq / PER_ADDR;
    let t = &times[(seq % PER_ADDR) as usize];
    format!(
        "198.18.{}.{} - - [{t}] \"GET /p/{seq} HTTP/1.1\" 200 12 \"-\" \"torture\"\n",
        a >> 8,
        a & 255
    )
}

/// Shared between the writer thread and the rotator.
#[derive(Default)]
struct Writer {
    written: AtomicU64,
    /// The rotator asks the writer to stop writing (copytruncate)...
    pause: AtomicBool,
    /// ...and the writer says it has.
    parked: AtomicBool,
    done: AtomicBool,
    /// Rotations done so far.
    rotated: AtomicU64,
    /// The rotator is between its first and last step (logrotate running, a
    /// rename not yet followed by its create): the writer does not reopen
    /// now, as nginx reopens only when logrotate's postrotate tells it to.
    rotating: AtomicBool,
}

fn open_append(path: &Path) -> File {
    OpenOptions::new().create(true).append(true).open(path).unwrap()
}

fn write_all(log: PathBuf, w: Arc<Writer>, t0: i64) {
    let times: Vec<String> = (0..PER_ADDR as i64).map(|j| nginx_time(t0 + j)).collect();
    let mut file = open_append(&log);
    let mut buf = String::new();
    let mut seq = 0;
    while seq < LINES {
        // Rotation k happens while lines k*100k.. are written; the writer
        // does not run more than half a rotation interval ahead of it.
        let need = ((seq + PER_ROTATION / 2) / PER_ROTATION).saturating_sub(1);
        while w.pause.load(Ordering::SeqCst) || w.rotated.load(Ordering::SeqCst) < need.min(ROTATIONS) {
            if w.pause.load(Ordering::SeqCst) {
                w.parked.store(true, Ordering::SeqCst);
            } else if !w.rotating.load(Ordering::SeqCst) && fs::metadata(&log).is_err() {
                file = open_append(&log); // deleted: nginx would reopen on a signal
            }
            thread::sleep(Duration::from_millis(1));
        }
        w.parked.store(false, Ordering::SeqCst);
        if seq % REOPEN_EVERY == 0 && !w.rotating.load(Ordering::SeqCst) {
            let ours = file.metadata().unwrap().ino();
            match fs::metadata(&log) {
                Ok(m) if m.ino() == ours => {}
                _ => file = open_append(&log),
            }
        }
        buf.clear();
        for s in seq..seq + BATCH {
            buf += &line(s, &times);
        }
        file.write_all(buf.as_bytes()).unwrap();
        seq += BATCH;
        w.written.store(seq, Ordering::SeqCst);
    }
    w.done.store(true, Ordering::SeqCst);
}

/// Runs one rotation of `style` on the log.
fn rotate(rig: &Rig, round: u64, style: Style, w: &Writer, daemon: &Mutex<Option<Daemon>>) {
    // A file rotated away before the follower ever saw it cannot be read:
    // in real life a log stays at its path far longer than a poll interval.
    wait_until(Duration::from_secs(60), "daemon to open the current log", || {
        let ino = fs::metadata(&rig.files.log).map(|m| m.ino()).ok();
        ino.is_some() && rig.committed(&rig.files.log).map(|(i, _)| i) == ino
    });
    // Our own rotations name the old file after the round (like `dateext`):
    // writing a copy over an older rotated file still being drained would
    // destroy lines no follower has read yet.
    let rotated = rig.files.log.with_extension(format!("log.r{round}"));
    let copytruncate = |f: &dyn Fn()| {
        w.pause.store(true, Ordering::SeqCst);
        wait_until(Duration::from_secs(10), "writer to pause", || {
            w.parked.load(Ordering::SeqCst) || w.done.load(Ordering::SeqCst)
        });
        rig.wait_committed(daemon);
        f();
        w.pause.store(false, Ordering::SeqCst);
    };
    w.rotating.store(true, Ordering::SeqCst);
    match style {
        Style::RenameCreate => {
            fs::rename(&rig.files.log, &rotated).unwrap();
            File::create(&rig.files.log).unwrap();
        }
        Style::CopyTruncate => copytruncate(&|| {
            fs::copy(&rig.files.log, &rotated).unwrap();
            OpenOptions::new()
                .write(true)
                .open(&rig.files.log)
                .unwrap()
                .set_len(0)
                .unwrap();
        }),
        Style::DeleteRecreate => {
            let _guard = rig.no_kill.lock().unwrap();
            let old = fs::metadata(&rig.files.log).unwrap().ino();
            fs::remove_file(&rig.files.log).unwrap();
            w.rotating.store(false, Ordering::SeqCst); // the writer recreates it
            if !rig.kills {
                return;
            }
            wait_until(Duration::from_secs(60), "daemon to finish the deleted file", || {
                let now = fs::metadata(&rig.files.log).map(|m| m.ino()).ok();
                now.is_some() && rig.committed(&rig.files.log).map(|(i, _)| i) == now && !rig.draining(old)
            });
        }
        Style::LogrotateCreate => rig.logrotate("create.conf"),
        Style::LogrotateCopyTruncate => copytruncate(&|| rig.logrotate("copytruncate.conf")),
    }
    w.rotating.store(false, Ordering::SeqCst);
}

/// Sum of the members of every counted window (the warm-up one excluded).
const TOTAL_LUA: &str = r#"
local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do n = n + redis.call('ZCARD', k) end
return n"#;

/// Checks every window: exactly `per` members, scores the `per` seconds from
/// `t0`, each once. Returns "keys members bad" and the first bad windows.
const CHECK_LUA: &str = r#"
local per, t0 = tonumber(ARGV[2]), tonumber(ARGV[3])
local keys, members, bad, report = 0, 0, 0, {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  keys = keys + 1
  local seen, ok = {}, true
  local z = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
  for i = 2, #z, 2 do
    members = members + 1
    local j = (tonumber(z[i]) - t0 * 1000) / 1000
    if j < 0 or j >= per or j ~= math.floor(j) or seen[j] then ok = false end
    seen[j] = true
  end
  if #z / 2 ~= per then ok = false end
  if not ok then
    bad = bad + 1
    if #report < 5 then
      local js = {}
      for i = 2, #z, 2 do js[#js + 1] = tostring((tonumber(z[i]) - t0 * 1000) / 1000) end
      report[#report + 1] = k .. '=[' .. table.concat(js, ',') .. ']'
    end
  end
end
return keys .. ' ' .. members .. ' ' .. bad .. ' ' .. table.concat(report, ' ')"#;

fn window_pattern() -> String {
    format!("fleetban:win:{{*}}:198.18.*:{RULE}")
}

fn total(redis: &Redis) -> u64 {
    let out = redis.cli(&["EVAL", TOTAL_LUA, "0", &window_pattern()]);
    out.trim().parse().unwrap_or_else(|_| panic!("bad reply {out:?}"))
}

/// Writes warm-up lines until one is in Redis: from then on the daemon reads
/// the log from where it is (a file first seen at startup starts at its end).
fn warm_up(rig: &Rig, redis: &Redis) {
    let key = fleetban::store::Keys::new("fleetban").window(&format!("{WARMUP_ADDR}/32").parse().unwrap(), RULE, None);
    for _ in 0..100 {
        let l = combined_line(WARMUP_ADDR, now_ms(), "/warmup", 200);
        open_append(&rig.files.log).write_all(l.as_bytes()).unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(500) {
            if redis.cli(&["EXISTS", &key]) == "1" {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("the daemon never counted a warm-up line");
}

fn torture(kills: usize) {
    let redis = Redis::start();
    let rig = Rig::new(&redis, kills > 0);
    let daemon = Arc::new(Mutex::new(Some(rig.start())));
    warm_up(&rig, &redis);

    // In the past: a line dated more than 5 s ahead would be counted at the
    // time it is read (docs/design.md §2), not at the second it carries.
    let t0 = now_ms() / 1000 - PER_ADDR as i64 - 5;
    let w = Arc::new(Writer::default());
    let writer = {
        let (log, w) = (rig.files.log.clone(), Arc::clone(&w));
        thread::spawn(move || write_all(log, w, t0))
    };

    // The killer: SIGKILL at random moments (while the writer runs, or the
    // daemon catches up), restart after a random pause. Not while a deleted
    // file still has lines to read: nothing can open it after a restart.
    let killed = Arc::new(AtomicU64::new(0));
    // The logs of the daemons killed so far: each start truncates the file.
    let earlier = Arc::new(Mutex::new(String::new()));
    let killer = {
        let (daemon, killed, no_kill) = (Arc::clone(&daemon), Arc::clone(&killed), Arc::clone(&rig.no_kill));
        let earlier = Arc::clone(&earlier);
        let (cfg, control) = (rig.files.cfg.clone(), rig.files.control.clone());
        thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ t0 as u64);
            let mut sleep_ms = |max: u64| thread::sleep(Duration::from_millis(200 + rng.below(max)));
            for _ in 0..kills {
                sleep_ms(3000);
                let _guard = no_kill.lock().unwrap();
                let mut d = daemon.lock().unwrap();
                if let Some(d) = d.as_mut() {
                    d.kill9();
                    *earlier.lock().unwrap() += &d.log_text();
                }
                *d = None;
                drop(d);
                killed.fetch_add(1, Ordering::SeqCst);
                sleep_ms(800);
                *daemon.lock().unwrap() = Some(Daemon::start(None, &cfg, &control));
            }
        })
    };

    let started = Instant::now();
    for (i, round) in (1..=ROTATIONS).enumerate() {
        wait_until(Duration::from_secs(120), "writer to reach the next rotation", || {
            w.written.load(Ordering::SeqCst) >= round * PER_ROTATION
        });
        let style = STYLES[i % STYLES.len()];
        rotate(&rig, round, style, &w, &daemon);
        w.rotated.fetch_add(1, Ordering::SeqCst);
        eprintln!(
            "{:?}: rotation {round} by {style:?} at line {}",
            started.elapsed(),
            w.written.load(Ordering::SeqCst)
        );
    }
    writer.join().unwrap();
    eprintln!("{:?}: writer done", started.elapsed());
    assert_eq!(w.written.load(Ordering::SeqCst), LINES);
    killer.join().unwrap();
    assert_eq!(killed.load(Ordering::SeqCst), kills as u64, "kills done");

    // Everything arrives; then wait past the drain time of old files, so
    // anything read twice would show.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = 0;
    while Instant::now() < deadline {
        last = total(&redis);
        if last >= LINES {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    eprintln!("{:?}: {last} lines in Redis", started.elapsed());
    thread::sleep(Duration::from_secs(7));
    let d = daemon.lock().unwrap();
    let log = d.as_ref().map(|d| d.log_text()).unwrap_or_default();
    let out = redis.cli(&[
        "EVAL",
        CHECK_LUA,
        "0",
        &window_pattern(),
        &PER_ADDR.to_string(),
        &t0.to_string(),
    ]);
    let mut parts = out.splitn(4, ' ');
    let mut num = || parts.next().and_then(|p| p.parse::<u64>().ok()).unwrap_or(u64::MAX);
    let (keys, members, bad) = (num(), num(), num());
    let report = parts.next().unwrap_or("");
    if members != LINES {
        let keys = redis.cli(&["KEYS", &window_pattern()]);
        let mut have = vec![false; (LINES / PER_ADDR) as usize];
        for k in keys.lines() {
            // fleetban:win:{TAG}:198.18.A.B:RULE
            let addr = k.rsplit(':').nth(1).unwrap_or("");
            let o: Vec<u64> = addr.split('.').filter_map(|p| p.parse().ok()).collect();
            if o.len() == 4 {
                if let Some(h) = have.get_mut(((o[2] << 8) + o[3]) as usize) {
                    *h = true;
                }
            }
        }
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < have.len() {
            if !have[i] {
                let j = (i..have.len()).find(|&j| have[j]).unwrap_or(have.len());
                ranges.push(format!("lines {}..{}", i as u64 * PER_ADDR, j as u64 * PER_ADDR));
                i = j;
            } else {
                i += 1;
            }
        }
        eprintln!("missing: {ranges:?}");
        // A line read from the wrong place is counted under another address.
        let others: Vec<String> = redis
            .cli(&["KEYS", "fleetban:win:*"])
            .lines()
            .filter(|k| !k.contains(":198.18.") && !k.contains(WARMUP_ADDR))
            .take(10)
            .map(|k| format!("{k} ({})", redis.cli(&["ZCARD", k]).trim()))
            .collect();
        eprintln!("windows of other addresses: {others:?}");
    }
    // What the follower did in every run (rotations, drains, restarts)
    // and every warning, then the last lines of the daemon running now.
    let story: String = earlier
        .lock()
        .unwrap()
        .lines()
        .chain(log.lines())
        .filter(|l| {
            ["fleetban::source", "fleetban running", "WARN", "ERROR"]
                .iter()
                .any(|w| l.contains(w))
                && !l.contains("zset-max-listpack-entries")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let tail: String = log.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    assert!(
        keys == LINES / PER_ADDR && members == LINES && bad == 0,
        "windows {keys} (want {}), members {members} (want {LINES}, {last} before the quiet wait), \
         bad windows {bad}: {report}\nthe follower in every run:\n{story}\nlast daemon log lines (newest first):\n{tail}",
        LINES / PER_ADDR
    );
    let st = d.as_ref().map(|d| d.status()).unwrap();
    assert_eq!(st["bans"], 0, "{st}");
    assert_eq!(st["unparsed"], 0, "{st}");
}

#[test]
fn torture_a_million_lines_through_every_rotation_style() {
    torture(0);
}

#[test]
fn torture_with_sigkills() {
    torture(3);
}

/// nginx writes the log; it is renamed, nginx goes on writing to the renamed
/// file until `nginx -s reopen` (SIGUSR1), then writes a new one. Every
/// request is counted once: the client's window holds one member per request.
#[test]
fn nginx_reopen_after_rename_loses_no_request() {
    const T: Duration = Duration::from_secs(5);
    let redis = Redis::start();
    let (_web, client, nginx) = web_and_client("rotweb", "rotcli", "10.213.31", None);
    let log = nginx.access_log();
    let rotated = log.with_extension("log.1");

    let files = ConfigDir::new();
    files.write(
        &files.main_config().log_firewall().redis(&redis.url(), ""),
        &[Rule::new(RULE, &log, "{ hits: 1000, window: 1h }")],
    );
    let daemon = Daemon::start(None, &files.cfg, &files.control);
    let key = fleetban::store::Keys::new("fleetban").window(&"10.213.31.2/32".parse().unwrap(), RULE, None);
    let zcard = || redis.cli(&["ZCARD", &key]).parse::<u64>().unwrap();
    let get = |n: usize, what: &str| {
        for i in 0..n {
            assert_eq!(http_get(&client, &nginx.url(&format!("/{what}/{i}")), T), Ok(200));
        }
    };
    // Requests until one is counted: from then on the daemon reads the log
    // (a log first seen at startup is read from its end).
    wait_until(Duration::from_secs(20), "a first request counted", || {
        get(1, "warmup");
        zcard() > 0
    });
    // Then let the last warm-up requests settle before taking the baseline.
    wait_until(Duration::from_secs(20), "daemon to read the whole log", || {
        let size = fs::metadata(&log).unwrap().len();
        daemon.status()["sources"][0]["offset"].as_u64() == Some(size)
    });
    let mut base = zcard();
    // Settled: unchanged for longer than `redis.hold` (1 s), the longest a
    // hit far below the limit waits in the daemon.
    wait_until(Duration::from_secs(20), "the count to settle", || {
        thread::sleep(Duration::from_millis(1500));
        let now = zcard();
        std::mem::replace(&mut base, now) == now
    });

    get(20, "before");
    fs::rename(&log, &rotated).unwrap();
    get(20, "between"); // still written to access.log.1
    assert!(!log.exists(), "nginx writes the renamed file until it reopens");
    nginx.reopen();
    get(20, "after");
    assert!(log.exists());
    let between = fs::read_to_string(&rotated).unwrap().matches("GET /between/").count();
    assert_eq!(between, 20, "the renamed file got the requests made before the reopen");

    wait_until(Duration::from_secs(20), "every request counted", || {
        zcard() >= base + 60
    });
    thread::sleep(Duration::from_secs(1));
    assert_eq!(zcard(), base + 60, "each request counted once");
    let st = daemon.status();
    assert_eq!(st["unparsed"], 0, "{st}");
    assert_eq!(st["bans"], 0, "{st}");
}
