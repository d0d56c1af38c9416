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
//! The command is split on whitespace (no shell, no quoting) and its first
//! word must be `fleetban`. Normalized on both sides: trailing blanks, RFC
//! 3339 times (`<TIME>`); in the output only, the repository's absolute path
//! (so a resolved path reads as a relative one). `FLEETBAN_DOCS_UPDATE=1
//! cargo test --test docs` rewrites every block with what the command
//! prints now, for a change that means to change them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One marked block of a document.
struct Block {
    /// The words after `output:`.
    argv: Vec<String>,
    exit: i32,
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
        let exit = match head.trim() {
            "" => 0,
            e => e
                .strip_prefix("exit=")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{}: bad marker head {e:?}", file.display())),
        };
        let argv: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
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
            body: body_start..body_end,
        });
        from = body_end;
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

/// What the command prints now, as a block shows it.
fn output_of(block: &Block) -> (i32, String) {
    let out = Command::new(common::fleetban_bin())
        .args(&block.argv[1..])
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
    (out.status.code().unwrap_or(-1), normalize(&text))
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
    for file in documents() {
        let mut text = std::fs::read_to_string(&file).unwrap();
        let found = blocks(&file, &text);
        // From the last block up, so that earlier ranges stay right.
        for block in found.iter().rev() {
            let command = block.argv.join(" ");
            let (code, now) = output_of(block);
            assert_eq!(
                code,
                block.exit,
                "{}: `{command}` exited {code}:\n{now}",
                file.display()
            );
            if normalize(&text[block.body.clone()]) != now {
                match update {
                    true => text.replace_range(block.body.clone(), &now),
                    false => stale.push(format!(
                        "{}: `{command}` now prints:\n{now}\nthe block shows:\n{}",
                        file.display(),
                        &text[block.body.clone()]
                    )),
                }
            }
            checked.push(command);
        }
        if update {
            std::fs::write(&file, text).unwrap();
        }
    }
    assert!(
        stale.is_empty(),
        "{}\n(FLEETBAN_DOCS_UPDATE=1 rewrites them)",
        stale.join("\n")
    );
    for want in ["fleetban check", "--help"] {
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
    let (code, now) = output_of(&found[0]);
    assert_eq!(code, 0);
    assert_eq!(now, format!("fleetban {}\n", env!("CARGO_PKG_VERSION")));
    assert_ne!(normalize(&doc[found[0].body.clone()]), now);
}
