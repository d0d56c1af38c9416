//! The `fleetban` command line as an operator runs it against a config
//! (`fleetban ban|unban|bans|status|check|test ... -c FILE`), piped or on a
//! terminal of its own (a pty), and the daemon's control socket read
//! directly: the one place tests ask the daemon how it is.

use std::path::Path;
use std::process::{Command, Stdio};

use super::fleetban_bin;

/// What one `fleetban` command did.
#[derive(Debug)]
pub struct CliOutput {
    /// The exit code; -1 if it was killed by a signal.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// stdout then stderr, for failure messages and checks on either.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// The ban lines of `fleetban test --json`'s output, in order.
    pub fn test_bans(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|v| v["event"] == "ban")
            .collect()
    }
}

/// `fleetban test --json FILES -c CFG` with `TZ` set: every line of its
/// output (it must succeed).
pub fn fleetban_test_json(cfg: &Path, files: &[&Path], tz: &str) -> Vec<serde_json::Value> {
    let out = Command::new(fleetban_bin())
        .arg("test")
        .arg("--json")
        .args(files)
        .arg("-c")
        .arg(cfg)
        .env("TZ", tz)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Runs `fleetban ARGS -c CFG` to completion (stdin closed). stdout must be
/// UTF-8; stderr is read lossily.
pub fn cli(cfg: &Path, args: &[&str]) -> CliOutput {
    let out = Command::new(fleetban_bin())
        .args(args)
        .arg("-c")
        .arg(cfg)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run fleetban {args:?}: {e}"));
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("fleetban {args:?}: stdout not UTF-8: {e}")),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// As [`cli`], with stdout a terminal (a pty the test opens; stderr
/// piped): what a person at a terminal sees, line ends as `\n`.
pub fn cli_on_terminal(cfg: &Path, args: &[&str]) -> CliOutput {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors it opened into the ints given;
    // null name, termios and size are allowed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both are open descriptors this function owns from here on.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = Command::new(fleetban_bin())
        .args(args)
        .arg("-c")
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run fleetban {args:?}: {e}"));
    // The only other end is the child's: reading ends (EIO) when it exits.
    let mut screen = Vec::new();
    let _ = std::fs::File::from(master).read_to_end(&mut screen);
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().expect("wait for fleetban");
    CliOutput {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&screen).replace("\r\n", "\n"),
        stderr,
    }
}

/// The daemon's `status` through its control socket, or None while it does
/// not answer.
pub fn control_status(control: &Path) -> Option<serde_json::Value> {
    let status = fleetban::control::Client::new(control).status().ok()?;
    Some(serde_json::to_value(status).expect("a status is JSON"))
}
