//! The `fleetban` command line: flags defined here, work done in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;

use commands::list::BanArgs;
use commands::{check, explain, list, run, status, test, Failure};

#[derive(Parser)]
#[command(
    name = "fleetban",
    version,
    about = "Fleet-wide ban daemon for nginx: Redis sliding windows, shared ban list, nftables"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (Type=notify under systemd).
    Run {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Decide and record bans, but never touch the firewall.
        #[arg(long)]
        dry_run: bool,
        /// Benchmark baseline only (bench/compare.sh): one EVALSHA
        /// per hit, each awaited, no pipeline. Not a user feature.
        #[arg(long, hide = true)]
        bench_one_call_per_hit: bool,
        /// Benchmark comparison only (bench/compare.sh): at most one
        /// limiter round trip in flight. Not a user feature.
        #[arg(long, hide = true)]
        bench_one_flight: bool,
    },
    /// Validate the configuration and the rules; exit 0, or 2 with every error.
    Check {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Replay log files through the rules with log time and the embedded store.
    Test {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Only this rule.
        #[arg(long)]
        rule: Option<String>,
        /// JSON Lines: one line per ban decided, then a summary.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        logs: Vec<PathBuf>,
    },
    /// The running daemon's state, through its control socket (works while
    /// a rule file has errors: only the main file is needed).
    Status {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// One JSON object (docs/design.md: the `status` fields).
        #[arg(long)]
        json: bool,
    },
    /// Active bans, fleet-wide: address, rule, since, until, time left,
    /// offence count, host, reason.
    Bans {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// JSON Lines, one ban each, RFC 3339 times, fields in a fixed order.
        #[arg(long)]
        json: bool,
    },
    /// Ban an address or network on every host. An active ban is never
    /// shortened (the later end wins) unless --replace is given.
    Ban {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// ADDR or CIDR (no host bits set), e.g. 192.0.2.7, 2001:db8::/64.
        target: String,
        /// How long, e.g. 1h, 30m, 7d (default 1h; at least 1s).
        #[arg(long = "for", conflicts_with = "permanent")]
        duration: Option<String>,
        /// Until unbanned.
        #[arg(long)]
        permanent: bool,
        /// Why, kept in the ban's record (an active ban keeps its reason
        /// unless a new one is given).
        #[arg(long, default_value = "")]
        reason: String,
        /// Replace an active ban even if this one ends sooner.
        #[arg(long)]
        replace: bool,
    },
    /// Lift a ban on every host; says which wider bans still cover it.
    Unban {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// ADDR or CIDR, as `ban` takes it.
        target: String,
    },
    /// Why an address is or is not banned: its ban, wider bans, its count
    /// in each rule's window, and what keeps it from ever being banned.
    Explain {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// ADDR or CIDR, as `ban` takes it.
        target: String,
        /// One JSON object (docs/design.md: the `explain` fields).
        #[arg(long)]
        json: bool,
    },
    /// Remove this host's nftables table and every ban in it; refused
    /// while a daemon runs on this configuration unless --force.
    Flush {
        /// The main configuration file (rule files with errors are a warning here).
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Flush even though a daemon runs (it re-creates the table within ~5 s).
        #[arg(long)]
        force: bool,
    },
    /// Print a shell completion script (packaging).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Print the man page, roff (packaging).
    #[command(hide = true)]
    Manpage,
}

fn main() -> ExitCode {
    match execute(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            failure.print();
            ExitCode::from(failure.code())
        }
    }
}

fn execute(command: Command) -> commands::Outcome {
    match command {
        Command::Run {
            config,
            dry_run,
            bench_one_call_per_hit,
            bench_one_flight,
        } => run::run(&config, dry_run, bench_one_call_per_hit, bench_one_flight),
        Command::Check { config } => check::check(&config),
        Command::Test {
            config,
            rule,
            json,
            logs,
        } => test::test(&config, rule.as_deref(), json, &logs),
        Command::Status { config, json } => status::status(&config, json),
        Command::Bans { config, json } => list::bans(&config, json),
        Command::Ban {
            config,
            target,
            duration,
            permanent,
            reason,
            replace,
        } => list::ban(
            &config,
            &BanArgs {
                target,
                duration,
                permanent,
                reason,
                replace,
            },
        ),
        Command::Unban { config, target } => list::unban(&config, &target),
        Command::Explain { config, target, json } => explain::explain(&config, &target, json),
        Command::Flush { config, force } => run::flush(&config, force),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "fleetban", &mut std::io::stdout());
            Ok(())
        }
        Command::Manpage => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map_err(|e| Failure::Runtime(anyhow::Error::new(e).context("fleetban"))),
    }
}
