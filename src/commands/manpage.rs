//! `fleetban manpage`: one page, fleetban(1), with every subcommand and its
//! options in COMMANDS (rendered from the clap definitions, so it cannot
//! drift from `--help`), then the hand-written reference of
//! `manpage.roff`: CONFIGURATION, FILES, EXIT STATUS, EXAMPLES. No
//! fleetban-SUB(1) pages exist, and none is referenced.

use std::io::Write;

use clap::{Arg, ArgAction, Command};

use super::{failed, write_stdout, Outcome};

/// The sections written by hand (roff), after COMMANDS.
const REFERENCE: &str = include_str!("manpage.roff");

/// The whole page, roff.
pub fn render(cmd: Command) -> std::io::Result<Vec<u8>> {
    let cmd = cmd.disable_help_subcommand(true);
    let man = clap_mangen::Man::new(cmd.clone()).source(concat!("fleetban ", env!("CARGO_PKG_VERSION")));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    writeln!(out, ".SH COMMANDS")?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        subcommand(&mut out, sub)?;
    }
    out.extend_from_slice(REFERENCE.as_bytes());
    Ok(out)
}

/// Prints the page.
pub fn print(cmd: Command) -> Outcome {
    write_stdout(&render(cmd).map_err(failed)?)
}

/// `.SS fleetban NAME`, its synopsis, its long help, its options.
fn subcommand(out: &mut Vec<u8>, sub: &Command) -> std::io::Result<()> {
    let name = sub.get_name();
    writeln!(out, ".SS \"fleetban {}\"", roff(name))?;
    let args: Vec<&Arg> = sub.get_arguments().filter(|a| !a.is_hide_set()).collect();
    let mut synopsis = format!("\\fBfleetban {}\\fR", roff(name));
    for a in &args {
        synopsis += " ";
        synopsis += &short_usage(a);
    }
    writeln!(out, ".PP\n{synopsis}")?;
    let about = sub
        .get_long_about()
        .or(sub.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default();
    for para in about.split("\n\n").filter(|p| !p.trim().is_empty()) {
        writeln!(
            out,
            ".PP\n{}",
            roff(&para.split_whitespace().collect::<Vec<_>>().join(" "))
        )?;
    }
    for a in &args {
        writeln!(out, ".TP\n{}", usage(a))?;
        let help = a
            .get_long_help()
            .or(a.get_help())
            .map(|s| s.to_string())
            .unwrap_or_default();
        let mut text = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let defaults: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if !defaults.is_empty() && defaults.iter().any(|d| !d.is_empty()) {
            text += &format!(" (default {})", defaults.join(", "));
        }
        writeln!(out, "{}", roff(&text))?;
    }
    Ok(())
}

/// For a synopsis: `[\fB\-c\fR \fIFILE\fR]`, `\fITARGET\fR`: one name, brackets
/// when optional.
fn short_usage(a: &Arg) -> String {
    if a.is_positional() {
        return usage(a);
    }
    let mut u = match (a.get_short(), a.get_long()) {
        (Some(s), _) => format!("\\fB\\-{}\\fR", roff(&s.to_string())),
        (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", roff(l)),
        (None, None) => String::new(),
    };
    if matches!(a.get_action(), ArgAction::Set | ArgAction::Append) {
        u += &format!(" \\fI{}\\fR", roff(&value_name(a)));
    }
    match a.is_required_set() {
        true => u,
        false => format!("[{u}]"),
    }
}

fn value_name(a: &Arg) -> String {
    a.get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().to_string().to_uppercase())
}

/// `\fB\-c\fR, \fB\-\-config\fR \fIFILE\fR`, or `\fILOGS\fR...` for a positional.
fn usage(a: &Arg) -> String {
    let value = value_name(a);
    let takes_value = matches!(a.get_action(), ArgAction::Set | ArgAction::Append);
    if a.is_positional() {
        let many = matches!(a.get_action(), ArgAction::Append);
        return format!("\\fI{}\\fR{}", roff(&value), if many { "..." } else { "" });
    }
    let mut names = Vec::new();
    if let Some(s) = a.get_short() {
        names.push(format!("\\fB\\-{}\\fR", roff(&s.to_string())));
    }
    if let Some(l) = a.get_long() {
        names.push(format!("\\fB\\-\\-{}\\fR", roff(l)));
    }
    let mut u = names.join(", ");
    if takes_value {
        u += &format!(" \\fI{}\\fR", roff(&value));
    }
    u
}

/// Text safe in roff: backslashes and dashes escaped, no line starting
/// with a control character.
fn roff(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}
