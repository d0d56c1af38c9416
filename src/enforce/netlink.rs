//! The 5 s table check, asked of the kernel directly: one nf_tables
//! `GETCHAIN` request for our table's chain over a netlink socket of its
//! own, answered by the chain or by `ENOENT`.
//!
//! The check runs for the life of the daemon, bans or none. Asked through
//! libnftables (`nft -j list chains inet`), it kept the library and the
//! half of libc it uses mapped in every daemon from its first check on:
//! ~1.5 MB of an idle daemon's ~9 MB (BENCHMARKS.md, "An idle daemon without
//! libnftables"). The request is a few dozen bytes, built from the table's
//! validated name; the kernel answers it while `send` runs, and nothing is
//! listed.
//!
//! The socket belongs to the calling thread's network namespace, as
//! libnftables' does: `nft.rs` asks here only when it would run the
//! library (the system nft, no argv prefix).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NFNL_SUBSYS_NFTABLES` (linux/netfilter/nfnetlink.h).
const SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWCHAIN`, `NFT_MSG_GETCHAIN` (linux/netfilter/nf_tables.h).
const MSG_NEWCHAIN: u16 = 3;
const MSG_GETCHAIN: u16 = 4;
/// `NFTA_CHAIN_TABLE`, `NFTA_CHAIN_NAME`.
const ATTR_CHAIN_TABLE: u16 = 1;
const ATTR_CHAIN_NAME: u16 = 3;
/// `NFPROTO_INET`: the `inet` family.
const FAMILY_INET: u8 = 1;
/// `struct nlmsghdr` and `struct nfgenmsg`.
const HEADER: usize = 16;
const GENMSG: usize = 4;
/// How long a reply may take. The kernel queues it before `send` returns;
/// this only bounds a kernel that ever did otherwise.
const REPLY_WITHIN: libc::timeval = libc::timeval {
    tv_sec: 0,
    tv_usec: 200_000,
};
/// Reads before giving up on the acknowledgement (the chain's message and
/// the acknowledgement come in one or two).
const READS: usize = 4;

/// Whether `table inet <table>` holds a chain named `chain`. `Err` for
/// anything but an answer (no socket, no permission, no nf_tables, an
/// unreadable reply): the caller asks nft instead.
pub fn has_chain(table: &str, chain: &str) -> io::Result<bool> {
    let socket = open()?;
    let seq = 1;
    let request = request(table, chain, seq);
    // SAFETY: a buffer we own, of its length, on a socket we own.
    let sent = unsafe { libc::send(socket.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = false;
    let mut buf = vec![0u8; 8192];
    for _ in 0..READS {
        // SAFETY: as above; the kernel writes at most `buf.len()` bytes.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        match answer(&buf[..n], seq, &mut found)? {
            Some(present) => return Ok(present),
            None => continue,
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "no acknowledgement from nf_tables",
    ))
}

/// A netfilter netlink socket, connected to the kernel, with a read timeout.
pub(super) fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket calls; the descriptor is owned from here on.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = OwnedFd::from_raw_fd(fd);
        let timeout = REPLY_WITHIN;
        let rc = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            socklen::<libc::timeval>(),
        );
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut kernel: libc::sockaddr_nl = std::mem::zeroed();
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let rc = libc::connect(fd, (&raw const kernel).cast(), socklen::<libc::sockaddr_nl>());
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(socket)
    }
}

/// Sets an integer socket option.
pub(super) fn set_option(fd: libc::c_int, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: an int of its size, on a socket the caller owns.
    let rc = unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), socklen::<libc::c_int>()) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

fn socklen<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(size_of::<T>()).expect("a small struct")
}

/// `GETCHAIN` for `chain` of `table inet <table>`, acknowledged.
fn request(table: &str, chain: &str, seq: u32) -> Vec<u8> {
    let mut msg = vec![0u8; HEADER];
    // nfgenmsg: family, version (NFNETLINK_V0), resource id (big-endian 0).
    msg.extend_from_slice(&[FAMILY_INET, 0, 0, 0]);
    attribute(&mut msg, ATTR_CHAIN_TABLE, table);
    attribute(&mut msg, ATTR_CHAIN_NAME, chain);
    let len = u32::try_from(msg.len()).expect("a short request");
    let kind = (SUBSYS_NFTABLES << 8) | MSG_GETCHAIN;
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[4..6].copy_from_slice(&kind.to_ne_bytes());
    msg[6..8].copy_from_slice(&flags.to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in the socket's.
    msg
}

/// A NUL-terminated string attribute, padded to 4 bytes.
pub(super) fn attribute(msg: &mut Vec<u8>, kind: u16, value: &str) {
    let len = u16::try_from(4 + value.len() + 1).expect("a validated name");
    msg.extend_from_slice(&len.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(value.as_bytes());
    msg.push(0);
    msg.resize(msg.len().next_multiple_of(4), 0);
}

/// Reads one datagram of replies to `seq`: the chain's message sets
/// `found`; the acknowledgement ends the exchange (`Some`), `ENOENT` as
/// "absent" (no such table or chain).
fn answer(mut data: &[u8], seq: u32, found: &mut bool) -> io::Result<Option<bool>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("nf_tables reply: {what}"));
    while data.len() >= HEADER {
        let u32_at = |at: usize| u32::from_ne_bytes(data[at..at + 4].try_into().expect("4 bytes"));
        let len = usize::try_from(u32_at(0)).map_err(|_| bad("length"))?;
        if len < HEADER || len > data.len() {
            return Err(bad("a message's length"));
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if u32_at(8) == seq {
            if kind == libc::NLMSG_ERROR as u16 {
                if len < HEADER + 4 {
                    return Err(bad("a short error"));
                }
                let code = i32::from_ne_bytes(data[HEADER..HEADER + 4].try_into().expect("4 bytes"));
                return match -code {
                    0 => Ok(Some(*found)),
                    libc::ENOENT => Ok(Some(false)),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                };
            }
            if kind == (SUBSYS_NFTABLES << 8) | MSG_NEWCHAIN && len >= HEADER + GENMSG {
                *found = true;
            }
        }
        data = &data[len.next_multiple_of(4).min(data.len())..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_getchain_with_two_padded_names() {
        let msg = request("fleetban", "input", 7);
        assert_eq!(msg.len(), 16 + 4 + (4 + 12) + (4 + 8));
        assert_eq!(u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize, msg.len());
        assert_eq!(u16::from_ne_bytes([msg[4], msg[5]]), 0x0a04);
        assert_eq!(u32::from_ne_bytes(msg[8..12].try_into().unwrap()), 7);
        assert_eq!(&msg[16..20], &[1, 0, 0, 0]);
        let (len, kind) = (
            u16::from_ne_bytes([msg[20], msg[21]]),
            u16::from_ne_bytes([msg[22], msg[23]]),
        );
        assert_eq!((len, kind), (13, ATTR_CHAIN_TABLE));
        assert_eq!(&msg[24..36], b"fleetban\0\0\0\0");
        assert_eq!(&msg[40..48], b"input\0\0\0");
    }

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(HEADER + payload.len()).unwrap().to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(payload);
        m
    }

    #[test]
    fn the_chain_then_the_ack_is_present_and_enoent_absent() {
        let error = |code: i32| message(libc::NLMSG_ERROR as u16, 1, &code.to_ne_bytes());
        let mut found = false;
        let mut both = message(0x0a03, 1, &[1, 0, 0, 0]);
        both.extend(error(0));
        assert_eq!(answer(&both, 1, &mut found).unwrap(), Some(true));

        let mut found = false;
        assert_eq!(answer(&error(-libc::ENOENT), 1, &mut found).unwrap(), Some(false));
        // An acknowledgement without the chain's message is not "present".
        assert_eq!(answer(&error(0), 1, &mut found).unwrap(), Some(false));
        // Another request's messages are not ours; nothing ends.
        let mut found = false;
        assert_eq!(answer(&message(0x0a03, 2, &[1, 0, 0, 0]), 1, &mut found).unwrap(), None);
        assert!(!found);
        let e = answer(&error(-libc::EPERM), 1, &mut found).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert!(answer(&both[..18], 1, &mut found).is_err(), "a cut message");
    }
}
