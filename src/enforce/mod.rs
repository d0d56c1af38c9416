//! Enforcement: the last step of the flow, ban -> nft element.
//!
//! An [`Enforcer`] keeps the kernel's nftables sets (`table inet fleetban`,
//! all plain: `v4`/`v6` for single IPv4 addresses and IPv6 /64s, one set
//! `v4nL`/`v6nL` per other prefix length in use; `script::SETS` says why)
//! equal to the bans it is given. It is policy-free: it
//! bans exactly what it is told (allow lists, loopback and the safety valve
//! live in `bans`). Two implementations share one bookkeeping:
//!
//! - [`NftEnforcer`] (`nft.rs`) runs `nft -f -` with a generated ruleset, one
//!   transaction per call, and reads the kernel back with `nft -j list table`;
//!   small commands go through libnftables in this process (`libnft.rs`).
//! - [`LogEnforcer`] (`log.rs`) is the dry run: it logs what it would do.
//!
//! The bookkeeping (`cover.rs`) is pure: it keeps what callers want (desired)
//! apart from what the kernel holds (applied) and plans the element changes.
//! An element inside a broader one is "covered": left out of the kernel while the broader one drops its
//! traffic, and added back when the broader one goes. `script.rs` renders a
//! plan as nft text and `listing.rs` parses the kernel's JSON listing.
//!
//! Times are unix milliseconds passed in by the caller (`now_ms`); element
//! timeouts are the remaining time, so the kernel expires bans on its own even
//! while the daemon is down.

mod batch;
mod block;
mod change;
mod cover;
pub use cover::MAX_TIMEOUT_MS;
mod libnft;
mod listing;
mod log;
mod netlink;
mod nft;
mod script;
mod tree;

use std::time::Duration;

pub use self::block::{BlockApplied, BlockState};
pub use self::change::{fold, Change, Changes, Folded};
pub use self::libnft::loaded as library_loaded;
#[doc(hidden)]
pub use self::listing::bench_parse as bench_parse_listing;
pub use self::log::LogEnforcer;
pub use self::nft::{NftEnforcer, Preloaded};

/// When a ban ends.
///
/// Ordered: any `At` is earlier than `Permanent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Until {
    /// Unix time in milliseconds.
    At(i64),
    /// Never expires (no element timeout).
    Permanent,
}

/// A ban's end in 8 bytes aligned on 1: unix ms, `i64::MAX` for a
/// permanent ban (an `Until` is 16 bytes aligned on 8). Beside a key it
/// adds no padding: an IPv4 address's entry in the view is 12 bytes, an
/// IPv6 /64's 16; an IPv6 network's in the enforcer's book 25 (its
/// `Ipv6Net` is 17 bytes aligned on 1), where an end aligned on 4 made it
/// 28.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct End([u8; 8]);

impl End {
    pub fn of(u: Until) -> End {
        let ms = match u {
            Until::At(t) => t.min(i64::MAX - 1),
            Until::Permanent => i64::MAX,
        };
        End(ms.to_le_bytes())
    }

    pub fn until(self) -> Until {
        match i64::from_le_bytes(self.0) {
            i64::MAX => Until::Permanent,
            t => Until::At(t),
        }
    }
}

/// What [`Enforcer::flush`] removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flushed {
    /// The table existed and was deleted.
    pub table: bool,
    /// Elements its sets held (read just before).
    pub elements: usize,
}

/// One ban as the enforcer sees it: a network and its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    /// Address or prefix; host bits are ignored (`10.0.0.5/24` is `10.0.0.0/24`).
    pub net: ipnet::IpNet,
    /// When the ban ends.
    pub until: Until,
}

/// What the two rules do with a banned source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Action {
    /// Silently discard (`drop`).
    #[default]
    Drop,
    /// Answer with an ICMP/ICMPv6 port-unreachable (`reject`).
    Reject,
}

/// How the nft enforcer talks to the kernel.
#[derive(Clone, Debug)]
pub struct NftOptions {
    /// Name of the `inet` table; `[A-Za-z0-9_]{1,32}`.
    pub table: String,
    /// Verdict of the two rules.
    pub action: Action,
    /// TCP destination ports the rules apply to; empty means all traffic.
    pub ports: Vec<u16>,
    /// argv prefix that runs nft (`["nft"]`; tests use `ip netns exec NS nft`).
    pub command: Vec<String>,
    /// Small transactions (a few hundred bans) run through libnftables
    /// in this process, in its network namespace, instead of `command`
    /// (`libnft.rs`), and the table check is asked of nf_tables directly
    /// (`netlink.rs`); `command` stays for listings, large transactions
    /// and the table's creation, and for all when the library is missing.
    /// Only when `command` is the system's nft.
    pub library: bool,
    /// The most elements a periodic reconcile lists the kernel for
    /// ([`LIST_MAX`]); above it the bookkeeping stands for the kernel,
    /// and only a failed call or a vanished table lists it.
    pub list_max: usize,
}

/// Above this many elements in the kernel, a periodic reconcile does not
/// list it. The kernel walks a set's elements from the first again for
/// each part of a listing (~32 KiB of elements), so a listing's cost grows
/// with the square of the set's size. `nft -j list table` on this machine
/// (nft 1.0.6, kernel 6.18, one set of addresses): 20,000 elements 0.15 s,
/// 50,000 0.5-0.8 s, 100,000 1.3-1.6 s, 300,000 7.2 s, 1,000,000 66 s
/// (58 s of it in the kernel). nft re-reads from the start when a
/// transaction commits during its listing, so the enforcer waits for it:
/// with a million elements a ban decided during a drift repair used to
/// wait ~40 s for it.
pub const LIST_MAX: usize = 50_000;

impl Default for NftOptions {
    fn default() -> Self {
        NftOptions {
            table: "fleetban".to_owned(),
            action: Action::Drop,
            ports: Vec::new(),
            command: vec!["nft".to_owned()],
            library: false,
            list_max: LIST_MAX,
        }
    }
}

/// Why enforcement failed. Nothing here is fatal to the daemon: the next
/// call re-reads the kernel and tries again.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    /// The configured table name would not be a safe nft identifier.
    #[error("invalid nftables table name {0:?}: use 1 to 32 of A-Z, a-z, 0-9, _")]
    InvalidTable(String),
    /// Port 0 cannot be matched.
    #[error("invalid port 0 in nftables ports")]
    InvalidPort,
    /// `command` has no program.
    #[error("the nft command is empty")]
    EmptyCommand,
    /// The program could not be started or its pipes failed.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program (first word of the command).
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// nft ran and refused; `stderr` is what it said (capped).
    #[error("nft {what} failed ({status}): {stderr}")]
    Nft {
        /// What we asked: "transaction", "list table", "delete table".
        what: &'static str,
        /// Exit status as text.
        status: String,
        /// nft's stderr, trimmed and capped at a few KiB.
        stderr: String,
    },
    /// nft did not finish in time and was killed.
    #[error("nft {what} did not finish within {after:?}")]
    Timeout {
        /// What we asked.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// nft's JSON listing did not have the expected shape.
    #[error("cannot read the nft listing of table {table}: {detail}")]
    Listing {
        /// The table listed.
        table: String,
        /// What was wrong.
        detail: String,
    },
}

/// What a reconcile (or any apply) changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    /// Elements newly added to the kernel.
    pub added: usize,
    /// Elements re-added with a changed timeout.
    pub refreshed: usize,
    /// Elements deleted from the kernel.
    pub removed: usize,
    /// Elements already right.
    pub unchanged: usize,
    /// Wanted elements left out because a broader wanted one covers them.
    pub covered: usize,
    /// Wanted elements waiting for an overlapping element that is about to
    /// expire (deleting it could fail); see [`Enforcer::next_wakeup`].
    pub deferred: usize,
    /// Input elements skipped because they had already expired.
    pub expired: usize,
}

impl ReconcileStats {
    /// The one line a reconcile logs: of `table`, or of the dry run.
    pub(crate) fn log(&self, table: Option<&str>) {
        tracing::info!(
            table = table.unwrap_or("-"),
            added = self.added,
            refreshed = self.refreshed,
            removed = self.removed,
            unchanged = self.unchanged,
            covered = self.covered,
            deferred = self.deferred,
            expired = self.expired,
            "{}",
            if table.is_some() {
                "nftables reconciled"
            } else {
                "dry run: reconciled"
            }
        );
    }
}

/// The enforcer the daemon holds: real nftables or a dry run.
pub enum Enforcer {
    /// Writes the kernel's sets.
    Nft(NftEnforcer),
    /// Logs what it would write.
    Log(LogEnforcer),
}

impl Enforcer {
    /// An nftables enforcer; validates the options, touches nothing yet.
    pub fn nft(opts: NftOptions) -> Result<Enforcer, EnforceError> {
        NftEnforcer::new(opts).map(Enforcer::Nft)
    }

    /// A dry-run enforcer.
    pub fn log() -> Enforcer {
        Enforcer::Log(LogEnforcer::new())
    }

    /// Creates table, sets and chain if needed (keeping existing elements)
    /// and loads the kernel's elements as the current bans.
    pub async fn init(&mut self, now_ms: i64) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.init(now_ms).await,
            Enforcer::Log(e) => {
                e.init(now_ms);
                Ok(())
            }
        }
    }

    /// Between `init` and the start's first `replace_all`, while the list
    /// is still read: puts the elements of `pages` that `keep` takes and
    /// that nothing in the kernel overlaps into it as the pages come, in
    /// transactions one after the other, until the pages end (the
    /// `replace_all` that follows does the rest). Stops at a failed
    /// transaction (the bookkeeping may then be wrong: the `replace_all`
    /// lists the kernel); the dry run logs only the `replace_all`.
    pub async fn preload(
        &mut self,
        pages: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<Element>>,
        keep: impl Fn(&Element) -> bool,
    ) -> Preloaded {
        match self {
            Enforcer::Nft(e) => e.preload(pages, keep).await,
            Enforcer::Log(_) => Preloaded::default(),
        }
    }

    /// The start's preloads are over: what they filled one element at a
    /// time is rebuilt in bulk (less memory).
    pub fn preloaded(&mut self) {
        if let Enforcer::Nft(e) = self {
            e.preloaded();
        }
    }

    /// Adds (or extends) bans, in one nft transaction.
    pub async fn add(&mut self, elems: &[Element], now_ms: i64) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.add(elems, now_ms).await,
            Enforcer::Log(e) => {
                e.add(elems, now_ms);
                Ok(())
            }
        }
    }

    /// Lifts bans; a net inside a still-banned broader net stays dropped.
    pub async fn remove(&mut self, nets: &[ipnet::IpNet], now_ms: i64) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.remove(nets, now_ms).await,
            Enforcer::Log(e) => {
                e.remove(nets, now_ms);
                Ok(())
            }
        }
    }

    /// Adds and lifts bans in one transaction (at 100k elements each nft
    /// transaction costs seconds, so fold queued changes into one call). A
    /// net in both lists ends up lifted.
    pub async fn update(&mut self, add: &[Element], remove: &[ipnet::IpNet], now_ms: i64) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.update(add, remove, now_ms).await,
            Enforcer::Log(e) => {
                e.update(add, remove, now_ms);
                Ok(())
            }
        }
    }

    /// Makes the kernel's sets equal to `desired`: re-reads the kernel
    /// (while it holds at most `NftOptions::list_max` elements; past it,
    /// trusts the bookkeeping), re-creates the table if it vanished, adds
    /// missing, removes stale, refreshes changed timeouts.
    pub async fn replace_all(&mut self, desired: &[Element], now_ms: i64) -> Result<ReconcileStats, EnforceError> {
        match self {
            Enforcer::Nft(e) => e.replace_all(desired, now_ms).await,
            Enforcer::Log(e) => Ok(e.replace_all(desired, now_ms)),
        }
    }

    /// Applies what became due since the last call: narrower bans whose
    /// covering ban expired are added back, deferred bans are added. Call it
    /// at [`Enforcer::next_wakeup`].
    pub async fn tick(&mut self, now_ms: i64) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.tick(now_ms).await,
            Enforcer::Log(e) => {
                e.tick(now_ms);
                Ok(())
            }
        }
    }

    /// Checks that the table is still in the kernel and re-creates it, with
    /// every wanted ban, if it vanished: `Some` with what that load did.
    /// The dry run has nothing to check.
    pub async fn check(&mut self, now_ms: i64) -> Result<Option<ReconcileStats>, EnforceError> {
        match self {
            Enforcer::Nft(e) => e.check(now_ms).await,
            Enforcer::Log(_) => Ok(None),
        }
    }

    /// Wanted bans the kernel is not believed to hold (not covered by a
    /// wider one): after a failed call, what is not enforced. Walks every
    /// ban: call it after failures, not per change.
    pub fn unapplied(&self) -> Vec<ipnet::IpNet> {
        self.book().unapplied()
    }

    /// When [`Enforcer::tick`] has work (unix ms), if ever.
    pub fn next_wakeup(&self) -> Option<i64> {
        match self {
            Enforcer::Nft(e) => e.next_wakeup(),
            Enforcer::Log(e) => e.next_wakeup(),
        }
    }

    /// `fleetban check --online`: for nftables, whether `nft list tables`
    /// runs and names this table (`Some(present)`); `None` for the dry run,
    /// which runs nothing. Changes nothing.
    pub async fn probe(&mut self) -> Result<Option<bool>, EnforceError> {
        match self {
            Enforcer::Nft(e) => e.probe().await.map(Some),
            Enforcer::Log(_) => Ok(None),
        }
    }

    /// Deletes this host's table (the log backend has none: nothing).
    pub async fn flush(&mut self) -> Result<Flushed, EnforceError> {
        match self {
            Enforcer::Nft(e) => e.flush().await,
            Enforcer::Log(e) => {
                e.flush();
                Ok(Flushed {
                    table: false,
                    elements: 0,
                })
            }
        }
    }

    /// Kernel elements believed present (covered bans are not counted).
    pub fn len(&self) -> usize {
        self.book().applied_len()
    }

    /// True when no kernel element is believed present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `net` is one of the bans wanted (covered ones included).
    pub fn wants(&self, net: &ipnet::IpNet) -> bool {
        self.book().wants(net)
    }

    /// The bans wanted (covered ones included), in order.
    pub fn wanted(&self) -> impl Iterator<Item = ipnet::IpNet> + '_ {
        self.book().desired_nets()
    }

    /// The bans wanted with their ends (covered ones included), in order.
    pub fn wanted_until(&self) -> impl Iterator<Item = (ipnet::IpNet, Until)> + '_ {
        self.book().desired()
    }

    /// Bans currently wanted, covered ones included.
    pub fn desired_len(&self) -> usize {
        self.book().desired_len()
    }

    /// Makes the blocklist sets (`block4_L`/`block6_L`) hold `nets` (sorted and
    /// non-overlapping, as `blocklist::subtract` returns them): the whole
    /// sets on the first call, the difference later; one transaction.
    pub async fn set_blocklist(&mut self, nets: &[ipnet::IpNet]) -> Result<BlockApplied, EnforceError> {
        match self {
            Enforcer::Nft(e) => e.set_blocklist(nets).await,
            Enforcer::Log(e) => Ok(e.set_blocklist(nets)),
        }
    }

    /// Deletes the blocklist chain and sets.
    pub async fn remove_blocklist(&mut self) -> Result<(), EnforceError> {
        match self {
            Enforcer::Nft(e) => e.remove_blocklist().await,
            Enforcer::Log(e) => {
                e.remove_blocklist();
                Ok(())
            }
        }
    }

    /// What the blocklist sets are believed to hold.
    pub fn blocklist(&self) -> &BlockState {
        match self {
            Enforcer::Nft(e) => e.block(),
            Enforcer::Log(e) => e.block(),
        }
    }

    fn book(&self) -> &cover::Book {
        match self {
            Enforcer::Nft(e) => e.book(),
            Enforcer::Log(e) => e.book(),
        }
    }
}
