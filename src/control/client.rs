//! The CLI's side of the control socket: one request, one answer, 5 s at most.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::{BanAnswer, Cover, Request, Response, Status, WindowCount};
use crate::bans::BanRecord;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be reached or the exchange broke off. The
    /// text holds the io error's (no `#[source]`: it is said once).
    #[error("cannot reach the daemon at {}: {error}{}", path.display(), hint(error))]
    Unreachable { path: PathBuf, error: std::io::Error },
    /// The daemon answered an error.
    #[error("{0}")]
    Refused(String),
    /// The answer was not the one asked for.
    #[error("cannot reach the daemon at {}: bad answer: {detail}", path.display())]
    BadAnswer { path: PathBuf, detail: String },
}

impl ControlError {
    /// No daemon listens: the socket is absent or refuses (not a daemon
    /// that hangs or answers badly).
    pub fn not_running(&self) -> bool {
        matches!(self, ControlError::Unreachable { error, .. } if stopped(error))
    }
}

/// Whether `e` says that nothing listens on the socket.
fn stopped(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
    )
}

/// What to look at when nothing listens.
fn hint(e: &std::io::Error) -> &'static str {
    match stopped(e) {
        true => "; is fleetban running? (systemctl status fleetban)",
        false => "",
    }
}

pub struct Client {
    path: PathBuf,
}

impl Client {
    pub fn new(path: &Path) -> Client {
        Client { path: path.to_owned() }
    }

    pub fn status(&self) -> Result<Status, ControlError> {
        match self.call(&Request::Status)? {
            Response::Status(s) => Ok(*s),
            other => Err(self.unexpected(&other)),
        }
    }

    pub fn bans(&self) -> Result<Vec<BanRecord>, ControlError> {
        match self.call(&Request::Bans)? {
            Response::Bans { bans, .. } => Ok(bans),
            other => Err(self.unexpected(&other)),
        }
    }

    /// An operator's ban (`Request::Ban`), answered as `Response::Ban`.
    pub fn ban(&self, req: &Request) -> Result<BanAnswer, ControlError> {
        match self.call(req)? {
            Response::Ban(answer) => Ok(answer),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Lifts the ban of `addr`: whether it had one, whether Redis was down
    /// (queued), and the wider bans that still cover it.
    pub fn unban(&self, addr: IpNet) -> Result<(bool, bool, Vec<Cover>), ControlError> {
        match self.call(&Request::Unban { addr })? {
            Response::Unban { removed, queued, wider } => Ok((removed, queued, wider)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The embedded store's count of the client key `addr` under each rule.
    pub fn explain(&self, addr: IpNet) -> Result<Vec<WindowCount>, ControlError> {
        match self.call(&Request::Explain { addr })? {
            Response::Explain { windows } => Ok(windows),
            other => Err(self.unexpected(&other)),
        }
    }

    /// One request, its answer as sent (an error answer as `Refused`).
    pub fn call(&self, req: &Request) -> Result<Response, ControlError> {
        let io = |error| ControlError::Unreachable {
            path: self.path.clone(),
            error,
        };
        let mut s = UnixStream::connect(&self.path).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
        let line = serde_json::to_string(req).map_err(|e| io(e.into()))?;
        writeln!(s, "{line}").map_err(io)?;
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer).map_err(io)?;
        match serde_json::from_str(&answer) {
            Ok(Response::Error { error }) => Err(ControlError::Refused(error)),
            Ok(r) => Ok(r),
            Err(e) => Err(ControlError::BadAnswer {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
        }
    }

    fn unexpected(&self, got: &Response) -> ControlError {
        ControlError::BadAnswer {
            path: self.path.clone(),
            detail: format!("{got:?}"),
        }
    }
}
