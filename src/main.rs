//! The `fleetban` command line: flags defined here, work done in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;

use commands::list::BanArgs;
use commands::{check, list, run, status, test, Failure};

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
        /// The configuration file.
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Only this rule; repeat for several (default: every rule).
        #[arg(long = "rule", value_name = "NAME")]
        rules: Vec<String>,
        /// Print these lines, each as FILE:LINE: (repeat, or separate with commas).
        #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND")]
        print: Vec<test::PrintKind>,
        /// Only lines dated at or after TIME: RFC 3339 with a zone, or a duration before now (2h).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only lines dated before TIME: RFC 3339 with a zone, or a duration before now (30m).
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// How many clients closest to each rule's limit (not banned) to list.
        #[arg(long, value_name = "N", default_value_t = fleetban::replay::CLOSEST)]
        top: usize,
        /// JSON Lines: printed lines and bans in log order, then a summary.
        #[arg(long)]
        json: bool,
        /// Log files, directories (their files, rotated ones oldest first), or - for
        /// standard input; none: the rules' own logs.
        #[arg(value_name = "LOG")]
        logs: Vec<PathBuf>,
    },
    /// The running daemon's state, through its control socket.
    Status {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Active bans, fleet-wide.
    Bans {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Ban an address or network on every host.
    Ban {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// ADDR or CIDR.
        target: String,
        /// How long, e.g. 1h, 30m, 7d (default 1h).
        #[arg(long = "for", conflicts_with = "permanent")]
        duration: Option<String>,
        /// Until unbanned.
        #[arg(long)]
        permanent: bool,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lift a ban on every host.
    Unban {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// ADDR or CIDR.
        target: String,
    },
    /// Remove this host's nftables table and every ban in it.
    Flush {
        #[arg(short, long, default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
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
            rules,
            print,
            since,
            until,
            top,
            json,
            logs,
        } => test::test(
            &config,
            &test::TestArgs {
                rules,
                print,
                since,
                until,
                top,
                json,
                logs,
            },
        ),
        Command::Status { config, json } => status::status(&config, json),
        Command::Bans { config, json } => list::bans(&config, json),
        Command::Ban {
            config,
            target,
            duration,
            permanent,
            reason,
        } => list::ban(
            &config,
            &BanArgs {
                target,
                duration,
                permanent,
                reason,
            },
        ),
        Command::Unban { config, target } => list::unban(&config, &target),
        Command::Flush { config } => run::flush(&config),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "fleetban", &mut std::io::stdout());
            Ok(())
        }
        Command::Manpage => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .map_err(|e| Failure::Runtime(anyhow::Error::new(e).context("fleetban"))),
    }
}
