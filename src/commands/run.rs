//! `fleetban run` (the daemon) and `fleetban flush` (this host's table).

use std::path::Path;

use fleetban::daemon;

use super::{failed, load, runtime, Outcome};

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

pub fn flush(path: &Path) -> Outcome {
    let config = load(path)?;
    let mut enforcer = config.firewall.enforcer(false).map_err(failed)?;
    runtime().block_on(enforcer.flush()).map_err(failed)?;
    println!("removed table inet {}", config.firewall.table);
    Ok(())
}
