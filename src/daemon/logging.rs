//! Where the daemon's log lines go: the journal, with native fields
//! (`RULE=`, `ADDR=`, `HITS=`, ...), when it runs under systemd, stderr
//! otherwise (coloured only on a terminal without `NO_COLOR`).

/// Logs to the journal, with native fields (`RULE=`, `ADDR=`, `HITS=`, ...),
/// when stderr is connected to it (systemd sets `JOURNAL_STREAM` to the
/// device:inode of that stream) or `FLEETBAN_LOG=journal`; to stderr
/// otherwise or with `FLEETBAN_LOG=stderr`. `RUST_LOG` filters (default info).
pub fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let choice = std::env::var("FLEETBAN_LOG").ok();
    if wants_journal(
        choice.as_deref(),
        std::env::var("JOURNAL_STREAM").ok().as_deref(),
        stderr_id(),
    ) {
        match tracing_journald::layer() {
            Ok(layer) => {
                let layer = layer
                    .with_field_prefix(None)
                    .with_syslog_identifier("fleetban".to_owned());
                let _ = tracing_subscriber::registry().with(filter).with(layer).try_init();
                return;
            }
            Err(e) => eprintln!("fleetban: journal unavailable ({e}); logging to stderr"),
        }
    }
    // Colours only on a terminal: a file or a pipe gets plain `key=value`.
    let colour = wants_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Colour on stderr: only on a terminal, and never when `NO_COLOR` is set
/// to anything but the empty string (<https://no-color.org>).
pub fn wants_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether to log to the journal: `FLEETBAN_LOG` decides when set, else
/// whether `JOURNAL_STREAM` (`DEV:INO`) names the stream stderr is.
pub fn wants_journal(choice: Option<&str>, journal_stream: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    match choice {
        Some("journal") => return true,
        Some("stderr") => return false,
        _ => {}
    }
    let Some((dev, ino)) = journal_stream.and_then(|s| s.split_once(':')) else {
        return false;
    };
    match (dev.parse::<u64>(), ino.parse::<u64>(), stderr) {
        (Ok(d), Ok(i), Some(id)) => (d, i) == id,
        _ => false,
    }
}

/// Device and inode of stderr.
fn stderr_id() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let m = std::fs::File::from(fd).metadata().ok()?;
    Some((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::wants_colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(wants_colour(true, None));
        assert!(wants_colour(true, Some(OsStr::new(""))));
        assert!(!wants_colour(true, Some(OsStr::new("1"))));
        assert!(!wants_colour(false, None));
    }
}
