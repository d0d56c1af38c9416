//! Element changes sent to nf_tables directly: one netlink batch of
//! `DELSETELEM` and `NEWSETELEM` messages, built from typed values (the
//! validated table name, set names, address bytes, timeouts in ms). A batch
//! is one kernel transaction, all or nothing, as `nft -f` makes it.
//!
//! nft spends most of a large load in its own parser and evaluation: its
//! transaction of 100,000 networks took 0.21 s in the program and 0.11-0.15
//! s in the kernel (nft 1.0.6), and the start's loads ran beside the list's
//! read on two cores (issue 27). Every change of elements alone to sets
//! that exist comes here: the start's pages, a first sync's whole list,
//! one ban (which then loads no library). Table work (table, sets, chain,
//! rules), and a change that needs a set the kernel lacks, stay with nft
//! (`nft.rs`).
//!
//! The socket is the calling thread's network namespace's, as
//! libnftables' is (`netlink.rs`).

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

use super::cover::Plan;
use super::netlink;
use super::script::{home_of, home_of_span, Home};
use super::Until;

/// `NFNL_SUBSYS_NFTABLES`; `NFT_MSG_NEWSETELEM`, `NFT_MSG_DELSETELEM`.
const SUBSYS_NFTABLES: u16 = 10;
const MSG_NEWSETELEM: u16 = 12;
const MSG_DELSETELEM: u16 = 14;
/// `NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`.
const BATCH_BEGIN: u16 = 0x10;
const BATCH_END: u16 = 0x11;
/// `NFTA_SET_ELEM_LIST_TABLE`, `_SET`, `_ELEMENTS`; `NFTA_LIST_ELEM`;
/// `NFTA_SET_ELEM_KEY`, `NFTA_SET_ELEM_TIMEOUT`; `NFTA_DATA_VALUE`.
const LIST_TABLE: u16 = 1;
const LIST_SET: u16 = 2;
const LIST_ELEMENTS: u16 = 3;
const LIST_ELEM: u16 = 1;
const ELEM_KEY: u16 = 1;
const ELEM_TIMEOUT: u16 = 4;
const DATA_VALUE: u16 = 1;
/// `NLA_F_NESTED`.
const NESTED: u16 = 0x8000;
/// `NFPROTO_INET`.
const FAMILY_INET: u8 = 1;
/// `struct nlmsghdr` and `struct nfgenmsg`.
const HEADER: usize = 16;
/// `SOL_NETLINK`, `NETLINK_CAP_ACK` (an error quotes the message's header,
/// not its 60 kB of elements).
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_CAP_ACK: libc::c_int = 10;
/// Bytes of elements in one message: the elements' nest has a 16-bit
/// length.
const NEST_MAX: usize = 60_000;
/// Reads for the replies: the kernel queues them while `send` runs (an
/// acknowledgement, or the errors then the acknowledgement).
const READS: usize = 64;

/// A batch ready to send, and what each of its messages does.
#[derive(Debug)]
pub(crate) struct Batch {
    bytes: Vec<u8>,
    /// ("adding to" / "deleting from", set) of each element message; the
    /// first's sequence number is 2 (1 is the batch's start).
    messages: Vec<(&'static str, String)>,
    /// Where the last element message starts in `bytes`.
    last: usize,
}

/// Why a batch did not apply.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The kernel never took it (no socket, no buffer): nothing changed.
    Unsent(io::Error),
    /// nf_tables refused it, as it words it: nothing changed.
    Refused(String),
    /// Sent, but no answer could be read: what the kernel holds is unknown.
    Unanswered(io::Error),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Unsent(e) => write!(f, "the batch could not be sent: {e}"),
            Failed::Refused(why) => f.write_str(why),
            Failed::Unanswered(e) => write!(f, "no answer to the batch: {e}"),
        }
    }
}

/// A set's elements, each an address with its timeout in ms (none:
/// permanent, or a deletion).
type Elements = Vec<(IpAddr, Option<u64>)>;

impl Batch {
    /// The plan's deletions, then its additions, per set (as
    /// `script::render` orders them), each element's timeout its remaining
    /// time at `now`. None for a plan without elements.
    pub(crate) fn of(table: &str, plan: &Plan, now: i64) -> Option<Batch> {
        let mut deletes: BTreeMap<Home, Elements> = BTreeMap::new();
        for span in &plan.delete {
            if let Some(home) = home_of_span(span) {
                deletes.entry(home).or_default().push((span.lo, None));
            }
        }
        let mut adds: BTreeMap<Home, Elements> = BTreeMap::new();
        for (net, until) in &plan.add {
            let timeout = match until {
                Until::At(t) => Some(u64::try_from((t - now).max(1)).unwrap_or(1)),
                Until::Permanent => None,
            };
            adds.entry(home_of(net)).or_default().push((net.network(), timeout));
        }
        let elements = plan.delete.len() + plan.add.len();
        let mut b = Batch {
            bytes: Vec::with_capacity(64 + elements * 44),
            messages: Vec::new(),
            last: 0,
        };
        b.header(BATCH_BEGIN, 1);
        let groups = deletes
            .into_iter()
            .map(|(h, e)| (MSG_DELSETELEM, h, e))
            .chain(adds.into_iter().map(|(h, e)| (MSG_NEWSETELEM, h, e)));
        for (kind, home, elems) in groups {
            let set = home.name();
            let mut rest = elems.as_slice();
            while !rest.is_empty() {
                rest = b.message(kind, table, &set, rest);
            }
        }
        if b.messages.is_empty() {
            return None;
        }
        // The last element message asks for an acknowledgement: it comes
        // after every error the batch met, once the batch is committed.
        let at = b.last + 6;
        let flags = u16::from_ne_bytes([b.bytes[at], b.bytes[at + 1]]) | libc::NLM_F_ACK as u16;
        b.bytes[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
        let seq = b.seq_after();
        b.header(BATCH_END, seq);
        Some(b)
    }

    /// Sequence number of the next message.
    fn seq_after(&self) -> u32 {
        u32::try_from(self.messages.len() + 2).unwrap_or(u32::MAX)
    }

    /// A batch delimiter: `nfgenmsg` with `AF_UNSPEC` and nf_tables as the
    /// resource (big-endian).
    fn header(&mut self, kind: u16, seq: u32) {
        let start = self.open(kind, seq, libc::NLM_F_REQUEST as u16);
        self.bytes.extend_from_slice(&[0, 0]);
        self.bytes.extend_from_slice(&SUBSYS_NFTABLES.to_be_bytes());
        self.close(start);
    }

    /// Starts a message: its header, the length filled in by `close`.
    fn open(&mut self, kind: u16, seq: u32, flags: u16) -> usize {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0; 4]);
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(&flags.to_ne_bytes());
        self.bytes.extend_from_slice(&seq.to_ne_bytes());
        // nlmsg_pid 0: the kernel's.
        self.bytes.extend_from_slice(&[0; 4]);
        start
    }

    fn close(&mut self, start: usize) {
        let len = u32::try_from(self.bytes.len() - start).expect("a message under 4 GiB");
        self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// One element message for `set`, with as many of `elems` as fit;
    /// returns the rest.
    fn message<'e>(
        &mut self,
        kind: u16,
        table: &str,
        set: &str,
        elems: &'e [(IpAddr, Option<u64>)],
    ) -> &'e [(IpAddr, Option<u64>)] {
        let flags = libc::NLM_F_REQUEST as u16
            | match kind {
                MSG_NEWSETELEM => libc::NLM_F_CREATE as u16,
                _ => 0,
            };
        let seq = self.seq_after();
        let start = self.open((SUBSYS_NFTABLES << 8) | kind, seq, flags);
        self.bytes.extend_from_slice(&[FAMILY_INET, 0, 0, 0]);
        self.string(LIST_TABLE, table);
        self.string(LIST_SET, set);
        let list = self.nest(LIST_ELEMENTS);
        let mut taken = 0;
        for &(addr, timeout) in elems {
            if self.bytes.len() - list > NEST_MAX {
                break;
            }
            let elem = self.nest(LIST_ELEM);
            let key = self.nest(ELEM_KEY);
            match addr {
                IpAddr::V4(a) => self.attribute(DATA_VALUE, &a.octets()),
                IpAddr::V6(a) => self.attribute(DATA_VALUE, &a.octets()),
            }
            self.end_nest(key);
            if let Some(ms) = timeout {
                self.attribute(ELEM_TIMEOUT, &ms.to_be_bytes());
            }
            self.end_nest(elem);
            taken += 1;
        }
        self.end_nest(list);
        self.close(start);
        self.last = start;
        let verb = match kind {
            MSG_NEWSETELEM => "adding to",
            _ => "deleting from",
        };
        self.messages.push((verb, set.to_owned()));
        &elems[taken..]
    }

    /// An attribute of `value`'s bytes, padded to 4.
    fn attribute(&mut self, kind: u16, value: &[u8]) {
        let len = u16::try_from(4 + value.len()).expect("a short attribute");
        self.bytes.extend_from_slice(&len.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(value);
        self.bytes.resize(self.bytes.len().next_multiple_of(4), 0);
    }

    /// A NUL-terminated string attribute (`netlink.rs` writes it).
    fn string(&mut self, kind: u16, value: &str) {
        netlink::attribute(&mut self.bytes, kind, value);
    }

    /// Opens a nested attribute; `end_nest` writes its length.
    fn nest(&mut self, kind: u16) -> usize {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0, 0]);
        self.bytes.extend_from_slice(&(kind | NESTED).to_ne_bytes());
        start
    }

    fn end_nest(&mut self, start: usize) {
        let len = u16::try_from(self.bytes.len() - start).expect("a nest within NEST_MAX");
        self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Sends the batch and reads nf_tables' answer (blocking: the kernel
    /// applies the batch while `send` runs, ~1 µs an element).
    pub(crate) fn send(&self) -> Result<(), Failed> {
        let socket = netlink::open().map_err(Failed::Unsent)?;
        let fd = socket.as_raw_fd();
        // A message is refused past the socket's send buffer: the batch
        // is one message of up to a few MB (nft raises it the same way).
        let want = libc::c_int::try_from(self.bytes.len() + 4_096).unwrap_or(libc::c_int::MAX);
        netlink::set_option(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, want).map_err(Failed::Unsent)?;
        netlink::set_option(fd, SOL_NETLINK, NETLINK_CAP_ACK, 1).map_err(Failed::Unsent)?;
        // SAFETY: a buffer we own, of its length, on a socket we own.
        let sent = unsafe { libc::send(fd, self.bytes.as_ptr().cast(), self.bytes.len(), 0) };
        if sent < 0 {
            return Err(Failed::Unsent(io::Error::last_os_error()));
        }
        let mut buf = vec![0u8; 16_384];
        for _ in 0..READS {
            // SAFETY: as above; the kernel writes at most `buf.len()` bytes.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            let n = usize::try_from(n).map_err(|_| Failed::Unanswered(io::Error::last_os_error()))?;
            if let Some(done) = self.answer(&buf[..n]) {
                return done;
            }
        }
        Err(Failed::Unanswered(io::Error::new(
            io::ErrorKind::InvalidData,
            "no acknowledgement from nf_tables",
        )))
    }

    /// Reads one datagram of replies: an error ends the exchange as a
    /// refusal, the last message's acknowledgement as done.
    fn answer(&self, mut data: &[u8]) -> Option<Result<(), Failed>> {
        let last = self.seq_after() - 1;
        while data.len() >= HEADER {
            let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
            if len < HEADER || len > data.len() {
                return Some(Err(Failed::Unanswered(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a cut reply from nf_tables",
                ))));
            }
            let kind = u16::from_ne_bytes([data[4], data[5]]);
            let seq = u32::from_ne_bytes(data[8..12].try_into().expect("4 bytes"));
            if kind == libc::NLMSG_ERROR as u16 && len >= HEADER + 4 {
                let code = i32::from_ne_bytes(data[HEADER..HEADER + 4].try_into().expect("4 bytes"));
                if code != 0 {
                    return Some(Err(Failed::Refused(self.refusal(seq, code))));
                }
                if seq == last {
                    return Some(Ok(()));
                }
            }
            data = &data[len.next_multiple_of(4).min(data.len())..];
        }
        None
    }

    /// nf_tables' refusal of message `seq`, in words.
    fn refusal(&self, seq: u32, code: i32) -> String {
        let error = io::Error::from_raw_os_error(code.saturating_neg());
        let what = usize::try_from(seq)
            .ok()
            .and_then(|s| s.checked_sub(2))
            .and_then(|i| self.messages.get(i));
        match what {
            Some((verb, set)) => format!("nf_tables refused {verb} set {set}: {error}"),
            None => format!("nf_tables refused the batch: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;
    use std::process::{Command, Stdio};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// Each message of `bytes`: (offset, type, flags, seq).
    fn messages(bytes: &[u8]) -> Vec<(usize, u16, u16, u32)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32_at(bytes, at) as usize;
            assert!(len >= HEADER && at + len <= bytes.len(), "a message's length");
            out.push((at, u16_at(bytes, at + 4), u16_at(bytes, at + 6), u32_at(bytes, at + 8)));
            at += len.next_multiple_of(4);
        }
        out
    }

    #[test]
    fn a_batch_is_its_deletions_then_its_additions_per_set_between_begin_and_end() {
        let plan = Plan {
            delete: vec![super::super::cover::Span::of(&net("192.0.2.9/32"))],
            add: vec![
                (net("203.0.113.7/32"), Until::At(1_000 + 3_600_000)),
                (net("2001:db8:1::/48"), Until::Permanent),
            ],
            ..Plan::default()
        };
        let b = Batch::of("fleetban", &plan, 1_000).unwrap();
        let m = messages(&b.bytes);
        let kinds: Vec<u16> = m.iter().map(|x| x.1).collect();
        assert_eq!(kinds, [0x10, 0x0a0e, 0x0a0c, 0x0a0c, 0x11]);
        let seqs: Vec<u32> = m.iter().map(|x| x.3).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        let (req, ack, create) = (
            libc::NLM_F_REQUEST as u16,
            libc::NLM_F_ACK as u16,
            libc::NLM_F_CREATE as u16,
        );
        let flags: Vec<u16> = m.iter().map(|x| x.2).collect();
        assert_eq!(flags, [req, req, req | create, req | create | ack, req]);
        // Begin and end name nf_tables as the resource, big-endian.
        assert_eq!(&b.bytes[16..20], &[0, 0, 0, 10]);
        assert_eq!(b.messages[0], ("deleting from", "v4".to_owned()));
        assert_eq!(b.messages[1], ("adding to", "v4".to_owned()));
        assert_eq!(b.messages[2], ("adding to", "v6n48".to_owned()));

        // The address's message: inet, table, set, then one element with
        // its key and its timeout in ms, big-endian.
        let at = m[2].0 + HEADER;
        assert_eq!(&b.bytes[at..at + 4], &[FAMILY_INET, 0, 0, 0]);
        assert_eq!((u16_at(&b.bytes, at + 4), u16_at(&b.bytes, at + 6)), (13, LIST_TABLE));
        assert_eq!(&b.bytes[at + 8..at + 17], b"fleetban\0");
        assert_eq!((u16_at(&b.bytes, at + 20), u16_at(&b.bytes, at + 22)), (7, LIST_SET));
        assert_eq!(&b.bytes[at + 24..at + 27], b"v4\0");
        let list = at + 28;
        assert_eq!(u16_at(&b.bytes, list + 2), LIST_ELEMENTS | NESTED);
        let elem = list + 4;
        assert_eq!(u16_at(&b.bytes, elem + 2), LIST_ELEM | NESTED);
        assert_eq!(u16_at(&b.bytes, elem + 4), 12, "key nest: header and value");
        assert_eq!(u16_at(&b.bytes, elem + 6), ELEM_KEY | NESTED);
        assert_eq!(
            (u16_at(&b.bytes, elem + 8), u16_at(&b.bytes, elem + 10)),
            (8, DATA_VALUE)
        );
        assert_eq!(&b.bytes[elem + 12..elem + 16], &[203, 0, 113, 7]);
        assert_eq!(
            (u16_at(&b.bytes, elem + 16), u16_at(&b.bytes, elem + 18)),
            (12, ELEM_TIMEOUT)
        );
        assert_eq!(&b.bytes[elem + 20..elem + 28], &3_600_000u64.to_be_bytes());
        assert_eq!(u16_at(&b.bytes, elem), 28);
        assert_eq!(u16_at(&b.bytes, list), 32);
        // The permanent network: its network's 16 bytes, no timeout.
        let elem = m[3].0 + HEADER + 4 + 16 + 12 + 4;
        assert_eq!(u16_at(&b.bytes, elem), 4 + 4 + 4 + 16);
        assert_eq!(
            &b.bytes[elem + 12..elem + 28],
            &"2001:db8:1::".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert!(Batch::of("fleetban", &Plan::default(), 0).is_none());
    }

    #[test]
    fn a_long_set_is_split_into_messages_whose_elements_fit_a_nest() {
        let add: Vec<(IpNet, Until)> = (0..5_000u32)
            .map(|i| {
                (
                    IpNet::new(std::net::Ipv6Addr::from(u128::from(i) << 64).into(), 64).unwrap(),
                    Until::At(10),
                )
            })
            .collect();
        let plan = Plan { add, ..Plan::default() };
        let b = Batch::of("fleetban", &plan, 0).unwrap();
        assert!(b.messages.iter().all(|(_, set)| set == "v6"));
        let m = messages(&b.bytes);
        assert!(m.len() > 4, "{} messages", m.len());
        let mut elements = 0;
        for &(at, kind, _, _) in &m[1..m.len() - 1] {
            assert_eq!(kind, 0x0a0c);
            let list = at + HEADER + 4 + 16 + 8;
            let len = u16_at(&b.bytes, list) as usize;
            assert!(len <= NEST_MAX + 40, "{len}");
            elements += (len - 4) / 40;
        }
        assert_eq!(elements, 5_000);
        // Only the last element message asks for an acknowledgement.
        let acked: Vec<bool> = m.iter().map(|x| x.2 & libc::NLM_F_ACK as u16 != 0).collect();
        assert_eq!(acked.iter().filter(|a| **a).count(), 1);
        assert!(acked[m.len() - 2]);
    }

    #[test]
    fn replies_end_at_the_acknowledgement_or_the_first_refusal_named() {
        let plan = Plan {
            add: vec![(net("203.0.113.7/32"), Until::Permanent)],
            ..Plan::default()
        };
        let b = Batch::of("fleetban", &plan, 0).unwrap();
        let reply = |seq: u32, code: i32| {
            let mut m = Vec::new();
            m.extend_from_slice(&36u32.to_ne_bytes());
            m.extend_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
            m.extend_from_slice(&[0, 0]);
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&[0; 4]);
            m.extend_from_slice(&code.to_ne_bytes());
            m.extend_from_slice(&[0; 16]);
            m
        };
        assert!(matches!(b.answer(&reply(2, 0)), Some(Ok(()))));
        assert!(b.answer(&reply(1, 0)).is_none(), "not the last message's");
        match b.answer(&reply(2, -libc::ENOENT)) {
            Some(Err(Failed::Refused(why))) => {
                assert!(
                    why.starts_with("nf_tables refused adding to set v4: No such file"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        match b.answer(&reply(1, -libc::ENOMEM)) {
            Some(Err(Failed::Refused(why))) => assert!(why.starts_with("nf_tables refused the batch: "), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(b.answer(&reply(2, 0)[..20]), Some(Err(Failed::Unanswered(_)))));
    }

    /// Runs `nft` with `args` (and `stdin`) in the calling thread's network
    /// namespace (a child has its parent thread's).
    fn nft(args: &[&str], stdin: Option<&str>) -> String {
        use std::io::Write;
        let mut child = Command::new("nft")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nft (scripts/ensure-deps.sh installs it)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// (element, timeout in s if any) of a set, as nft lists it.
    fn listed(set: &str) -> Vec<(String, Option<u64>)> {
        let out = nft(&["-j", "list", "set", "inet", "fbbatch", set], None);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let elems = v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|o| o.get("set"))
            .and_then(|s| s.get("elem"))
            .and_then(|e| e.as_array().cloned())
            .unwrap_or_default();
        let mut out: Vec<(String, Option<u64>)> = elems
            .iter()
            .map(|e| match e {
                serde_json::Value::String(s) => (s.clone(), None),
                e => (
                    e["elem"]["val"].as_str().unwrap().to_owned(),
                    e["elem"]["timeout"].as_u64(),
                ),
            })
            .collect();
        out.sort();
        out
    }

    /// The kernel's nf_tables, in a network namespace of this test's
    /// thread (root): a batch of thousands of elements into four sets is
    /// all there with its timeouts; a batch with one deletion of an absent
    /// element is refused, named, and changes nothing; then the deletions
    /// go.
    #[test]
    fn the_kernel_takes_a_batch_whole_or_refuses_it_whole() {
        std::thread::spawn(|| {
            // SAFETY: unshare for this thread alone; no pointers.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "a network namespace (root): {}", io::Error::last_os_error());
            let sets = [
                ("v4", "ipv4_addr"),
                ("v6", "ipv6_addr"),
                ("v4n24", "ipv4_addr"),
                ("v6n48", "ipv6_addr"),
            ];
            let mut text = String::from("add table inet fbbatch\n");
            for (name, ty) in sets {
                text.push_str(&format!(
                    "add set inet fbbatch {name} {{ type {ty}; flags timeout; }}\n"
                ));
            }
            nft(&["-f", "-"], Some(&text));

            let now = crate::now_ms();
            let hour = 3_600_000;
            let mut add: Vec<(IpNet, Until)> = Vec::new();
            for i in 0..3_000u32 {
                add.push((
                    IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))),
                    Until::At(now + hour),
                ));
            }
            for i in 0..1_500u32 {
                add.push((
                    format!("10.{}.{}.0/24", 100 + i / 256, i % 256).parse().unwrap(),
                    Until::At(now + 2 * hour),
                ));
            }
            for i in 0..400u32 {
                add.push((format!("2001:db8:{i:x}::/48").parse().unwrap(), Until::Permanent));
                add.push((
                    format!("2001:db8:ffff:{i:x}::/64").parse().unwrap(),
                    Until::At(now + hour),
                ));
            }
            let plan = Plan { add, ..Plan::default() };
            let b = Batch::of("fbbatch", &plan, now).unwrap();
            b.send().unwrap_or_else(|e| panic!("{e}"));
            let (v4, v4n24, v6, v6n48) = (listed("v4"), listed("v4n24"), listed("v6"), listed("v6n48"));
            assert_eq!((v4.len(), v4n24.len(), v6.len(), v6n48.len()), (3_000, 1_500, 400, 400));
            assert!(v4.iter().all(|(_, t)| *t == Some(3_600)), "{:?}", &v4[..3]);
            assert!(v4n24.iter().all(|(_, t)| *t == Some(7_200)), "{:?}", &v4n24[..3]);
            assert!(v4.iter().any(|(a, _)| a == "10.0.11.183"));
            assert!(v4n24.iter().any(|(a, _)| a == "10.105.219.0"));
            assert!(v6n48.iter().all(|(_, t)| t.is_none()), "permanent: {:?}", &v6n48[..3]);
            assert!(v6n48.iter().any(|(a, _)| a == "2001:db8:18f::"));
            assert!(v6.iter().any(|(a, _)| a == "2001:db8:ffff:18f::"));

            // Added again with a later end: the kernel's timeouts follow
            // (a reconcile's refresh), nothing doubled.
            let plan = Plan {
                add: plan.add[..3_000]
                    .iter()
                    .map(|(n, _)| (*n, Until::At(now + 3 * hour)))
                    .collect(),
                ..Plan::default()
            };
            Batch::of("fbbatch", &plan, now)
                .unwrap()
                .send()
                .unwrap_or_else(|e| panic!("{e}"));
            let v4 = listed("v4");
            assert_eq!(v4.len(), 3_000);
            assert!(v4.iter().all(|(_, t)| *t == Some(10_800)), "{:?}", &v4[..3]);

            // One absent element among 2,000 deletions: refused whole.
            let mut delete: Vec<super::super::cover::Span> = (0..1_999u32)
                .map(|i| {
                    super::super::cover::Span::of(&IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(
                        0x0a00_0000 + i,
                    ))))
                })
                .collect();
            delete.push(super::super::cover::Span::of(&net("192.0.2.1/32")));
            let plan = Plan {
                delete,
                ..Plan::default()
            };
            match Batch::of("fbbatch", &plan, now).unwrap().send() {
                Err(Failed::Refused(why)) => {
                    assert!(
                        why.starts_with("nf_tables refused deleting from set v4: No such file"),
                        "{why}"
                    )
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(listed("v4").len(), 3_000, "nothing deleted");

            let mut plan = plan;
            plan.delete.pop();
            Batch::of("fbbatch", &plan, now)
                .unwrap()
                .send()
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(listed("v4").len(), 1_001);
        })
        .join()
        .unwrap();
    }
}
