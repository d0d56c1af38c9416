//! `fleetban run` (the daemon) and `fleetban flush` (this host's table).

use std::path::Path;

use fleetban::daemon;

use super::{failed, load, load_for_cli, runtime, say, Failure, Outcome};

pub fn run(path: &Path, dry_run: bool, bench_one_call_per_hit: bool, bench_one_flight: bool) -> Outcome {
    daemon::prepare_process();
    let config = load(path)?;
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let options = daemon::Options {
        dry_run,
        config_path: path.to_path_buf(),
        bench_one_call_per_hit,
        bench_one_flight,
    };
    runtime()
        .block_on(daemon::run(config, options, daemon::signals()))
        .map_err(failed)
}

/// Deletes this host's table, saying what it held, or that there was none.
/// A running daemon would put it back at its next check (within ~5 s) and
/// meanwhile enforce nothing: refused unless `force`.
pub fn flush(path: &Path, force: bool) -> Outcome {
    let config = load_for_cli(path)?;
    let running = daemon_running(&config.state_dir, &config.control);
    if let (Some(why), false) = (&running, force) {
        return Err(Failure::Usage(format!(
            "a fleetban daemon is running ({why}): it would re-create the table within ~5 s and enforce \
             nothing meanwhile; stop it first (systemctl stop fleetban), or pass --force"
        )));
    }
    let mut enforcer = config.firewall.enforcer(false).map_err(failed)?;
    let flushed = runtime().block_on(enforcer.flush()).map_err(failed)?;
    let table = &config.firewall.table;
    if flushed.table {
        say!(
            "removed table inet {table} and the {} ban(s) in its sets",
            flushed.elements
        );
    } else if matches!(config.firewall.backend, fleetban::config::Backend::Log) {
        say!("nothing to remove: the log firewall backend keeps no nftables table");
    } else {
        say!("nothing to remove: there is no table inet {table}");
    }
    if running.is_some() {
        say!("the running daemon re-creates the table and its bans within ~5 s");
    }
    Ok(())
}

/// Why a daemon is taken to run on this configuration: it holds the flock
/// on `state_dir/lock`, or it answers on the control socket. None if neither.
fn daemon_running(state_dir: &Path, control: &Path) -> Option<String> {
    use std::os::fd::AsRawFd;
    let lock = state_dir.join(daemon::LOCK_FILE);
    if let Ok(file) = std::fs::File::open(&lock) {
        // SAFETY: flock takes a descriptor we own and constants; the lock
        // (if taken) goes with the file at the end of this block.
        let held = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
        if held {
            let pid = std::fs::read_to_string(&lock).unwrap_or_default();
            return Some(format!("pid {} holds {}", pid.trim(), lock.display()));
        }
    }
    std::os::unix::net::UnixStream::connect(control)
        .ok()
        .map(|_| format!("it answers on {}", control.display()))
}
