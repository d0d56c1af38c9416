//! The daemon's side of the control socket: binds it, reads one [`Request`]
//! per connection (64 KiB and 5 s at most) and writes what a [`Handler`]
//! answers.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::{Request, Response};

/// What answers the requests.
pub trait Handler: Send + Sync + 'static {
    fn answer(&self, req: Request) -> impl Future<Output = Response> + Send;
}

/// Binds the socket (replacing a stale one) with mode 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Answers connections on `listener` until `shutdown`.
pub async fn serve(listener: UnixListener, handler: impl Handler, shutdown: CancellationToken) {
    let handler = Arc::new(handler);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
            _ = shutdown.cancelled() => return,
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
