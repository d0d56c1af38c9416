//! The `fleetban` command line: flags defined here, work done in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod commands;

use commands::list::BanArgs;
use commands::{bans, check, completions, explain, list, manpage, run, status, test, top};

#[derive(Parser)]
#[command(
    name = "fleetban",
    version,
    about = "Fleet-wide ban daemon for nginx: Redis sliding windows, shared ban list, nftables",
    long_about = "Fleet-wide ban daemon for nginx: Redis sliding windows, shared ban list, nftables.\n\n\
        Every web host runs `fleetban run`: it follows the nginx logs, counts each client's requests \
        in sliding windows (in Redis for a fleet, embedded for one host) and bans a client over a \
        rule's limit in a ban list every host mirrors into a local nftables set."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (Type=notify under systemd).
    Run {
        /// The main configuration file.
        #[arg(short, long, value_name = "FILE", default_value = fleetban::config::DEFAULT_PATH)]
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
    /// Validate the configuration and the rules; exit 0 (warnings too), or 2 with every error.
    ///
    /// Prints each rule as it will run, then a `warning:` line for every log
    /// that is missing, unreadable, a glob matching nothing, or a file whose
    /// first 1000 lines the rule's format parses none of. Warnings keep exit
    /// status 0; errors in the files exit 2, each with file:line:column;
    /// `--online` exits 1 when Redis or the firewall fails.
    Check {
        /// The main configuration file.
        #[arg(short, long, value_name = "FILE", default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Also contact Redis (connect, PING, every command fleetban sends
        /// tried against the user's ACL) and the firewall (`nft list
        /// tables`); exit 1 when either fails.
        #[arg(long)]
        online: bool,
        /// With --online: POST one test event to each `notify:` target
        /// (nothing is sent without it); exit 1 when one fails.
        #[arg(long, requires = "online")]
        notify_test: bool,
        /// One JSON object: ok, every error with file, line and column, the
        /// rules, the warnings, what --online found failing, the report's lines.
        #[arg(long)]
        json: bool,
    },
    /// Replay log files through the rules with log time and the embedded store.
    /// On a terminal, a progress line on stderr (files, lines, MB/s, time
    /// left), erased before the report; never with --json or when piped.
    Test {
        /// The main configuration file.
        #[arg(short, long, value_name = "FILE", default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
        /// Only this rule; repeat for several (default: every rule).
        #[arg(long = "rule", value_name = "RULE")]
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
    /// The running daemon's state, through its control socket (works while
    /// a rule file has errors: only the main file is needed).
    Status {
        #[command(flatten)]
        on: OperatorConfig,
        /// One JSON object (docs/design.md: the `status` fields).
        #[arg(long)]
        json: bool,
    },
    /// A live view of the running daemon, like top: bans per second by rule,
    /// the clients nearest their limits, lines per second and lag per file,
    /// Redis, the decision endpoint, notifications. q quits.
    Top {
        #[command(flatten)]
        on: OperatorConfig,
        /// Print one snapshot (two readings an interval apart) and exit.
        #[arg(long)]
        once: bool,
        /// Time between readings, e.g. 1s, 500ms (at least 100ms).
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
        interval: std::time::Duration,
    },
    /// Active bans, fleet-wide: address, rule, since, until, time left,
    /// offence count, host, reason. On a terminal, a list of more than
    /// 1000 bans is shown as the 1000 ending last, its count and its ends;
    /// piped, with --all or --json, every ban. On a single host whose
    /// daemon is stopped: the list it saved (state_dir/bans.json), said on
    /// stderr.
    Bans {
        #[command(flatten)]
        on: OperatorConfig,
        /// JSON Lines, one ban each, RFC 3339 times, fields in a fixed order;
        /// every ban unless --limit is given.
        #[arg(long)]
        json: bool,
        /// Every ban, on a terminal too (past 10000 bans in the list's
        /// order, ending soonest first).
        #[arg(long, conflicts_with = "limit")]
        all: bool,
        /// The N bans ending last (permanent ones first), then the count
        /// and ends when there are more (0: those alone).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Also count the bans by kind, rule and host (reads every ban's
        /// record: seconds at a million bans).
        #[arg(long, conflicts_with = "json")]
        summary: bool,
        /// Only bans of this rule; repeat for several.
        #[arg(long = "rule", value_name = "RULE")]
        rules: Vec<String>,
        /// Only bans decided by this host (its host_id); repeat for several.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Only bans of this address or network, or inside it (e.g. 2001:db8::/32).
        #[arg(long = "in", value_name = "ADDR|CIDR")]
        within: Option<String>,
    },
    /// Ban an address or network on every host. An active ban is never
    /// shortened (the later end wins) unless --replace is given.
    Ban {
        #[command(flatten)]
        on: OperatorConfig,
        /// ADDR or CIDR (no host bits set), e.g. 192.0.2.7, 2001:db8::/64.
        #[arg(value_name = "TARGET")]
        target: String,
        /// How long, e.g. 1h, 30m, 7d (default 1h; 1s to 3650d, ten years; longer: --permanent).
        #[arg(long = "for", value_name = "DURATION", conflicts_with = "permanent")]
        duration: Option<String>,
        /// Until unbanned.
        #[arg(long)]
        permanent: bool,
        /// Why, kept in the ban's record (an active ban keeps its reason
        /// unless a new one is given).
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
        /// Replace an active ban even if this one ends sooner.
        #[arg(long)]
        replace: bool,
        /// One JSON object: what the ban did (docs/design.md: the `ban` fields).
        #[arg(long)]
        json: bool,
    },
    /// Lift a ban on every host; says which wider bans still cover it.
    Unban {
        #[command(flatten)]
        on: Target,
        /// One JSON object: what was lifted, what still covers it (docs/design.md).
        #[arg(long)]
        json: bool,
    },
    /// Why an address is or is not banned: its ban, wider bans, its count
    /// in each rule's window, and what keeps it from ever being banned. On
    /// a single host whose daemon is stopped: from the list it saved,
    /// without windows.
    Explain {
        #[command(flatten)]
        on: Target,
        /// One JSON object (docs/design.md: the `explain` fields).
        #[arg(long)]
        json: bool,
    },
    /// Remove this host's nftables table and every ban in it; refused
    /// while a daemon runs on this configuration unless --force.
    Flush {
        #[command(flatten)]
        on: OperatorConfig,
        /// Flush even though a daemon runs (it re-creates the table within ~5 s).
        #[arg(long)]
        force: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, ...): `--rule`
    /// completes the rule names of the configuration.
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page, roff (`fleetban manpage | man -l -`).
    Manpage,
    /// The rule names of a configuration, one a line: what the completion
    /// scripts offer after `--rule`.
    #[command(name = "__complete-rules", hide = true)]
    CompleteRules {
        /// The main configuration file.
        #[arg(short, long, value_name = "FILE", default_value = fleetban::config::DEFAULT_PATH)]
        config: PathBuf,
    },
}

/// The configuration an operator's command reads.
#[derive(clap::Args)]
struct OperatorConfig {
    /// The main configuration file (rule files with errors are a warning here).
    #[arg(short, long, value_name = "FILE", default_value = fleetban::config::DEFAULT_PATH)]
    config: PathBuf,
}

/// An address or network an operator's command is about.
#[derive(clap::Args)]
struct Target {
    #[command(flatten)]
    on: OperatorConfig,
    /// ADDR or CIDR, as `ban` takes it.
    #[arg(value_name = "TARGET")]
    target: String,
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
        Command::Check {
            config,
            online,
            notify_test,
            json,
        } => check::check(&config, online, notify_test, json),
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
        Command::Status { on, json } => status::status(&on.config, json),
        Command::Top { on, once, interval } => top::top(&on.config, once, interval),
        Command::Bans {
            on,
            json,
            all,
            limit,
            summary,
            rules,
            hosts,
            within,
        } => bans::bans(
            &on.config,
            &bans::BansArgs {
                json,
                all,
                limit,
                summary,
                rules,
                hosts,
                within,
            },
        ),
        Command::Ban {
            on,
            target,
            duration,
            permanent,
            reason,
            replace,
            json,
        } => list::ban(
            &on.config,
            &BanArgs {
                target,
                duration,
                permanent,
                reason,
                replace,
                json,
            },
        ),
        Command::Unban { on, json } => list::unban(&on.on.config, &on.target, json),
        Command::Explain { on, json } => explain::explain(&on.on.config, &on.target, json),
        Command::Flush { on, force } => run::flush(&on.config, force),
        Command::Completions { shell } => completions::print(shell, Cli::command()),
        Command::Manpage => manpage::print(Cli::command()),
        Command::CompleteRules { config } => completions::rules(&config),
    }
}

/// `top --interval`: a human duration (`1s`, `500ms`).
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("invalid duration `{s}` ({e}): expected e.g. 1s, 500ms"))
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every subcommand says what it is for in `--help`
    /// and the man page (clap's own `--help`/`--version` aside).
    #[test]
    fn every_argument_of_every_subcommand_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if cmd.get_about().is_none() && !path.is_empty() {
                missing.push(format!("{path}: the subcommand itself"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
