//! [`Conn`]: the one connection type every Redis user holds, whatever
//! `redis:` names: one server (`url`, also `rediss://`), the master of a
//! Sentinel `service`, or a Cluster.
//!
//! One server is a `ConnectionManager` (reconnects by itself). The other two
//! are *followed*: the connection is made on first use and dropped when a
//! reply says it is no longer right, so the next command finds the right one:
//! - Sentinel: the sentinels are asked for the master
//!   (`SENTINEL get-master-addr-by-name`); an I/O error, a timeout, or a
//!   `READONLY` reply (the master we know was demoted) drops it, and the
//!   next command asks again. [`Conn::follow_master`] (the fleet sync, every
//!   5 s) asks too, and drops a connection to any other master than the one
//!   named: an old master still alive answers, so no error would. The redis
//!   crate does not follow a failover by itself.
//! - Cluster: the crate's cluster client follows MOVED/ASK and slot changes;
//!   here it is only connected lazily (a cluster down at start is an error
//!   per command, like a single server down).
//!
//! Pipelines must stay within one slot on a Cluster (`limit/redis.rs` splits
//! them); every script's keys share a hash tag. The cluster client resends
//! a whole pipeline when one of its replies is a redirect, and follows ASK
//! with ASKING; the limiter wants neither (it resends only what did not run,
//! and waits out a slot's migration: the scripts derive keys the importing
//! node may not hold yet), so its pipelines go through a second cluster
//! connection that retries nothing ([`Conn::query_once`]).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::config::{RedisConfig, Sentinel, Servers, TlsFiles};

/// A Redis connection for one of the three topologies; cheap to clone
/// (clones share the underlying connection).
#[derive(Clone)]
pub struct Conn(Inner);

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Followed(Arc<Followed>),
}

struct Followed {
    target: Target,
    /// The connection in use and its generation (so a failure drops only the
    /// connection it happened on, not a newer one).
    current: tokio::sync::Mutex<(u64, Option<Current>)>,
    /// On a Cluster, the connection of [`Conn::query_once`], made on first use.
    once: tokio::sync::Mutex<Option<ClusterConnection>>,
    connect_timeout: Duration,
    response_timeout: Option<Duration>,
}

enum Target {
    Sentinel {
        sentinel: Sentinel,
        tls: Option<TlsFiles>,
    },
    Cluster {
        client: Box<ClusterClient>,
        /// The same nodes with no retry: a redirect comes back as the error.
        once: Box<ClusterClient>,
    },
}

#[derive(Clone)]
enum Current {
    /// The master and its address as the sentinel named it (`host:port`).
    Master(ConnectionManager, String),
    Cluster(ClusterConnection),
}

impl Conn {
    /// True for a Redis Cluster: pipelines must not span slots.
    pub fn is_cluster(&self) -> bool {
        matches!(&self.0, Inner::Followed(f) if matches!(f.target, Target::Cluster { .. }))
    }

    /// Runs `pipe` (ignoring errors: one reply per command). On a Cluster the
    /// commands must share a slot, and the pipeline goes through the
    /// connection without retries: MOVED, ASK, TRYAGAIN or CLUSTERDOWN in any
    /// reply is this call's error (the client still learns the new slot map
    /// from a MOVED), never a resend of the whole pipeline or an ASKING.
    pub async fn query_once(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        let Inner::Followed(f) = &self.0 else {
            return pipe.query_async(&mut self.clone()).await;
        };
        let Target::Cluster { once, .. } = &f.target else {
            return pipe.query_async(&mut self.clone()).await;
        };
        let mut con = {
            let mut cur = f.once.lock().await;
            match &*cur {
                Some(c) => c.clone(),
                None => {
                    let c = f.cluster(once).await?;
                    *cur = Some(c.clone());
                    c
                }
            }
        };
        pipe.query_async(&mut con).await
    }

    /// Builds the connection without connecting. Fails only on a
    /// configuration the client refuses (bad URL, unreadable PEM).
    pub fn lazy(cfg: &RedisConfig, response_timeout: Option<Duration>) -> RedisResult<Conn> {
        let connect_timeout = cfg.timeout.max(Duration::from_millis(100)) * 4;
        let target = match &cfg.servers {
            Servers::Url => {
                let client = client(cfg.url.as_str(), cfg.tls.as_ref())?;
                let m =
                    ConnectionManager::new_lazy_with_config(client, manager_config(connect_timeout, response_timeout))?;
                return Ok(Conn(Inner::Single(m)));
            }
            Servers::Cluster(nodes) => {
                let build = |retries: u32| {
                    let mut b = ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(connect_timeout)
                        .retries(retries);
                    if let Some(t) = response_timeout {
                        b = b.response_timeout(t);
                    }
                    if let Some(t) = &cfg.tls {
                        b = b.certs(certificates(t));
                    }
                    b.build()
                };
                Target::Cluster {
                    client: Box::new(build(2)?),
                    once: Box::new(build(0)?),
                }
            }
            Servers::Sentinel(sentinel) => {
                for n in &sentinel.nodes {
                    client(n.as_str(), cfg.tls.as_ref())?;
                }
                Target::Sentinel {
                    sentinel: sentinel.clone(),
                    tls: cfg.tls.clone(),
                }
            }
        };
        Ok(Conn(Inner::Followed(Arc::new(Followed {
            target,
            current: tokio::sync::Mutex::new((0, None)),
            once: tokio::sync::Mutex::new(None),
            connect_timeout,
            response_timeout,
        }))))
    }

    /// With Sentinel: moves to the master the sentinels name now if the
    /// connection in use is to another one (a failover that left the old
    /// master alive); the next command connects to the named one. True if
    /// it moved. Nothing for one server or a Cluster.
    pub async fn follow_master(&self) -> RedisResult<bool> {
        match &self.0 {
            Inner::Followed(f) => f.follow_master().await,
            Inner::Single(_) => Ok(false),
        }
    }

    /// Connects now (the first connection, for commands that fail early).
    pub async fn connect(cfg: &RedisConfig, response_timeout: Option<Duration>) -> RedisResult<Conn> {
        let mut c = Conn::lazy(cfg, response_timeout)?;
        let _: String = redis::cmd("PING").query_async(&mut c).await?;
        Ok(c)
    }
}

fn manager_config(connect_timeout: Duration, response_timeout: Option<Duration>) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(response_timeout)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2))
}

fn certificates(t: &TlsFiles) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: t.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: t.ca.clone(),
    }
}

/// A client for one URL, with the configured CA and client certificate when
/// the URL is `rediss://`.
fn client(url: impl IntoConnectionInfo, tls: Option<&TlsFiles>) -> RedisResult<redis::Client> {
    let info = url.into_connection_info()?;
    match (info.addr(), tls) {
        (ConnectionAddr::TcpTls { .. }, Some(t)) => redis::Client::build_with_tls(info, certificates(t)),
        _ => redis::Client::open(info),
    }
}

impl Followed {
    /// The connection in use, connecting first if there is none.
    async fn get(&self) -> RedisResult<(u64, Current)> {
        let mut cur = self.current.lock().await;
        if let Some(c) = &cur.1 {
            return Ok((cur.0, c.clone()));
        }
        let c = match &self.target {
            Target::Cluster { client, .. } => Current::Cluster(self.cluster(client).await?),
            Target::Sentinel { .. } => {
                let (m, addr) = self.resolve().await?;
                Current::Master(m, addr)
            }
        };
        cur.0 += 1;
        cur.1 = Some(c.clone());
        Ok((cur.0, c))
    }

    async fn cluster(&self, client: &ClusterClient) -> RedisResult<ClusterConnection> {
        tokio::time::timeout(self.connect_timeout * 2, client.get_async_connection())
            .await
            .map_err(|_| timeout_error("connecting to the cluster"))?
    }

    /// The master `node` (a sentinel) names for the service, as (host, port).
    async fn named_by(&self, node: &str) -> RedisResult<(String, u16)> {
        let Target::Sentinel { sentinel, tls } = &self.target else {
            return Err(timeout_error("not a sentinel target"));
        };
        let asker = client(node, tls.as_ref())?;
        let mut con = asker.get_multiplexed_async_connection().await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&sentinel.service)
            .query_async(&mut con)
            .await?;
        addr.ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "sentinel does not know the service",
                sentinel.service.clone(),
            ))
        })
    }

    /// The master the first sentinel that answers names now (`host:port`).
    async fn named(&self) -> RedisResult<String> {
        let Target::Sentinel { sentinel, .. } = &self.target else {
            return Err(timeout_error("not a sentinel target"));
        };
        let mut last = None;
        for node in &sentinel.nodes {
            match tokio::time::timeout(self.connect_timeout, self.named_by(node.as_str())).await {
                Ok(Ok((host, port))) => return Ok(format!("{host}:{port}")),
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(timeout_error("asking a sentinel")),
            }
        }
        Err(last.unwrap_or_else(|| timeout_error("no sentinel")))
    }

    /// Asks each sentinel in turn for the master of the service and connects
    /// to it; the connection and the master's `host:port`.
    async fn resolve(&self) -> RedisResult<(ConnectionManager, String)> {
        let Target::Sentinel {
            sentinel:
                Sentinel {
                    service,
                    nodes,
                    user,
                    password,
                    db,
                },
            tls,
        } = &self.target
        else {
            return Err(timeout_error("not a sentinel target"));
        };
        let mut last = None;
        for node in nodes {
            let asked = async {
                let (host, port) = self.named_by(node.as_str()).await?;
                let info = node.as_str().into_connection_info()?;
                let addr = match info.addr() {
                    ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                        host: host.clone(),
                        port,
                        insecure: false,
                        tls_params: None,
                    },
                    _ => ConnectionAddr::Tcp(host.clone(), port),
                };
                let mut settings = redis::RedisConnectionInfo::default().set_db(*db);
                if let Some(u) = user {
                    settings = settings.set_username(u);
                }
                if let Some(p) = password {
                    settings = settings.set_password(p);
                }
                let master = client(info.set_addr(addr).set_redis_settings(settings), tls.as_ref())?;
                let mut m = ConnectionManager::new_with_config(
                    master,
                    manager_config(self.connect_timeout, self.response_timeout),
                )
                .await?;
                // A sentinel may still name a master that was demoted; the
                // next READONLY reply sends us back here.
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut m).await?;
                if !matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") {
                    return Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "the address the sentinel named is not a master (yet)",
                        format!("{host}:{port}"),
                    )));
                }
                tracing::info!(service = %service, master = %format!("{host}:{port}"), sentinel = %node, "Redis master from Sentinel.");
                Ok::<_, RedisError>((m, format!("{host}:{port}")))
            };
            match tokio::time::timeout(self.connect_timeout, asked).await {
                Ok(Ok(m)) => return Ok(m),
                Ok(Err(e)) => {
                    tracing::debug!(sentinel = %node, error = %e, "Sentinel did not give a usable master.");
                    last = Some(e);
                }
                Err(_) => last = Some(timeout_error("asking a sentinel")),
            }
        }
        Err(last.unwrap_or_else(|| timeout_error("no sentinel")))
    }

    /// With Sentinel: asks the sentinels which master they name now and
    /// drops the connection in use if it is to another one (an old master
    /// still alive answers reads, and writes too while it believes itself
    /// master: no error would ever move us). True if it was dropped.
    async fn follow_master(&self) -> RedisResult<bool> {
        if !matches!(self.target, Target::Sentinel { .. }) {
            return Ok(false);
        }
        let (generation, addr) = match &*self.current.lock().await {
            (g, Some(Current::Master(_, addr))) => (*g, addr.clone()),
            _ => return Ok(false),
        };
        let named = self.named().await?;
        if named == addr {
            return Ok(false);
        }
        let mut cur = self.current.lock().await;
        if cur.0 != generation || cur.1.is_none() {
            return Ok(false);
        }
        tracing::warn!(old = %addr, new = %named, "The sentinels name another Redis master; moving to it.");
        cur.1 = None;
        Ok(true)
    }

    /// Drops connection `generation` if a reply shows it is the wrong one.
    async fn check(&self, generation: u64, failed: bool) {
        if !failed || !matches!(self.target, Target::Sentinel { .. }) {
            return;
        }
        let mut cur = self.current.lock().await;
        if cur.0 == generation && cur.1.is_some() {
            tracing::warn!("Redis master lost or demoted; asking the sentinels again.");
            cur.1 = None;
        }
    }
}

fn timeout_error(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

/// True for the failures after which the master must be looked up again.
fn lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.code() == Some("READONLY")
        || e.to_string().contains("READONLY")
}

fn value_lost(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => e.code() == "READONLY" || e.details().is_some_and(|d| d.contains("READONLY")),
        _ => false,
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match &mut self.0 {
                Inner::Single(m) => m.req_packed_command(cmd).await,
                Inner::Followed(f) => {
                    let (generation, mut c) = f.get().await?;
                    let r = match &mut c {
                        Current::Master(m, _) => m.req_packed_command(cmd).await,
                        Current::Cluster(k) => k.req_packed_command(cmd).await,
                    };
                    let failed = match &r {
                        Ok(v) => value_lost(v),
                        Err(e) => lost(e),
                    };
                    f.check(generation, failed).await;
                    r
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match &mut self.0 {
                Inner::Single(m) => m.req_packed_commands(pipeline, offset, count).await,
                Inner::Followed(f) => {
                    let (generation, mut c) = f.get().await?;
                    let r = match &mut c {
                        Current::Master(m, _) => m.req_packed_commands(pipeline, offset, count).await,
                        Current::Cluster(k) => k.req_packed_commands(pipeline, offset, count).await,
                    };
                    let failed = match &r {
                        Ok(v) => v.iter().any(value_lost),
                        Err(e) => lost(e),
                    };
                    f.check(generation, failed).await;
                    r
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Single(m) => m.get_db(),
            Inner::Followed(f) => match &f.target {
                Target::Sentinel { sentinel, .. } => sentinel.db,
                Target::Cluster { .. } => 0,
            },
        }
    }
}
