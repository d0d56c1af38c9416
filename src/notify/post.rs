//! One HTTP/1.1 POST, written over tokio (and tokio-rustls for https, with
//! the system's roots, the provider fleetban already ships for Redis): a
//! fresh connection per message (`Connection: close`), bounded in time by
//! the caller's timeout, the answer read only as far as its status line.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use super::format::Body;
use crate::config::Endpoint;

/// Why a POST did not get a 2xx. Texts name no path and no secret.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("HTTP {0}")]
    Status(u16),
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("not an HTTP answer")]
    Protocol,
}

impl PostError {
    /// 5xx, connection errors and timeouts are tried again; 4xx (and a
    /// redirect, which is not followed) never are.
    pub fn retryable(&self) -> bool {
        match self {
            PostError::Status(s) => *s >= 500,
            PostError::Tls(_) => false,
            _ => true,
        }
    }
}

/// The TLS client configuration: the system's roots, loaded once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "Notify: reading the system's CA certificates.");
            }
            let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// POSTs `body` (with `X-Fleetban-Signature` when `signature` is given) to
/// `to`; Ok with the status when it is 2xx.
pub async fn post(to: &Endpoint, body: &Body, signature: Option<&str>, timeout: Duration) -> Result<u16, PostError> {
    match tokio::time::timeout(timeout, exchange(to, body, signature)).await {
        Ok(r) => r,
        Err(_) => Err(PostError::Timeout(timeout)),
    }
}

async fn exchange(to: &Endpoint, body: &Body, signature: Option<&str>) -> Result<u16, PostError> {
    let tcp = TcpStream::connect((to.host.as_str(), to.port))
        .await
        .map_err(PostError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let head = head(to, body, signature);
    if !to.tls {
        return over(tcp, &head, &body.bytes).await;
    }
    let name = rustls::pki_types::ServerName::try_from(to.host.clone())
        .map_err(|_| PostError::Tls(format!("`{}` is not a valid server name", to.host)))?;
    let tls = tokio_rustls::TlsConnector::from(tls_config().map_err(PostError::Tls)?)
        .connect(name, tcp)
        .await
        .map_err(|e| PostError::Tls(e.to_string()))?;
    over(tls, &head, &body.bytes).await
}

/// The request head: the path is sent, never logged.
fn head(to: &Endpoint, body: &Body, signature: Option<&str>) -> String {
    let host = match to.host.contains(':') {
        true => format!("[{}]", to.host),
        false => to.host.clone(),
    };
    let host = match (to.tls, to.port) {
        (true, 443) | (false, 80) => host,
        (_, p) => format!("{host}:{p}"),
    };
    let mut h = format!(
        "POST {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: fleetban/{}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        to.path,
        env!("CARGO_PKG_VERSION"),
        body.content_type,
        body.bytes.len()
    );
    for (name, value) in &body.headers {
        h += &format!("{name}: {value}\r\n");
    }
    if let Some(sig) = signature {
        h += &format!("X-Fleetban-Signature: sha256={sig}\r\n");
    }
    h += "\r\n";
    h
}

async fn over<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, head: &str, body: &[u8]) -> Result<u16, PostError> {
    s.write_all(head.as_bytes()).await.map_err(PostError::Io)?;
    s.write_all(body).await.map_err(PostError::Io)?;
    s.flush().await.map_err(PostError::Io)?;
    // The status line is all we need; at most 4 KiB is read for it.
    let mut buf = [0u8; 4096];
    let mut n = 0;
    while n < buf.len() && !buf[..n].contains(&b'\n') {
        match s.read(&mut buf[n..]).await.map_err(PostError::Io)? {
            0 => break,
            k => n += k,
        }
    }
    let line = std::str::from_utf8(&buf[..n])
        .unwrap_or("")
        .lines()
        .next()
        .unwrap_or("");
    let mut parts = line.split_whitespace();
    let status = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code.parse::<u16>().map_err(|_| PostError::Protocol)?,
        _ => return Err(PostError::Protocol),
    };
    let _ = s.shutdown().await;
    match status {
        200..=299 => Ok(status),
        s => Err(PostError::Status(s)),
    }
}

/// HMAC-SHA256 of `body` under `key`, lower-case hex.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), body);
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_is_rfc_4231_s_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
