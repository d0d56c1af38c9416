//! Elements added to nftables sets, as the kernel announces them: a
//! netlink socket in the `NFNLGRP_NFTABLES` group, opened inside a
//! namespace. `nft monitor` reads the whole ruleset, set elements included,
//! before it reports anything: with a million elements it spun a core for
//! minutes and reported nothing. The kernel's own notifications need no
//! such read: a subscription hears every change committed after it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNLGRP_NFTABLES: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSETELEM`.
const NEWSETELEM: u16 = (10 << 8) | 12;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
/// `struct nlmsghdr` then `struct nfgenmsg`.
const HEADERS: usize = 16 + 4;

/// One element added: its set and its key, when the key is an address.
#[derive(Debug)]
pub struct Added {
    pub set: String,
    pub key: IpAddr,
}

/// The elements added in one namespace from [`Additions::listen`] on, each
/// with when it was received. The listening thread ends within a second of
/// this being dropped.
pub struct Additions {
    pub rx: mpsc::Receiver<(Instant, Added)>,
    stop: Arc<AtomicBool>,
}

impl Drop for Additions {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Additions {
    /// Subscribed when this returns: every element a transaction commits
    /// from then on in namespace `ns` (by name, as `ip netns` knows it)
    /// is reported. Panics if the socket cannot be opened there.
    pub fn listen(ns: &str) -> Additions {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let sock = match subscribe(&path) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let mut buf = vec![0u8; 1 << 20];
            while !stopped.load(Ordering::Relaxed) {
                // SAFETY: reads into `buf`, which outlives the call.
                let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                let at = Instant::now();
                if n < 0 {
                    match io::Error::last_os_error().raw_os_error() {
                        // The 1 s timeout (checks `stop`), or messages lost
                        // to a full buffer (the next ones still come).
                        Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS) => continue,
                        _ => return,
                    }
                }
                for added in additions(&buf[..n as usize]) {
                    if tx.send((at, added)).is_err() {
                        return;
                    }
                }
            }
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Additions { rx, stop },
            Ok(Err(e)) => panic!("netlink nftables events in {ns}: {e}"),
            Err(_) => panic!("the netlink listener for {ns} ended before it subscribed"),
        }
    }
}

/// This thread joins the namespace at `ns_path`; a netlink socket there,
/// in the nftables group, with a 1 s receive timeout.
fn subscribe(ns_path: &str) -> io::Result<OwnedFd> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    };
    let ns = std::fs::File::open(ns_path)?;
    // SAFETY: plain syscalls on descriptors we own; every pointer is to a
    // local that outlives the call, with its size.
    unsafe {
        check(libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET))?;
        let sock = OwnedFd::from_raw_fd(check(libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        ))?);
        let fd = sock.as_raw_fd();
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        check(libc::bind(
            fd,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        ))?;
        let opt = |level, name, value: *const libc::c_void, len: usize| {
            check(libc::setsockopt(fd, level, name, value, len as libc::socklen_t))
        };
        let group = NFNLGRP_NFTABLES;
        opt(
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            (&group as *const u32).cast(),
            4,
        )?;
        let size: libc::c_int = 16 << 20;
        opt(
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            4,
        )?;
        let timeout = libc::timeval {
            tv_sec: Duration::from_secs(1).as_secs() as libc::time_t,
            tv_usec: 0,
        };
        opt(
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>(),
        )?;
        Ok(sock)
    }
}

/// The address keys of the elements that the `NEWSETELEM` messages in one
/// datagram add.
fn additions(mut buf: &[u8]) -> Vec<Added> {
    let mut out = Vec::new();
    while buf.len() >= HEADERS {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        if len < 16 || len > buf.len() {
            break;
        }
        if kind == NEWSETELEM && len >= HEADERS {
            let mut set = String::new();
            for (t, v) in attributes(&buf[HEADERS..len]) {
                if t == NFTA_SET_ELEM_LIST_SET {
                    set = String::from_utf8_lossy(v.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
                }
                if t != NFTA_SET_ELEM_LIST_ELEMENTS {
                    continue;
                }
                let keys = attributes(v)
                    .filter(|(t, _)| *t == NFTA_LIST_ELEM)
                    .flat_map(|(_, elem)| attributes(elem).filter(|(t, _)| *t == NFTA_SET_ELEM_KEY))
                    .flat_map(|(_, key)| attributes(key).filter(|(t, _)| *t == NFTA_DATA_VALUE))
                    .filter_map(|(_, value)| address(value));
                // The set's name comes before its elements in the message.
                out.extend(keys.map(|key| Added { set: set.clone(), key }));
            }
        }
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    out
}

/// Netlink attributes `(type, payload)` (the nested flag masked off).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, payload))
    })
}

/// An IPv4 or IPv6 address in network order.
fn address(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?))),
        _ => None,
    }
}
