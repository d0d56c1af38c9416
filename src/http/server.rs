//! The endpoint's connections, on the listener `listen.rs` binds: HTTP/1.1
//! with keepalive (nginx's upstream `keepalive` pool) and HTTP/1.0;
//! pipelined requests answered in order; a head of at most [`MAX_HEAD`]
//! bytes, whole within [`HEAD_TIMEOUT`] of its first byte; an idle
//! timeout, a write timeout; at most so many connections, the one quiet
//! the longest closed to admit a new one (`table.rs`); a short pause after
//! a failed accept; the answer to each head.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listen::{accept, Listener, Stream};
use super::request::{parse_trusting, Client, Head, Method, Parse, MAX_HEAD};
use super::table::{Slot, Table};
use super::{Decisions, HttpCounters};
use crate::addr::NetSet;
use crate::enforce::Until;

/// `Retry-After` of a permanent ban: one day (a client is told to come back
/// later, not never; a ban lifted meanwhile answers 204 at once).
pub const PERMANENT_RETRY_AFTER_S: u64 = 86_400;

/// Connections open at most (fewer if `RLIMIT_NOFILE` is low: see
/// [`max_connections`]); one more takes the place of the one quiet the
/// longest.
const MAX_CONNECTIONS: usize = 1024;

/// Descriptors below `RLIMIT_NOFILE` left to the rest of the daemon (logs,
/// Redis, nft, the control socket, the metrics): the endpoint's
/// connections never take them.
const RESERVED_FDS: u64 = 256;

/// A kept-alive connection with no request this long is closed (nginx
/// opens a new one when it needs it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A request's head, and the body to skip, must arrive whole this long
/// after its first byte, else the connection is closed. nginx writes its
/// check in one write; a client trickling a head holds a connection this
/// long at most.
const HEAD_TIMEOUT: Duration = Duration::from_secs(1);

/// An answer the client does not read for this long drops the connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause after a failed accept (out of descriptors, say), so that
/// retrying does not spin; short, as checks are waiting behind it.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

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
    serve_at_most(listener, endpoint, max_connections(), shutdown).await;
}

/// [`MAX_CONNECTIONS`], or fewer when `RLIMIT_NOFILE` leaves less than
/// that beside [`RESERVED_FDS`] (systemd's default soft limit is 1024).
fn max_connections() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => lim.rlim_cur,
        _ => 1024,
    };
    let fit = usize::try_from(soft.saturating_sub(RESERVED_FDS)).unwrap_or(MAX_CONNECTIONS);
    MAX_CONNECTIONS.min(fit).max(16)
}

async fn serve_at_most(listener: Listener, endpoint: Endpoint, max: usize, shutdown: CancellationToken) {
    let endpoint = Arc::new(endpoint);
    let table = Table::new(max, endpoint.counters.clone());
    let connections = TaskTracker::new();
    let mut failed = crate::ratelog::Every::default();
    loop {
        let accepted = tokio::select! {
            a = accept(&listener) => a,
            _ = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, say: free one, and pause so that
                // retrying does not spin.
                table.evict_one();
                if let Some(n) = failed.note(1, Duration::from_secs(10)) {
                    tracing::warn!(error = %e, failures = n, "Decision endpoint: accept failed; closed the connection quiet the longest.");
                }
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let lease = table.admit(&shutdown);
        let endpoint = endpoint.clone();
        connections.spawn(async move {
            match stream {
                Stream::Unix(s) => connection(s, &endpoint, &lease.slot).await,
                Stream::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    connection(s, &endpoint, &lease.slot).await
                }
            }
            drop(lease);
        });
    }
    connections.close();
    connections.wait().await;
}

/// One connection: reads heads, answers each in order (every complete head
/// already read is answered before the answers are written, in one write),
/// until the client closes, asks to close, errs, idles out, is too slow to
/// send a request whole, or `slot` is closed (evicted, or shutdown); tells
/// `slot` since when it has been quiet.
pub(super) async fn connection<S: AsyncRead + AsyncWrite + Unpin>(mut sock: S, endpoint: &Endpoint, slot: &Slot) {
    let close = &slot.close;
    let mut buf = vec![0u8; MAX_HEAD];
    let (mut start, mut end) = (0, 0);
    // Body bytes of the last request still to be skipped.
    let mut skip: u64 = 0;
    let mut out = Vec::with_capacity(256);
    let mut read_at = Instant::now();
    // The arrival of the first byte of the request not yet whole (its head,
    // or its body to skip); None while idle.
    let mut begun: Option<Instant> = None;
    let mut idle_since = read_at;
    loop {
        let mut checks = 0u32;
        let mut answered = false;
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
                    answered = true;
                    let keep = head.keep_alive && !head.chunked && head.body <= MAX_SKIP;
                    checks += u32::from(answer(&head, keep, endpoint, crate::now_ms(), &mut out));
                    skip = head.body;
                    open = keep;
                }
            }
        }
        if !out.is_empty() {
            if !send(&mut sock, &out, close).await {
                return;
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
            let too_large =
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            if send(&mut sock, too_large, close).await {
                let _ = sock.shutdown().await;
            }
            return;
        }
        // A request still to come whole keeps its deadline from its first
        // byte; one begun after an answer in the same read starts its own.
        let pending = end > 0 || skip > 0;
        if pending && (begun.is_none() || answered) {
            begun = Some(read_at);
            slot.quiet_since(read_at);
        } else if !pending && (begun.is_some() || answered) {
            // Idle since the read that completed the request (a clock
            // read less per request than its answer's time).
            begun = None;
            idle_since = read_at;
            slot.quiet_since(idle_since);
        }
        let deadline = match begun {
            Some(t) => t + HEAD_TIMEOUT,
            None => idle_since + IDLE_TIMEOUT,
        };
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline.into(), sock.read(&mut buf[end..])) => r,
            _ = close.cancelled() => return,
        };
        match read {
            Ok(Ok(n)) if n > 0 => {
                end += n;
                read_at = Instant::now();
            }
            Ok(_) => return,
            Err(_) => {
                if begun.is_some() {
                    endpoint
                        .counters
                        .head_timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                return;
            }
        }
    }
}

/// Writes `bytes`; false if the client did not take them within
/// [`WRITE_TIMEOUT`] (a client that does not read its answers loses its
/// connection), the write failed, or `close` was cancelled.
async fn send<S: AsyncWrite + Unpin>(sock: &mut S, bytes: &[u8], close: &CancellationToken) -> bool {
    tokio::select! {
        // The write first: done at its first poll, it never waits on `close`.
        biased;
        w = tokio::time::timeout(WRITE_TIMEOUT, sock.write_all(bytes)) => matches!(w, Ok(Ok(()))),
        _ = close.cancelled() => false,
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

    fn shared(view: BanCache) -> crate::bans::SharedView {
        let s = crate::bans::SharedView::default();
        drop(s.swap(view));
        s
    }

    fn endpoint(deny_status: u16) -> Endpoint {
        let mut view = BanCache::default();
        view.insert("192.0.2.1/32".parse().unwrap(), Until::At(crate::now_ms() + 90_500));
        view.insert("2001:db8:1:2::/64".parse().unwrap(), Until::Permanent);
        view.insert("198.51.100.0/24".parse().unwrap(), Until::Permanent);
        view.insert("192.0.2.2/32".parse().unwrap(), Until::At(1));
        Endpoint {
            decisions: Arc::new(Decisions::new(shared(view), Arc::default())),
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
        let slot = Slot::alone(token.clone());
        let serving = connection(server, endpoint, &slot);
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
        let slot = Slot::alone(token.clone());
        let ((), got) = tokio::join!(connection(server, &ep, &slot), talking);
        assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_not_whole_a_second_after_its_first_byte_is_closed_and_counted() {
        let ep = endpoint(403);
        let (mut client, server) = tokio::io::duplex(1024);
        let slot = Slot::alone(CancellationToken::new());
        let talking = async {
            client.write_all(b"GET /check HTTP/1.1\r\n").await.unwrap();
            // A byte every 300 ms: each read comes well within any per-read timeout.
            let mut got = [0u8; 64];
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if client.write_all(b"X").await.is_err() {
                    break;
                }
            }
            client.read(&mut got).await.unwrap_or(0)
        };
        let ((), n) = tokio::join!(connection(server, &ep, &slot), talking);
        assert_eq!(n, 0, "closed without an answer");
        assert_eq!(ep.counters.head_timeouts.load(Relaxed), 1);
        // A request whole within the second is answered, and an idle
        // connection is not a head timing out.
        let (got, closed) = exchange(&ep, check("192.0.2.1").as_bytes()).await;
        assert!(got.starts_with("HTTP/1.1 403") && !closed, "{got}");
        assert_eq!(ep.counters.head_timeouts.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn a_full_table_admits_a_new_connection_in_place_of_the_one_quiet_the_longest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        let ep = endpoint(403);
        let counters = ep.counters.clone();
        let server = tokio::spawn(serve_at_most(Listener::Tcp(listener), ep, 2, token.clone()));
        async fn ask(s: &mut tokio::net::TcpStream) -> String {
            s.write_all(check("192.0.2.1").as_bytes()).await.unwrap();
            let mut got = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut got))
                .await
                .expect("answered")
                .unwrap_or(0);
            String::from_utf8_lossy(&got[..n]).into_owned()
        }
        let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut a).await.starts_with("HTTP/1.1 403"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut b = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut b).await.starts_with("HTTP/1.1 403"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // a asks again: b is now the one quiet the longest.
        assert!(ask(&mut a).await.starts_with("HTTP/1.1 403"));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut c).await.starts_with("HTTP/1.1 403"), "the third is served");
        let mut rest = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(5), b.read(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "b was closed");
        assert!(ask(&mut a).await.starts_with("HTTP/1.1 403"), "a is still served");
        assert_eq!((counters.evicted.load(Relaxed), counters.open.load(Relaxed)), (1, 2));
        // Shutdown closes the open ones and waits for them.
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(counters.open.load(Relaxed), 0);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_s(Until::At(10_001), 0), 11);
        assert_eq!(retry_after_s(Until::At(10_000), 0), 10);
        assert_eq!(retry_after_s(Until::At(5), 0), 1);
        assert_eq!(retry_after_s(Until::Permanent, 0), PERMANENT_RETRY_AFTER_S);
    }
}
