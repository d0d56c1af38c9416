//! The endpoint's connections, on the listener `listen.rs` binds: HTTP/1.1
//! with keepalive (nginx's upstream `keepalive` pool) and HTTP/1.0;
//! pipelined requests answered in order; a head of at most [`MAX_HEAD`]
//! bytes, read and write timeouts, a cap on connections, a pause after a
//! failed accept; the answer to each head.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listen::{accept, Listener, Stream};
use super::request::{parse_trusting, Client, Head, Method, Parse, MAX_HEAD};
use super::{Decisions, HttpCounters};
use crate::addr::NetSet;
use crate::enforce::Until;

/// `Retry-After` of a permanent ban: one day (a client is told to come back
/// later, not never; a ban lifted meanwhile answers 204 at once).
pub const PERMANENT_RETRY_AFTER_S: u64 = 86_400;

/// Connections served at once; the next ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 1024;

/// A kept-alive connection with no request this long is closed (nginx
/// opens a new one when it needs it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A head (or a body being skipped) that stops arriving this long, or an
/// answer the client does not read for this long, drops the connection.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Bodies longer than this are not skipped: the answer closes the
/// connection instead.
const MAX_SKIP: u64 = 1 << 20;

/// What answers a check.
pub struct Endpoint {
    pub decisions: Arc<Decisions>,
    /// 403 or 429 (`http.deny_status`).
    pub deny_status: u16,
    pub counters: Arc<HttpCounters>,
    /// `proxies:`: a check about one of them is resolved through the
    /// `X-Forwarded-For` it carries.
    pub proxies: NetSet,
}

/// Answers connections on `listener` until `shutdown`, then waits for the
/// open connections to close (each watches `shutdown` too).
pub async fn serve(listener: Listener, endpoint: Endpoint, shutdown: CancellationToken) {
    serve_at_most(listener, endpoint, MAX_CONNECTIONS, shutdown).await;
}

async fn serve_at_most(listener: Listener, endpoint: Endpoint, max: usize, shutdown: CancellationToken) {
    let endpoint = Arc::new(endpoint);
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let connections = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s { Ok(s) => s, Err(_) => break },
            _ = shutdown.cancelled() => break,
        };
        let accepted = tokio::select! {
            a = accept(&listener) => a,
            _ = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, say: retrying at once would spin.
                tracing::warn!(error = %e, "Decision endpoint: accept failed.");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (endpoint, shutdown) = (endpoint.clone(), shutdown.clone());
        connections.spawn(async move {
            match stream {
                Stream::Unix(s) => connection(s, &endpoint, &shutdown).await,
                Stream::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    connection(s, &endpoint, &shutdown).await
                }
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// One connection: reads heads, answers each in order (every complete head
/// already read is answered before the answers are written, in one write),
/// until the client closes, asks to close, errs or idles out.
pub(super) async fn connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut sock: S,
    endpoint: &Endpoint,
    shutdown: &CancellationToken,
) {
    let mut buf = vec![0u8; MAX_HEAD];
    let (mut start, mut end) = (0, 0);
    // Body bytes of the last request still to be skipped.
    let mut skip: u64 = 0;
    let mut out = Vec::with_capacity(256);
    let mut read_at = Instant::now();
    loop {
        let mut checks = 0u32;
        let mut open = true;
        while open {
            if skip > 0 {
                let n = skip.min((end - start) as u64);
                start += n as usize;
                skip -= n;
                if skip > 0 {
                    break;
                }
            }
            match parse_trusting(&buf[start..end], &endpoint.proxies) {
                Parse::Partial => break,
                Parse::Bad => {
                    out.extend_from_slice(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    open = false;
                }
                Parse::Done(head, len) => {
                    start += len;
                    let keep = head.keep_alive && !head.chunked && head.body <= MAX_SKIP;
                    checks += u32::from(answer(&head, keep, endpoint, crate::now_ms(), &mut out));
                    skip = head.body;
                    open = keep;
                }
            }
        }
        if !out.is_empty() {
            // A client that does not read its answers loses its connection.
            match tokio::time::timeout(READ_TIMEOUT, sock.write_all(&out)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
            out.clear();
            if checks > 0 {
                let took = read_at.elapsed();
                for _ in 0..checks {
                    endpoint.counters.latency.observe(took);
                }
            }
        }
        if !open {
            let _ = sock.shutdown().await;
            return;
        }
        if start == end {
            (start, end) = (0, 0);
        } else if start > 0 {
            buf.copy_within(start..end, 0);
            (start, end) = (0, end - start);
        }
        if end == buf.len() {
            let _ = sock
                .write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            let _ = sock.shutdown().await;
            return;
        }
        let timeout = if end == 0 && skip == 0 {
            IDLE_TIMEOUT
        } else {
            READ_TIMEOUT
        };
        let read = tokio::select! {
            r = tokio::time::timeout(timeout, sock.read(&mut buf[end..])) => r,
            _ = shutdown.cancelled() => return,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {
                end += n;
                read_at = Instant::now();
            }
            // Closed, failed, or timed out.
            _ => return,
        }
    }
}

/// Writes the answer to `head` into `out`; true if it was a check.
fn answer(head: &Head, keep: bool, endpoint: &Endpoint, now_ms: i64, out: &mut Vec<u8>) -> bool {
    let connection: &[u8] = match (keep, head.http10) {
        (true, false) => b"",
        (true, true) => b"Connection: keep-alive\r\n",
        (false, _) => b"Connection: close\r\n",
    };
    let status: &[u8] = match (head.method, head.check) {
        (Method::Other, _) => b"405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0",
        (_, false) => b"404 Not Found\r\nContent-Length: 0",
        (_, true) => {
            let c = &endpoint.counters;
            c.checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let until = match head.client {
                Client::Addr(a) => endpoint.decisions.denied_until(a, now_ms),
                Client::Missing | Client::Invalid => {
                    c.malformed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    None
                }
            };
            match until {
                None => {
                    out.extend_from_slice(b"HTTP/1.1 204 No Content\r\n");
                    out.extend_from_slice(connection);
                    out.extend_from_slice(b"\r\n");
                }
                Some(until) => {
                    c.denials.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let reason = match endpoint.deny_status {
                        429 => "429 Too Many Requests",
                        _ => "403 Forbidden",
                    };
                    let _ = write!(
                        out,
                        "HTTP/1.1 {reason}\r\nRetry-After: {}\r\nContent-Length: 0\r\n",
                        retry_after_s(until, now_ms)
                    );
                    out.extend_from_slice(connection);
                    out.extend_from_slice(b"\r\n");
                }
            }
            return true;
        }
    };
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(connection);
    out.extend_from_slice(b"\r\n");
    false
}

/// The seconds left of a ban, rounded up (at least 1).
fn retry_after_s(until: Until, now_ms: i64) -> u64 {
    match until {
        Until::Permanent => PERMANENT_RETRY_AFTER_S,
        Until::At(t) => u64::try_from(t.saturating_sub(now_ms))
            .unwrap_or(0)
            .div_ceil(1000)
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::bans::BanCache;
    use tokio::net::TcpListener;

    fn endpoint(deny_status: u16) -> Endpoint {
        let mut view = BanCache::default();
        view.insert("192.0.2.1/32".parse().unwrap(), Until::At(crate::now_ms() + 90_500));
        view.insert("2001:db8:1:2::/64".parse().unwrap(), Until::Permanent);
        view.insert("198.51.100.0/24".parse().unwrap(), Until::Permanent);
        view.insert("192.0.2.2/32".parse().unwrap(), Until::At(1));
        Endpoint {
            decisions: Arc::new(Decisions::new(view, Arc::default())),
            deny_status,
            counters: Arc::default(),
            proxies: NetSet::default(),
        }
    }

    /// What the endpoint writes back for `input`, sent at once, and whether
    /// it closed the connection (bounded: 5 s).
    async fn exchange(endpoint: &Endpoint, input: &[u8]) -> (String, bool) {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let token = CancellationToken::new();
        let serving = connection(server, endpoint, &token);
        let talking = async {
            client.write_all(input).await.unwrap();
            // A fifth of a second of silence ends the exchange of a connection kept open.
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            let closed = loop {
                match tokio::time::timeout(Duration::from_millis(200), client.read(&mut chunk)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break true,
                    Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
                    Err(_) => break false,
                }
            };
            token.cancel();
            (String::from_utf8(got).unwrap(), closed)
        };
        let ((), answer) = tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(serving, talking) })
            .await
            .expect("the exchange ends");
        answer
    }

    fn check(addr: &str) -> String {
        format!("GET /check HTTP/1.1\r\nHost: x\r\nX-Client-Addr: {addr}\r\n\r\n")
    }

    #[tokio::test]
    async fn allowed_denied_and_malformed() {
        let ep = endpoint(403);
        let (got, closed) = exchange(&ep, check("203.0.113.9").as_bytes()).await;
        assert_eq!((got.as_str(), closed), ("HTTP/1.1 204 No Content\r\n\r\n", false));
        let (got, _) = exchange(&ep, check("192.0.2.1").as_bytes()).await;
        // 90.5 s left when the view was made, a moment ago.
        assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\nRetry-After: 9"), "{got}");
        for covered in ["198.51.100.200", "::ffff:198.51.100.1", "2001:db8:1:2:ffff::1"] {
            let (got, _) = exchange(&ep, check(covered).as_bytes()).await;
            assert!(
                got.starts_with("HTTP/1.1 403 Forbidden\r\nRetry-After: 86400\r\n"),
                "{covered}: {got}"
            );
        }
        let (got, _) = exchange(&ep, check("192.0.2.2").as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 204"), "an ended ban: {got}");
        let (got, _) = exchange(&ep, check("not-an-address").as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 204"), "{got}");
        let (got, _) = exchange(&ep, b"GET /check HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 204"), "{got}");
        let c = &ep.counters;
        assert_eq!(
            (
                c.checks.load(Relaxed),
                c.denials.load(Relaxed),
                c.malformed.load(Relaxed)
            ),
            (8, 4, 2)
        );
        assert_eq!(c.latency.snapshot().1, 8);
    }

    #[tokio::test]
    async fn too_many_requests_with_retry_after() {
        let (got, _) = exchange(&endpoint(429), check("192.0.2.1").as_bytes()).await;
        assert!(
            got.starts_with("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 91\r\nContent-Length: 0\r\n\r\n"),
            "{got}"
        );
    }

    #[tokio::test]
    async fn pipelined_and_kept_alive_answers_in_order() {
        let ep = endpoint(403);
        let input = format!(
            "{}{}GET /nope HTTP/1.1\r\n\r\nPOST /check HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello{}",
            check("203.0.113.1"),
            check("192.0.2.1"),
            check("2001:db8:1:2::1")
        );
        let (got, closed) = exchange(&ep, input.as_bytes()).await;
        let statuses: Vec<&str> = got.split("\r\n").filter(|l| l.starts_with("HTTP/")).collect();
        assert_eq!(
            statuses,
            [
                "HTTP/1.1 204 No Content",
                "HTTP/1.1 403 Forbidden",
                "HTTP/1.1 404 Not Found",
                "HTTP/1.1 405 Method Not Allowed",
                "HTTP/1.1 403 Forbidden"
            ]
        );
        assert!(!closed, "HTTP/1.1 stays open");
    }

    #[tokio::test]
    async fn http10_and_connection_close() {
        let ep = endpoint(403);
        let (got, closed) = exchange(&ep, b"GET /check HTTP/1.0\r\nX-Client-Addr: 192.0.2.9\r\n\r\n").await;
        assert_eq!(
            (got.as_str(), closed),
            ("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", true)
        );
        let keep = b"GET /check HTTP/1.0\r\nConnection: keep-alive\r\nX-Client-Addr: 192.0.2.9\r\n\r\n";
        let (got, closed) = exchange(&ep, keep).await;
        assert_eq!(
            (got.as_str(), closed),
            ("HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n", false)
        );
        // Nothing after a `Connection: close` request is answered.
        let input = format!("GET /check HTTP/1.1\r\nConnection: close\r\n\r\n{}", check("192.0.2.1"));
        let (got, closed) = exchange(&ep, input.as_bytes()).await;
        assert_eq!((got.matches("HTTP/1.1").count(), closed), (1, true));
    }

    #[tokio::test]
    async fn garbage_and_oversized_heads_close() {
        let ep = endpoint(403);
        let (got, closed) = exchange(&ep, b"\x16\x03\x01 hello\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n") && closed, "{got}");
        let huge = format!("GET /check HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        let (got, closed) = exchange(&ep, huge.as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 431 ") && closed, "{got}");
        // A head just under the bound is answered.
        let pad = MAX_HEAD - check("192.0.2.9").len() - "X-Pad: \r\n".len();
        let fits = format!(
            "GET /check HTTP/1.1\r\nX-Pad: {}\r\nX-Client-Addr: 192.0.2.9\r\n\r\n",
            "a".repeat(pad)
        );
        assert!(fits.len() <= MAX_HEAD);
        let (got, closed) = exchange(&ep, fits.as_bytes()).await;
        assert_eq!((got.as_str(), closed), ("HTTP/1.1 204 No Content\r\n\r\n", false));
        // A chunked body cannot be skipped: answered, then closed.
        let chunked = b"GET /check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        let (got, closed) = exchange(&ep, chunked).await;
        assert!(got.ends_with("Connection: close\r\n\r\n") && closed, "{got}");
    }

    #[tokio::test]
    async fn a_head_split_over_reads_is_answered_once_whole() {
        let ep = endpoint(403);
        let (mut client, server) = tokio::io::duplex(1024);
        let token = CancellationToken::new();
        let text = check("192.0.2.1");
        let talking = async {
            for part in text.as_bytes().chunks(7) {
                client.write_all(part).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut got = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut got))
                .await
                .unwrap()
                .unwrap();
            token.cancel();
            String::from_utf8_lossy(&got[..n]).into_owned()
        };
        let ((), got) = tokio::join!(connection(server, &ep, &token), talking);
        assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_slot_and_shutdown_waits_for_all() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        let server = tokio::spawn(serve_at_most(Listener::Tcp(listener), endpoint(403), 1, token.clone()));
        let ask = |mut s: tokio::net::TcpStream| async move {
            s.write_all(check("192.0.2.1").as_bytes()).await.unwrap();
            let mut got = [0u8; 256];
            let n = s.read(&mut got).await.unwrap();
            (s, String::from_utf8_lossy(&got[..n]).into_owned())
        };
        let first = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (first, got) = tokio::time::timeout(Duration::from_secs(5), ask(first)).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        // The second waits in the backlog while the first holds the slot...
        let second = tokio::spawn(ask(tokio::net::TcpStream::connect(addr).await.unwrap()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "answered beyond the cap");
        // ...and is answered once the first lets go.
        drop(first);
        let (_second, got) = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap()
            .unwrap();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_s(Until::At(10_001), 0), 11);
        assert_eq!(retry_after_s(Until::At(10_000), 0), 10);
        assert_eq!(retry_after_s(Until::At(5), 0), 1);
        assert_eq!(retry_after_s(Until::Permanent, 0), PERMANENT_RETRY_AFTER_S);
    }
}
