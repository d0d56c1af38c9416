//! `fleetban completions SHELL`, and the hidden `fleetban __complete-rules`
//! it calls: clap_complete's script, in which `--rule` completes the rule
//! names of the configuration (the one given with `-c` on the line being
//! completed, else the default) instead of file names. bash, zsh and fish
//! get that; the other shells get clap's script as it is. Written whole
//! from a buffer: a reader that closes the pipe early (`| head`) ends the
//! command quietly, exit 0.

use std::path::Path;

use clap_complete::Shell;

use super::{write_stdout, Outcome};

/// bash: the rule names for `${cur}`, `-c FILE` taken from the words typed.
const BASH_RULES: &str = r#"_fleetban_rules() {
    local i cfg=()
    for ((i = 1; i < ${#COMP_WORDS[@]} - 1; i++)); do
        case "${COMP_WORDS[i]}" in
            -c|--config) cfg=(-c "${COMP_WORDS[i+1]}") ;;
            --config=*) cfg=(-c "${COMP_WORDS[i]#--config=}") ;;
        esac
    done
    COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" __complete-rules "${cfg[@]}" 2>/dev/null)" -- "$1"))
}

"#;

/// zsh: `_fleetban_rules`, with `-c`/`--config` from `opt_args`.
const ZSH_RULES: &str = r#"_fleetban_rules() {
    local cfg=${opt_args[-c]:-${opt_args[--config]}}
    local -a rules
    rules=(${(f)"$(${words[1]} __complete-rules ${cfg:+-c $cfg} 2>/dev/null)"})
    compadd -a rules
}

"#;

/// fish: `__fish_fleetban_rules`, with `-c`/`--config` from the line.
const FISH_RULES: &str = r#"function __fish_fleetban_rules
    set -l words (commandline -opc)
    set -l cfg
    for i in (seq (count $words))
        switch $words[$i]
            case -c --config
                set cfg -c $words[(math $i + 1)]
            case '--config=*'
                set cfg -c (string replace -- '--config=' '' $words[$i])
        end
    end
    $words[1] __complete-rules $cfg 2>/dev/null
end

"#;

/// The completion script for `shell`, `--rule` completing rule names.
pub fn script(shell: Shell, mut cmd: clap::Command) -> String {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "fleetban", &mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    match shell {
        Shell::Bash => bash(&text),
        Shell::Zsh => zsh(&text),
        Shell::Fish => fish(&text),
        _ => text,
    }
}

/// Every `--rule)` case completes with `_fleetban_rules` instead of `compgen -f`.
fn bash(text: &str) -> String {
    let mut out = String::from(BASH_RULES);
    let mut after_rule = false;
    for line in text.lines() {
        if after_rule && line.trim() == r#"COMPREPLY=($(compgen -f "${cur}"))"# {
            let indent = &line[..line.len() - line.trim_start().len()];
            out += &format!("{indent}_fleetban_rules \"${{cur}}\"\n");
        } else {
            out += line;
            out += "\n";
        }
        after_rule = line.trim() == "--rule)";
    }
    out
}

fn zsh(text: &str) -> String {
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.contains("--rule=[") {
            out += &line.replace(":RULE:_default'", ":RULE:_fleetban_rules'");
        } else {
            out += line;
        }
        out += "\n";
        if i == 0 {
            // After `#compdef fleetban`, which must stay the first line.
            out += "\n";
            out += ZSH_RULES;
        }
    }
    out
}

fn fish(text: &str) -> String {
    let mut out = String::from(FISH_RULES);
    for line in text.lines() {
        out += line;
        if line.contains(" -l rule ") && line.ends_with(" -r") {
            out += " -f -a '(__fish_fleetban_rules)'";
        }
        out += "\n";
    }
    out
}

/// Prints the script.
pub fn print(shell: Shell, cmd: clap::Command) -> Outcome {
    write_stdout(script(shell, cmd).as_bytes())
}

/// `fleetban __complete-rules`: the rule names, one a line; nothing when
/// the configuration cannot be loaded (a completion never prints errors).
pub fn rules(config: &Path) -> Outcome {
    let Ok(config) = fleetban::config::Config::load(config) else {
        return Ok(());
    };
    let mut text = String::new();
    for r in &config.rules {
        text += &r.name;
        text += "\n";
    }
    write_stdout(text.as_bytes())
}
