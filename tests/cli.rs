//! The command line's own surface, from the real binary: the man page
//! (every section, every subcommand and option, rendered by `man` without a
//! warning, no reference to a page that does not exist), the completion
//! scripts (bash run for real: `--rule` completes the configuration's rule
//! names), and no panic when the reader of stdout is gone.

mod common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{fleetban_bin, require, ConfigDir, Rule};

const LIMIT: &str = "{ hits: 10, window: 60s }";

/// Runs `fleetban ARGS` with stdout the write end of a pipe whose read end
/// is already closed: every write fails with EPIPE.
fn into_closed_pipe(args: &[&str]) -> std::process::Output {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors were just created and are owned once each.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Command::new(fleetban_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn commands_writing_into_a_closed_pipe_exit_quietly() {
    let c = ConfigDir::new();
    c.write(&c.main_config().log_firewall(), &[Rule::new("web", &c.log, LIMIT)]);
    let cfg = c.cfg.display().to_string();
    std::fs::write(
        &c.log,
        "198.51.100.1 - - [30/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"\n",
    )
    .unwrap();
    let log = c.log.display().to_string();
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["manpage"],
        &["check", "-c", &cfg],
        &["test", "-c", &cfg, &log],
        &["flush", "-c", &cfg],
        &["--help"],
    ] {
        let out = into_closed_pipe(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "fleetban {args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "fleetban {args:?}: {stderr}");
    }
}

fn run(args: &[&str]) -> String {
    let out = Command::new(fleetban_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fleetban {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The visible subcommands, as `fleetban --help` lists them.
fn subcommands() -> Vec<String> {
    let help = run(&["--help"]);
    let list = help.split("Commands:\n").nth(1).expect("a Commands: section");
    list.lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_man_page_has_every_section_subcommand_and_option_and_renders_cleanly() {
    let page = run(&["manpage"]);
    for section in [
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH DESCRIPTION",
        ".SH COMMANDS",
        ".SH CONFIGURATION",
        ".SH FILES",
        ".SH \"EXIT STATUS\"",
        ".SH EXAMPLES",
    ] {
        assert!(page.contains(section), "no {section} in the man page");
    }
    for file in [
        "/etc/fleetban/fleetban.yaml",
        "/etc/fleetban/rules.d/",
        "/var/lib/fleetban/",
        "/run/fleetban/control.sock",
        "offsets.json",
        "bans.json",
    ] {
        assert!(page.contains(file), "FILES names {file}");
    }
    let subs = subcommands();
    assert!(subs.len() >= 8, "{subs:?}");
    for sub in &subs {
        let heading = format!(".SS \"fleetban {}\"", sub.replace('-', "\\-"));
        let start = page.find(&heading).unwrap_or_else(|| panic!("no {heading}"));
        let body = &page[start + heading.len()..];
        let body = &body[..body.find(".SS ").or_else(|| body.find(".SH ")).unwrap_or(body.len())];
        // Every long option `fleetban SUB --help` lists is in its section.
        for opt in run(&[sub, "--help"]).split_whitespace().filter(|w| w.starts_with("--")) {
            let opt = opt.trim_end_matches([',', '.']).split(['=', '[']).next().unwrap();
            if opt == "--help" || opt.len() < 3 {
                continue;
            }
            let roff = opt.replace('-', "\\-");
            assert!(body.contains(&roff), "{heading} lacks {opt}");
        }
    }
    // One page, fleetban(1): no fleetban-SUB(1) is referenced.
    let refs = regex::Regex::new(r"fleetban\\?-[a-z]+\s*\(1\)").unwrap();
    assert!(!refs.is_match(&page), "a reference to a page that does not exist");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleetban.1");
    std::fs::write(&file, &page).unwrap();
    let out = Command::new(require("man"))
        .args(["--warnings=all", "-l"])
        .arg(&file)
        .env("MANWIDTH", "80")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // Bold and underline come as overstrikes (`X\x08X`): dropped.
    let overstrike = regex::Regex::new(".\x08").unwrap();
    let text = overstrike
        .replace_all(&String::from_utf8_lossy(&out.stdout), "")
        .into_owned();
    assert!(out.status.success(), "man: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "man -l warns");
    assert!(
        text.contains("EXIT STATUS") && text.contains("fleetban check"),
        "{text}"
    );
}

/// What bash's completion offers for `words` (the last one being completed),
/// with the script `fleetban completions bash` prints sourced in a bash
/// without profile. The words are passed as arguments to a fixed script.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let driver = dir.path().join("complete.bash");
    std::fs::write(
        &driver,
        "source \"$1\"\nshift\nCOMP_WORDS=(\"$@\")\nCOMP_CWORD=$(( $# - 1 ))\n\
         _fleetban \"$1\" \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"\n\
         printf '%s\\n' \"${COMPREPLY[@]}\"\n",
    )
    .unwrap();
    let out = Command::new(require("bash"))
        .args(["--norc", "--noprofile"])
        .arg(&driver)
        .arg(script)
        .args(words)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "bash: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completes_rule_names_after_rule_from_the_configuration_given() {
    let c = ConfigDir::new();
    c.write(
        &c.main_config().log_firewall(),
        &[
            Rule::new("alpha-scraper", &c.log, LIMIT),
            Rule::new("beta-login", &c.log, LIMIT),
        ],
    );
    std::fs::write(c.path().join("alpha-file"), "").unwrap();
    let script = c.path().join("fleetban.bash");
    std::fs::write(&script, run(&["completions", "bash"])).unwrap();
    let bin = fleetban_bin().display().to_string();
    let cfg = c.cfg.display().to_string();
    assert_eq!(
        bash_complete(&script, &[&bin, "test", "-c", &cfg, "--rule", ""]),
        ["alpha-scraper", "beta-login"]
    );
    assert_eq!(
        bash_complete(&script, &[&bin, "test", "--config", &cfg, "--rule", "al"]),
        ["alpha-scraper"],
        "rule names, not the file alpha-file"
    );
    assert_eq!(
        bash_complete(&script, &[&bin, "bans", "-c", &cfg, "--rule", "be"]),
        ["beta-login"],
        "`bans --rule` too"
    );
    // Another configuration, other names.
    let other = ConfigDir::new();
    other.write(&other.main_config(), &[Rule::new("gamma", &other.log, LIMIT)]);
    let other_cfg = other.cfg.display().to_string();
    assert_eq!(
        bash_complete(&script, &[&bin, "test", "-c", &other_cfg, "--rule", ""]),
        ["gamma"]
    );
    // The hidden helper the scripts call, and the other shells' hooks.
    assert_eq!(run(&["__complete-rules", "-c", &cfg]), "alpha-scraper\nbeta-login\n");
    assert!(run(&["completions", "zsh"]).contains(":RULE:_fleetban_rules'"));
    let fish = run(&["completions", "fish"]);
    let rule = fish.lines().find(|l| l.contains(" -l rule ")).unwrap_or_default();
    assert!(rule.ends_with(" -r -f -a '(__fish_fleetban_rules)'"), "{fish}");
}

/// The man page's configuration reference keeps up with README's table of
/// the main file's keys and the rule keys of its example rule.
#[test]
fn the_man_page_names_every_configuration_key_the_readme_lists() {
    let page = run(&["manpage"]);
    let reference = &page[page.find(".SH CONFIGURATION").expect("CONFIGURATION")..];
    let reference = &reference[..reference.find(".SH ENVIRONMENT").unwrap_or(reference.len())];
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let config = &readme[readme.find("\n## Configuration").unwrap()..];
    let config = &config[..config[1..].find("\n## ").map_or(config.len(), |i| i + 1)];
    let mut keys: Vec<&str> = config
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    assert!(keys.len() > 20, "README's table: {keys:?}");
    keys.extend([
        "name",
        "logs",
        "format",
        "match",
        "ignore",
        "limit",
        "ban",
        "escalate",
        "escalate_network",
    ]);
    for key in keys {
        let leaf = key.rsplit('.').next().unwrap().replace('-', "\\-");
        assert!(
            reference.contains(&format!("\\fB{leaf}\\fR"))
                || reference.contains(&format!(".B {leaf}\n"))
                || reference.contains(&format!(".B {key}\n")),
            "the man page's CONFIGURATION lacks {key}"
        );
    }
}
