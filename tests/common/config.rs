//! fleetban's configuration as the tests write it: a main `fleetban.yaml`
//! ([`MainConfig`]) and a rule file ([`Rule`]), rendered as an operator would
//! type them, in a temp dir that also holds the daemon's access log, state
//! and control socket ([`ConfigDir`]). The knobs take the YAML of their value
//! (`"{ hits: 5, window: 60s }"`), so a test reads like the file it writes.
//! Tests about the YAML itself (errors at a line and column) keep writing it
//! by hand.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// `key: value` lines written in one fixed key order, whatever the order
/// they were set in.
#[derive(Clone, Debug)]
struct Keys {
    /// The keys the file may have, in the order they are written.
    order: &'static [&'static str],
    /// The value of `order[i]`, as YAML.
    values: Vec<Option<String>>,
}

impl Keys {
    fn new(order: &'static [&'static str]) -> Keys {
        Keys {
            order,
            values: vec![None; order.len()],
        }
    }

    fn set(mut self, key: &str, value: String) -> Keys {
        let i = self.order.iter().position(|k| *k == key);
        self.values[i.unwrap_or_else(|| panic!("no key {key} in {:?}", self.order))] = Some(value);
        self
    }

    /// Appends the lines that are set to `y`, each after `indent`.
    fn write(&self, y: &mut String, indent: &str) {
        for (key, value) in self.order.iter().zip(&self.values) {
            if let Some(v) = value {
                let _ = writeln!(y, "{indent}{key}: {v}");
            }
        }
    }
}

/// One rule of a rule file; its keys come out as an operator orders them
/// (name, logs, format, match, ignore, limit, ban).
#[derive(Clone, Debug)]
pub struct Rule {
    /// `name:`, the list item's first line.
    name: String,
    /// The rest of the rule.
    keys: Keys,
}

impl Rule {
    /// Rule `name` reading `log`, with `limit` the YAML of its `limit:`.
    pub fn new(name: &str, log: impl AsRef<Path>, limit: &str) -> Rule {
        let keys = Keys::new(&["logs", "format", "match", "ignore", "limit", "ban", "escalate_network"])
            .set("logs", format!("[{}]", log.as_ref().display()))
            .set("limit", limit.to_owned());
        Rule {
            name: name.to_owned(),
            keys,
        }
    }

    fn set(mut self, key: &str, value: String) -> Rule {
        self.keys = self.keys.set(key, value);
        self
    }

    /// `format:`, when not the default `combined`.
    pub fn format(self, format: &str) -> Rule {
        self.set("format", format.to_owned())
    }

    /// `match:`, e.g. `"{ method: [GET] }"`.
    pub fn matching(self, matches: &str) -> Rule {
        self.set("match", matches.to_owned())
    }

    /// `ignore:`, e.g. `"{ path: '^/static/' }"`.
    pub fn ignoring(self, ignore: &str) -> Rule {
        self.set("ignore", ignore.to_owned())
    }

    /// `ban: { duration: <duration> }`; without it the rule's default ban.
    pub fn ban(self, duration: &str) -> Rule {
        self.set("ban", format!("{{ duration: {duration} }}"))
    }

    /// `escalate_network:`, e.g. `"{ bans: 5, within: 1h, duration: 1d }"`.
    pub fn escalate_network(self, yaml: &str) -> Rule {
        self.set("escalate_network", yaml.to_owned())
    }
}

/// The text of a rule file holding `rules`.
pub fn rules_yaml(rules: &[Rule]) -> String {
    let mut y = String::from("rules:\n");
    for r in rules {
        let _ = writeln!(y, "  - name: {}", r.name);
        r.keys.write(&mut y, "    ");
    }
    y
}

/// The main configuration file. Its keys come out in one fixed order
/// (host_id, state_dir, control, allow, proxies, firewall, metrics, safety,
/// http, notify, redis, rules), one line each unless a verbatim `redis` section spans more, so a
/// test can name the line an error is reported at.
#[derive(Clone, Debug)]
pub struct MainConfig {
    /// The one-line keys before `redis`.
    keys: Keys,
    /// The whole `redis:` section, newline-terminated.
    redis: Option<String>,
    /// The entries of `rules:`.
    rule_files: Vec<String>,
}

impl MainConfig {
    /// `rules: [rules.yaml]` and nothing else: the embedded store, nft, the
    /// default paths.
    pub fn new() -> MainConfig {
        MainConfig {
            keys: Keys::new(&[
                "host_id",
                "state_dir",
                "control",
                "allow",
                "proxies",
                "firewall",
                "metrics",
                "safety",
                "http",
                "notify",
            ]),
            redis: None,
            rule_files: vec!["rules.yaml".to_owned()],
        }
    }

    fn set(mut self, key: &str, value: String) -> MainConfig {
        self.keys = self.keys.set(key, value);
        self
    }

    pub fn host_id(self, id: &str) -> MainConfig {
        self.set("host_id", id.to_owned())
    }

    pub fn state_dir(self, dir: &Path) -> MainConfig {
        self.set("state_dir", dir.display().to_string())
    }

    pub fn control(self, socket: &Path) -> MainConfig {
        self.set("control", socket.display().to_string())
    }

    /// `allow:`, e.g. `"[192.0.2.0/24]"`.
    pub fn allow(self, list: &str) -> MainConfig {
        self.set("allow", list.to_owned())
    }

    /// `proxies:`, the hops trusted to name the client, e.g. `"[10.213.61.1]"`.
    pub fn proxies(self, list: &str) -> MainConfig {
        self.set("proxies", list.to_owned())
    }

    /// `firewall:`, e.g. `"{ backend: log }"` or `"{ table: t }"`.
    pub fn firewall(self, firewall: &str) -> MainConfig {
        self.set("firewall", firewall.to_owned())
    }

    /// `firewall: { backend: log }`: bans are logged, nft is never run.
    pub fn log_firewall(self) -> MainConfig {
        self.firewall("{ backend: log }")
    }

    /// `metrics:`, the address of the Prometheus endpoint.
    pub fn metrics(self, addr: &str) -> MainConfig {
        self.set("metrics", addr.to_owned())
    }

    /// `safety:`, e.g. `"{ max_bans_per_minute: 2 }"`.
    pub fn safety(self, safety: &str) -> MainConfig {
        self.set("safety", safety.to_owned())
    }

    /// `http:`, the decision endpoint, e.g. `"{ listen: /run/x.sock }"` or
    /// `"{ listen: '127.0.0.1:8080', deny_status: 429 }"`.
    pub fn http(self, section: &str) -> MainConfig {
        self.set("http", section.to_owned())
    }

    /// `notify:`, the webhook targets, e.g. `"[{ url: 'http://127.0.0.1:9/x' }]"`.
    pub fn notify(self, targets: &str) -> MainConfig {
        self.set("notify", targets.to_owned())
    }

    /// `redis: { url: '<url>', <options> }`; `options` (`"timeout: 2s,
    /// hold: 60s"`) may be empty.
    pub fn redis(self, url: &str, options: &str) -> MainConfig {
        let options = if options.is_empty() {
            String::new()
        } else {
            format!(", {options}")
        };
        self.redis_yaml(&format!("redis: {{ url: '{url}'{options} }}\n"))
    }

    /// The `redis:` section verbatim (a sentinel, a cluster, a block that
    /// spans lines), newline-terminated.
    pub fn redis_yaml(self, section: &str) -> MainConfig {
        assert!(section.ends_with('\n'), "a redis section ends its line: {section:?}");
        MainConfig {
            redis: Some(section.to_owned()),
            ..self
        }
    }

    /// `rules:` naming these files (instead of `rules.yaml`).
    pub fn rule_files(self, files: &[PathBuf]) -> MainConfig {
        MainConfig {
            rule_files: files.iter().map(|f| format!("'{}'", f.display())).collect(),
            ..self
        }
    }

    /// The file's text.
    pub fn yaml(&self) -> String {
        let mut y = String::new();
        self.keys.write(&mut y, "");
        if let Some(r) = &self.redis {
            y += r;
        }
        let _ = writeln!(y, "rules: [{}]", self.rule_files.join(", "));
        y
    }

    /// Writes the file at `path`.
    pub fn write(&self, path: &Path) {
        fs::write(path, self.yaml()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// A temp dir holding one daemon's files: `fleetban.yaml`, `rules.yaml`, an
/// access log (`access.log`, created empty), and the paths of its state
/// directory and control socket. Removed on Drop.
pub struct ConfigDir {
    /// The dir itself; everything in it goes with it.
    pub dir: TempDir,
    /// `fleetban.yaml`.
    pub cfg: PathBuf,
    /// `rules.yaml`, the file [`MainConfig::new`] names.
    pub rules: PathBuf,
    /// The access log the rules usually read.
    pub log: PathBuf,
    /// Where [`ConfigDir::main_config`] puts the control socket.
    pub control: PathBuf,
    /// Where [`ConfigDir::main_config`] puts `state_dir` (offsets, bans).
    pub state: PathBuf,
}

impl ConfigDir {
    /// A fresh dir with an empty `access.log`; nothing else written yet.
    pub fn new() -> ConfigDir {
        ConfigDir::with_log("access.log")
    }

    /// As [`ConfigDir::new`], the log at `log` (relative, e.g.
    /// `logs/access.log`: a folder of its own for rotated files).
    pub fn with_log(log: &str) -> ConfigDir {
        let dir = tempfile::Builder::new()
            .prefix("fbt-cfg-")
            .tempdir()
            .expect("create temp dir for a config");
        let d = dir.path();
        let (cfg, rules, control, state) = (
            d.join("fleetban.yaml"),
            d.join("rules.yaml"),
            d.join("control.sock"),
            d.join("state"),
        );
        let c = ConfigDir {
            log: d.join(log),
            dir,
            cfg,
            rules,
            control,
            state,
        };
        let parent = c.log.parent().expect("a log in the dir");
        fs::create_dir_all(parent).expect("create the log's folder");
        fs::write(&c.log, "").expect("create the access log");
        c
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A main config for a daemon living here: its `state_dir` and `control`
    /// in this dir, `rules: [rules.yaml]`.
    pub fn main_config(&self) -> MainConfig {
        MainConfig::new().state_dir(&self.state).control(&self.control)
    }

    /// Writes `fleetban.yaml` and `rules.yaml`.
    pub fn write(&self, main: &MainConfig, rules: &[Rule]) {
        self.write_rules(rules);
        main.write(&self.cfg);
    }

    /// (Re)writes `rules.yaml` alone, as before a SIGHUP.
    pub fn write_rules(&self, rules: &[Rule]) {
        fs::write(&self.rules, rules_yaml(rules)).expect("write rules.yaml");
    }

    /// Another empty log in this dir.
    pub fn empty_log(&self, name: &str) -> PathBuf {
        let p = self.path().join(name);
        fs::write(&p, "").expect("create a log");
        p
    }
}
