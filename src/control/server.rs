//! The daemon's side of the control socket: binds it, reads one [`Request`]
//! per connection (64 KiB and 5 s at most) and writes what a [`Handler`]
//! answers. A failed accept (descriptors exhausted) pauses 100 ms.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::{Request, Response};

/// The pause after a failed accept (as the metrics and decision endpoints).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What answers the requests.
pub trait Handler: Send + Sync + 'static {
    fn answer(&self, req: Request) -> impl Future<Output = Response> + Send;
}

/// Binds the socket with mode 0600. Only a stale socket (one nobody
/// answers on: a daemon that died) is replaced; a live socket (another
/// daemon), a regular file, a directory or anything else at `path` is an
/// error that names it, and nothing is removed.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_socket() => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    "another daemon answers on it (a second fleetban on this configuration?); not replaced",
                ))
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            Err(e) => return Err(e),
        },
        Ok(m) => {
            let what = match m.file_type() {
                t if t.is_dir() => "a directory",
                t if t.is_file() => "a regular file",
                t if t.is_symlink() => "a symbolic link",
                _ => "not a socket",
            };
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("it is {what}, not a stale socket; not replaced"),
            ));
        }
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Answers connections on `listener` until `shutdown`.
pub async fn serve(listener: UnixListener, handler: impl Handler, shutdown: CancellationToken) {
    let handler = Arc::new(handler);
    let mut failed = 0u64;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => return,
        };
        let stream = match accepted {
            Ok((s, _)) => {
                failed = 0;
                s
            }
            Err(e) => {
                // Out of descriptors, say: the listener stays readable, so
                // retrying at once would spin. Warned on the first failure
                // of a run and then on powers of two.
                failed += 1;
                if failed.is_power_of_two() {
                    tracing::warn!(error = %e, failures = failed, "Control socket: accept failed; retrying in 100 ms.");
                }
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            let mut reader = tokio::io::BufReader::new(r.take(64 * 1024));
            let answer = match tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await {
                Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
                    Ok(req) => handler.answer(req).await,
                    Err(e) => Response::error(format!("bad request: {e}")),
                },
                _ => Response::error("no request"),
            };
            let text = serde_json::to_string(&answer)
                .unwrap_or_else(|_| r#"{"error":"the answer could not be encoded"}"#.to_owned());
            let _ = w.write_all(format!("{text}\n").as_bytes()).await;
        });
    }
}
