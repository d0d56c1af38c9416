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

/// One rule of a rule file.
#[derive(Clone, Debug)]
pub struct Rule {
    name: String,
    logs: Vec<PathBuf>,
    /// `format:` (YAML of the value), when not the default `combined`.
    format: Option<String>,
    /// `match:` (YAML of the value).
    matches: Option<String>,
    /// `ignore:` (YAML of the value).
    ignore: Option<String>,
    /// `limit:` (YAML of the value).
    limit: String,
    /// `ban: { duration: ... }`; None leaves the rule's default ban.
    ban: Option<String>,
}

impl Rule {
    /// Rule `name` reading `log`, with `limit` the YAML of its `limit:`.
    pub fn new(name: &str, log: impl AsRef<Path>, limit: &str) -> Rule {
        Rule {
            name: name.to_owned(),
            logs: vec![log.as_ref().to_path_buf()],
            format: None,
            matches: None,
            ignore: None,
            limit: limit.to_owned(),
            ban: None,
        }
    }

    pub fn format(self, format: &str) -> Rule {
        Rule {
            format: Some(format.to_owned()),
            ..self
        }
    }

    /// `match:`, e.g. `"{ method: [GET] }"`.
    pub fn matching(self, matches: &str) -> Rule {
        Rule {
            matches: Some(matches.to_owned()),
            ..self
        }
    }

    /// `ignore:`, e.g. `"{ path: '^/static/' }"`.
    pub fn ignoring(self, ignore: &str) -> Rule {
        Rule {
            ignore: Some(ignore.to_owned()),
            ..self
        }
    }

    /// `ban: { duration: <duration> }`.
    pub fn ban(self, duration: &str) -> Rule {
        Rule {
            ban: Some(duration.to_owned()),
            ..self
        }
    }
}

/// The text of a rule file holding `rules`.
pub fn rules_yaml(rules: &[Rule]) -> String {
    let mut y = String::from("rules:\n");
    for r in rules {
        let logs: Vec<String> = r.logs.iter().map(|l| l.display().to_string()).collect();
        let _ = writeln!(y, "  - name: {}\n    logs: [{}]", r.name, logs.join(", "));
        for (key, value) in [("format", &r.format), ("match", &r.matches), ("ignore", &r.ignore)] {
            if let Some(v) = value {
                let _ = writeln!(y, "    {key}: {v}");
            }
        }
        let _ = writeln!(y, "    limit: {}", r.limit);
        if let Some(d) = &r.ban {
            let _ = writeln!(y, "    ban: {{ duration: {d} }}");
        }
    }
    y
}

/// The main configuration file. Its keys come out in one fixed order
/// (host_id, state_dir, control, allow, firewall, metrics, safety, redis,
/// rules), one line each unless a verbatim `redis` section spans more, so a
/// test can name the line an error is reported at.
#[derive(Clone, Debug)]
pub struct MainConfig {
    host_id: Option<String>,
    state_dir: Option<PathBuf>,
    control: Option<PathBuf>,
    allow: Option<String>,
    firewall: Option<String>,
    metrics: Option<String>,
    safety: Option<String>,
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
            host_id: None,
            state_dir: None,
            control: None,
            allow: None,
            firewall: None,
            metrics: None,
            safety: None,
            redis: None,
            rule_files: vec!["rules.yaml".to_owned()],
        }
    }

    pub fn host_id(self, id: &str) -> MainConfig {
        MainConfig {
            host_id: Some(id.to_owned()),
            ..self
        }
    }

    pub fn state_dir(self, dir: &Path) -> MainConfig {
        MainConfig {
            state_dir: Some(dir.to_path_buf()),
            ..self
        }
    }

    pub fn control(self, socket: &Path) -> MainConfig {
        MainConfig {
            control: Some(socket.to_path_buf()),
            ..self
        }
    }

    /// `allow:`, e.g. `"[192.0.2.0/24]"`.
    pub fn allow(self, list: &str) -> MainConfig {
        MainConfig {
            allow: Some(list.to_owned()),
            ..self
        }
    }

    /// `firewall:`, e.g. `"{ backend: log }"` or `"{ table: t }"`.
    pub fn firewall(self, firewall: &str) -> MainConfig {
        MainConfig {
            firewall: Some(firewall.to_owned()),
            ..self
        }
    }

    /// `firewall: { backend: log }`: bans are logged, nft is never run.
    pub fn log_firewall(self) -> MainConfig {
        self.firewall("{ backend: log }")
    }

    /// `metrics:` the address of the Prometheus endpoint.
    pub fn metrics(self, addr: &str) -> MainConfig {
        MainConfig {
            metrics: Some(addr.to_owned()),
            ..self
        }
    }

    /// `safety:`, e.g. `"{ max_bans_per_minute: 2 }"`.
    pub fn safety(self, safety: &str) -> MainConfig {
        MainConfig {
            safety: Some(safety.to_owned()),
            ..self
        }
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
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        for (key, value) in [
            ("host_id", self.host_id.clone()),
            ("state_dir", path(&self.state_dir)),
            ("control", path(&self.control)),
            ("allow", self.allow.clone()),
            ("firewall", self.firewall.clone()),
            ("metrics", self.metrics.clone()),
            ("safety", self.safety.clone()),
        ] {
            if let Some(v) = value {
                let _ = writeln!(y, "{key}: {v}");
            }
        }
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
    pub dir: TempDir,
    /// `fleetban.yaml`.
    pub cfg: PathBuf,
    /// `rules.yaml`, the file [`MainConfig::new`] names.
    pub rules: PathBuf,
    /// The access log the rules usually read.
    pub log: PathBuf,
    pub control: PathBuf,
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
