//! What each subcommand does, for `main.rs`: the binary's side of fleetban
//! (the library does the work). Every command returns `Result<(), Failure>`;
//! `main` prints a failure once and exits with its code.

pub mod bans;
pub mod check;
pub mod completions;
pub mod explain;
pub mod human;
pub mod list;
pub mod manpage;
pub mod progress;
pub mod run;
pub mod status;
pub mod test;
pub mod top;

use std::path::Path;

use fleetban::config::{Config, ConfigErrors};

/// Why a command failed: `main` prints it once and exits with [`Failure::code`].
pub enum Failure {
    /// Bad arguments: exit 2.
    Usage(String),
    /// The configuration has errors, each with file:line:column: exit 2.
    Config(ConfigErrors),
    /// Something failed while running: exit 1.
    Runtime(anyhow::Error),
}

impl Failure {
    pub fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) | Failure::Config(_) => 2,
            Failure::Runtime(_) => 1,
        }
    }

    pub fn print(&self) {
        match self {
            Failure::Usage(m) => eprintln!("{m}"),
            Failure::Config(errs) => {
                eprintln!("{errs}");
                eprintln!("{} error(s) in the configuration", errs.0.len());
            }
            Failure::Runtime(e) => eprintln!("{}", once(e)),
        }
    }
}

/// An error and its causes on one line, each said once: a cause whose
/// text the message already holds (`reading X: Permission denied` over
/// `Permission denied`) is not repeated.
pub fn once(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// A single host's ban list when its daemon is not running: the list the
/// daemon saved (`state_dir/bans.json`), said so on stderr (`why`: how the
/// daemon could not be reached).
pub fn saved_bans(
    config: &Config,
    why: &fleetban::control::ControlError,
) -> Result<Vec<fleetban::bans::BanRecord>, Failure> {
    let mut list = saved_list(config, why)?;
    runtime().block_on(list.records(fleetban::now_ms())).map_err(failed)
}

/// The list behind [`saved_bans`], said on stderr, for a caller already
/// in the runtime.
pub fn saved_list(config: &Config, why: &fleetban::control::ControlError) -> Result<fleetban::bans::BanList, Failure> {
    let file = config.state_dir.join("bans.json");
    let list = fleetban::bans::BanList::memory(Some(file.clone()));
    if list.lost_at_start() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "{why}; and the list it saved, {}, cannot be read",
            file.display()
        )));
    }
    eprintln!(
        "fleetban is not running ({} refuses or is absent): reading the list it saved, {}",
        config.control.display(),
        file.display()
    );
    Ok(list)
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Runtime(e)
    }
}

/// A library error as a runtime failure.
pub fn failed(e: impl std::error::Error + Send + Sync + 'static) -> Failure {
    Failure::Runtime(e.into())
}

pub type Outcome = Result<(), Failure>;

/// `println!` for the commands' output: a reader that closed the pipe
/// (`fleetban bans | head -1`) ends the command quietly with exit 0, as
/// the default SIGPIPE would (fleetban ignores SIGPIPE: nft's stdin and the
/// sockets need the error instead); what the command was to do is done.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::commands::say_line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// One line on stdout (the body of [`say!`]).
pub fn say_line(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("fleetban: writing the output: {e}");
            std::process::exit(1)
        }
    }
}

/// Writes `bytes` to stdout; a reader gone (`EPIPE`) is no failure.
pub fn write_stdout(bytes: &[u8]) -> Outcome {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(failed),
    }
}

/// The configuration at `path`, or every error in it.
pub fn load(path: &Path) -> Result<Config, Failure> {
    Config::load(path).map_err(Failure::Config)
}

/// The configuration for a command that talks to the daemon or to Redis
/// (`Config::load_for_cli`): errors in rule files are a one-line warning on
/// stderr, not a failure; errors in the main file still fail.
pub fn load_for_cli(path: &Path) -> Result<Config, Failure> {
    let (config, rule_errors) = Config::load_for_cli(path).map_err(Failure::Config)?;
    if let Some(errs) = rule_errors {
        eprintln!(
            "warning: the rule files have {} error(s) (run `fleetban check -c {}`); going on with the main file{}",
            errs.0.len(),
            path.display(),
            if config.rules.is_empty() {
                String::new()
            } else {
                format!(" and the {} rule(s) that loaded", config.rules.len())
            }
        );
    }
    Ok(config)
}

/// The runtime of the commands that talk to Redis or nft.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}
