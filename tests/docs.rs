//! Documentation that cannot drift: every output block of README.md and
//! docs/*.md marked with the command it shows is that command's output,
//! run now from the repository's root with this build.
//!
//! The marker (ARCHITECTURE.md, "Docs checked against the binary"):
//!
//! ````text
//! <!-- output: fleetban check -c examples/check/fleetban.yaml -->
//! ```text
//! ...what it prints: stdout, then stderr...
//! ```
//! ````
//!
//! `<!-- output exit=N: ... -->` for a command that exits N (0 otherwise).
//! The command is split on whitespace (no shell; a word in double quotes
//! may hold spaces) and its first word must be `fleetban`.
//!
//! Normalized on both sides: trailing blanks, RFC 3339 times (`<TIME>`);
//! in the output only, the repository's absolute path (so a resolved path
//! reads as a relative one). `FLEETBAN_DOCS_UPDATE=1 cargo test --test
//! docs` rewrites every block with what the command prints now, for a
//! change that means to change them.
//!
//! `<!-- output scene=operator: fleetban bans -->` runs the command against
//! a daemon this test starts (the embedded store, the `log` firewall, host
//! `web-1`, `allow: [192.0.2.0/24]`, rule `scraper` of 100 hits a minute,
//! and 37 requests of 203.0.113.9 dated now in its log), with `-c` its
//! configuration; the scene's blocks run in document order, so a block
//! sees what the blocks above it did. Their text starts with the command
//! as typed (`$ fleetban bans`). Normalized besides: local times
//! (`<TIME>`), times from now (`in <SPAN>`, `<SPAN> ago`), milliseconds,
//! the lines/s rate, a pid, `left_s` and the runs of spaces that align a
//! table; the scene's paths are shown where a package installs them
//! (`/var/log/nginx/access.log`, `/var/lib/fleetban`, ...; output only).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One marked block of a document.
struct Block {
    /// The words after `output:`.
    argv: Vec<String>,
    exit: i32,
    /// The scene it runs in (`operator`), or none: the repository's root.
    scene: Option<String>,
    /// Byte range of the block's text (between the fences) in the document.
    body: std::ops::Range<usize>,
}

/// Every marked block of `text`; a marker without a ```text block right
/// after it is a failure.
fn blocks(file: &Path, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("<!-- output") {
        let start = from + at;
        let end = start
            + text[start..]
                .find("-->")
                .unwrap_or_else(|| panic!("{}: unclosed marker", file.display()));
        let marker = &text[start + "<!-- output".len()..end];
        let (head, command) = marker
            .split_once(':')
            .unwrap_or_else(|| panic!("{}: marker without `:`", file.display()));
        let (mut exit, mut scene) = (0, None);
        for word in head.split_whitespace() {
            if let Some(n) = word.strip_prefix("exit=").and_then(|n| n.parse().ok()) {
                exit = n;
            } else if let Some(name) = word.strip_prefix("scene=") {
                assert_eq!(name, "operator", "{}: unknown scene {name:?}", file.display());
                scene = Some(name.to_owned());
            } else {
                panic!("{}: bad marker head {head:?}", file.display());
            }
        }
        let argv = words(command);
        assert_eq!(
            argv.first().map(String::as_str),
            Some("fleetban"),
            "{}: {marker}",
            file.display()
        );
        let after = end + "-->".len();
        let rest = &text[after..];
        let fence = "\n```text\n";
        assert!(
            rest.starts_with(fence),
            "{}: `{command}`: no ```text block right after the marker",
            file.display()
        );
        let body_start = after + fence.len();
        let body_end = body_start
            + text[body_start..]
                .find("```\n")
                .unwrap_or_else(|| panic!("{}: unclosed block", file.display()));
        out.push(Block {
            argv,
            exit,
            scene,
            body: body_start..body_end,
        });
        from = body_end;
    }
    out
}

/// A marker's command: words split on whitespace, a double-quoted word
/// kept whole (without its quotes).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = command.trim();
    while !rest.is_empty() {
        let (word, after) = match rest.strip_prefix('"') {
            Some(q) => q.split_once('"').expect("a closing quote"),
            None => rest.split_once(char::is_whitespace).unwrap_or((rest, "")),
        };
        out.push(word.to_owned());
        rest = after.trim_start();
    }
    out
}

/// The command as typed in a scene block's first line.
fn typed(argv: &[String]) -> String {
    let quoted: Vec<String> = argv
        .iter()
        .map(|w| match w.contains(' ') {
            true => format!("\"{w}\""),
            false => w.clone(),
        })
        .collect();
    format!("$ {}", quoted.join(" "))
}

/// [`normalize`], then what a scene's output varies in from run to run.
fn normalize_scene(text: &str) -> String {
    let text = normalize(text);
    let subs = [
        (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z]+", "<TIME>"),
        (r"\bin \d+[dhms]( \d+[dhms])?", "in <SPAN>"),
        (r"\b\d+[dhms]( \d+[dhms])? ago", "<SPAN> ago"),
        (r"\b\d+ ms\b", "<MS>"),
        // lines/s, just before the lag: nothing else (an address) is touched.
        (r" \d+\.\d +<MS>", " <RATE> <MS>"),
        (r"\bpid \d+", "pid <PID>"),
        (r#""left_s":\d+"#, r#""left_s":<N>"#),
        (r" {2,}", " "),
    ];
    let mut text = text;
    for (pattern, with) in subs {
        text = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&text, with)
            .into_owned();
    }
    text
}

/// The daemon the `operator` blocks talk to (module doc).
struct Scene {
    dir: common::ConfigDir,
    daemon: common::Daemon,
}

impl Scene {
    fn start() -> Scene {
        use common::{ConfigDir, Daemon, Rule};
        let dir = ConfigDir::new();
        let main = dir
            .main_config()
            .host_id("web-1")
            .log_firewall()
            .allow("[192.0.2.0/24]");
        dir.write(
            &main,
            &[Rule::new("scraper", &dir.log, "{ hits: 100, window: 60s }").ban("1h")],
        );
        let daemon = Daemon::start(None, &dir.cfg, &dir.control);
        let now = fleetban::time_local(fleetban::now_ms());
        let line = format!("203.0.113.9 - - [{now}] \"GET /catalog HTTP/1.1\" 200 512 \"-\" \"curl/8.5.0\"\n");
        std::fs::write(&dir.log, line.repeat(37)).unwrap();
        daemon.wait_lines(37);
        Scene { dir, daemon }
    }

    /// `text` with the scene's paths where a package installs them.
    fn as_installed(&self, text: &str) -> String {
        let d = &self.dir;
        [
            (&d.log, "/var/log/nginx/access.log"),
            (&d.state, "/var/lib/fleetban"),
            (&d.control, "/run/fleetban/control.sock"),
            (&d.cfg, "/etc/fleetban/fleetban.yaml"),
            (&d.rules, "/etc/fleetban/rules.d/scraper.yaml"),
        ]
        .iter()
        .fold(text.to_owned(), |t, (path, installed)| {
            // In a table's column (two spaces or more after it), padded to
            // the width the column was laid out for.
            let path = path.display().to_string();
            let padded = format!("{installed:<w$}  ", w = path.chars().count());
            t.replace(&format!("{path}  "), &padded).replace(&path, installed)
        })
    }
}

/// Trailing blanks off every line and blank lines off the end: the text
/// a block shows (times as printed; they are normalized to compare).
fn trimmed(text: &str) -> String {
    let mut out: String = text.lines().map(|l| format!("{}\n", l.trim_end())).collect();
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Trailing blanks off every line; RFC 3339 times as `<TIME>`.
fn normalize(text: &str) -> String {
    let time = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)").unwrap();
    let text = time.replace_all(text, "<TIME>");
    let mut out: String = text.lines().map(|l| format!("{}\n", l.trim_end())).collect();
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// What the command prints now, as a block shows it (in `scene`, for a
/// scene's block).
fn output_of(block: &Block, scene: Option<&Scene>) -> (i32, String) {
    let mut args: Vec<String> = block.argv[1..].to_vec();
    if let Some(scene) = scene {
        let at = usize::from(!args.is_empty());
        args.splice(at..at, ["-c".to_owned(), scene.dir.cfg.display().to_string()]);
    }
    let out = Command::new(common::fleetban_bin())
        .args(&args)
        .current_dir(ROOT)
        .env("NO_COLOR", "1")
        .env("TZ", "UTC")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = text.replace(&format!("{ROOT}/"), "");
    match scene {
        None => (out.status.code().unwrap_or(-1), trimmed(&text)),
        Some(scene) => {
            let text = scene.as_installed(&text);
            let text = format!("{}\n{text}", typed(&block.argv));
            (out.status.code().unwrap_or(-1), trimmed(&text))
        }
    }
}

/// How a block's text and a command's output are compared.
fn comparable(block: &Block, text: &str) -> String {
    match block.scene {
        Some(_) => normalize_scene(text),
        None => normalize(text),
    }
}

fn documents() -> Vec<PathBuf> {
    let mut files = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_marked_output_block_is_what_the_binary_prints() {
    let update = std::env::var_os("FLEETBAN_DOCS_UPDATE").is_some_and(|v| !v.is_empty());
    let mut checked = Vec::new();
    let mut stale = Vec::new();
    let mut scene: Option<Scene> = None;
    for file in documents() {
        let mut text = std::fs::read_to_string(&file).unwrap();
        let found = blocks(&file, &text);
        // In document order (a scene's blocks build on each other) ...
        let mut now = Vec::new();
        for block in &found {
            if block.scene.is_some() && scene.is_none() {
                scene = Some(Scene::start());
            }
            let (code, output) = output_of(block, block.scene.as_ref().and(scene.as_ref()));
            let command = block.argv.join(" ");
            assert_eq!(
                code,
                block.exit,
                "{}: `{command}` exited {code}:\n{output}",
                file.display()
            );
            now.push(output);
            checked.push(command);
        }
        // ... and replaced from the last block up, so that earlier ranges stay right.
        for (block, output) in found.iter().zip(&now).rev() {
            if update && text[block.body.clone()] != **output {
                text.replace_range(block.body.clone(), output);
            } else if !update && comparable(block, &text[block.body.clone()]) != comparable(block, output) {
                stale.push(format!(
                    "{}: `{}` now prints:\n{output}\nthe block shows:\n{}",
                    file.display(),
                    block.argv.join(" "),
                    &text[block.body.clone()]
                ));
            }
        }
        if update {
            std::fs::write(&file, text).unwrap();
        }
    }
    if let Some(mut scene) = scene {
        scene.daemon.stop(std::time::Duration::from_secs(10));
    }
    assert!(
        stale.is_empty(),
        "{}\n(FLEETBAN_DOCS_UPDATE=1 rewrites them)",
        stale.join("\n")
    );
    for want in [
        "fleetban check",
        "--help",
        "fleetban test",
        "fleetban status",
        "fleetban bans",
        "fleetban explain",
    ] {
        assert!(
            checked.iter().any(|c| c.contains(want)),
            "no checked block of {want}: {checked:?}"
        );
    }
}

#[test]
fn a_block_that_drifted_is_found() {
    let doc = "intro\n<!-- output: fleetban --version -->\n```text\nfleetban 0.0.0-not-this\n```\n";
    let file = Path::new("inline.md");
    let found = blocks(file, doc);
    assert_eq!(found.len(), 1);
    let (code, now) = output_of(&found[0], None);
    assert_eq!(code, 0);
    assert_eq!(now, format!("fleetban {}\n", env!("CARGO_PKG_VERSION")));
    assert_ne!(normalize(&doc[found[0].body.clone()]), now);
}
