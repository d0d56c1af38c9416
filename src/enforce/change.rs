//! Changes to the local set, the vocabulary between who decides a ban and
//! the task that owns the firewall: this host's decisions (`bans`) and the
//! fleet's (`fleet`) are sent as [`Change`]s through [`Changes`] to the
//! enforcer task and to the pipeline's view of the list, and the enforcer
//! folds what queued up into one nft transaction ([`fold`]).

use std::collections::HashMap;

use ipnet::IpNet;
use tokio::sync::mpsc::UnboundedSender;

use super::Element;

/// One change to the local set (also what keeps the pipeline's view of the
/// list current).
#[derive(Clone, Debug)]
pub enum Change {
    Add(Vec<Element>),
    Remove(Vec<IpNet>),
    /// The whole list (after a reconcile).
    Replace(Vec<Element>),
}

/// Where changes go: every receiver gets every change, in the order sent.
#[derive(Clone, Default)]
pub struct Changes(Vec<UnboundedSender<Change>>);

impl Changes {
    pub fn to(sinks: Vec<UnboundedSender<Change>>) -> Changes {
        Changes(sinks)
    }

    /// Sends `c` to every receiver still listening.
    pub fn send(&self, c: Change) {
        if let Some((last, rest)) = self.0.split_last() {
            for s in rest {
                let _ = s.send(c.clone());
            }
            let _ = last.send(c);
        }
    }
}

/// A queue of changes folded into what one nft transaction must do.
#[derive(Default, Debug, PartialEq)]
pub struct Folded {
    /// A reconcile target, with later adds and removes applied to it.
    pub replace: Option<Vec<Element>>,
    pub adds: Vec<Element>,
    pub removes: Vec<IpNet>,
}

/// Folds `queue`, oldest first, into one [`Folded`]: a later change wins.
/// One pass and one hash map, in proportion to the changes: a reconcile's
/// `Replace` of 1,000,000 bans followed by the events queued while the
/// enforcer was busy used to be scanned whole once per event, and queued
/// adds once per remove (quadratic).
pub fn fold(queue: Vec<Change>) -> Folded {
    let mut replace = None;
    // Each add (Some) or remove (None) after the last Replace, in order.
    let mut ops: Vec<(IpNet, Option<Element>)> = Vec::new();
    for c in queue {
        match c {
            Change::Replace(elems) => {
                replace = Some(elems);
                ops.clear();
            }
            Change::Add(elems) => ops.extend(elems.into_iter().map(|e| (e.net, Some(e)))),
            Change::Remove(nets) => ops.extend(nets.into_iter().map(|n| (n, None))),
        }
    }
    let last: HashMap<IpNet, usize> = ops.iter().enumerate().map(|(i, (n, _))| (*n, i)).collect();
    let mut f = Folded::default();
    if let Some(mut r) = replace {
        r.retain(|x| !last.contains_key(&x.net));
        f.replace = Some(r);
    }
    for (i, (net, op)) in ops.into_iter().enumerate() {
        if last.get(&net) != Some(&i) {
            continue;
        }
        match (op, &mut f.replace) {
            (Some(e), Some(r)) => r.push(e),
            (Some(e), None) => f.adds.push(e),
            (None, Some(_)) => {}
            (None, None) => f.removes.push(net),
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Until;

    fn el(s: &str) -> Element {
        Element {
            net: s.parse().unwrap(),
            until: Until::At(1),
        }
    }

    #[test]
    fn folds_into_one_transaction() {
        let f = fold(vec![
            Change::Add(vec![el("192.0.2.1/32")]),
            Change::Remove(vec!["192.0.2.1/32".parse().unwrap(), "192.0.2.2/32".parse().unwrap()]),
            Change::Add(vec![el("192.0.2.2/32"), el("192.0.2.3/32")]),
        ]);
        assert_eq!(f.adds, vec![el("192.0.2.2/32"), el("192.0.2.3/32")]);
        assert_eq!(f.removes, vec!["192.0.2.1/32".parse::<IpNet>().unwrap()]);
        let f = fold(vec![
            Change::Add(vec![el("192.0.2.9/32")]),
            Change::Replace(vec![el("192.0.2.1/32")]),
            Change::Add(vec![el("192.0.2.2/32")]),
            Change::Remove(vec!["192.0.2.1/32".parse().unwrap()]),
        ]);
        assert_eq!(f.replace, Some(vec![el("192.0.2.2/32")]));
        assert!(f.adds.is_empty() && f.removes.is_empty());
    }

    /// Applying the folded batch leaves the set as applying each change in
    /// turn does, over random queues of a few nets (many repeats).
    #[test]
    fn a_folded_queue_ends_where_its_changes_one_by_one_end() {
        use std::collections::BTreeMap;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let net = |i: u64| -> IpNet { format!("192.0.2.{i}/32").parse().unwrap() };
        for _ in 0..2_000 {
            let start: BTreeMap<IpNet, Until> = (0..rnd(4)).map(|i| (net(i), Until::At(0))).collect();
            let mut queue = Vec::new();
            for _ in 0..rnd(8) {
                let kind = rnd(5);
                let mut elems = |k: u64| -> Vec<Element> {
                    (0..k)
                        .map(|_| Element {
                            net: net(rnd(6)),
                            until: Until::At(rnd(1000) as i64),
                        })
                        .collect()
                };
                queue.push(match kind {
                    0 => Change::Replace(elems(3)),
                    1 | 2 => Change::Add(elems(2)),
                    _ => Change::Remove(elems(2).into_iter().map(|e| e.net).collect()),
                });
            }
            let mut model = start.clone();
            for c in queue.clone() {
                match c {
                    Change::Replace(e) => model = e.into_iter().map(|e| (e.net, e.until)).collect(),
                    Change::Add(e) => model.extend(e.into_iter().map(|e| (e.net, e.until))),
                    Change::Remove(n) => {
                        for n in &n {
                            model.remove(n);
                        }
                    }
                }
            }
            let f = fold(queue.clone());
            let mut got = match f.replace {
                Some(r) => r.into_iter().map(|e| (e.net, e.until)).collect(),
                None => start,
            };
            got.extend(f.adds.into_iter().map(|e| (e.net, e.until)));
            for n in &f.removes {
                got.remove(n);
            }
            assert_eq!(got, model, "{queue:?}");
        }
    }

    #[test]
    fn every_receiver_gets_every_change_in_order() {
        let (a, mut ra) = tokio::sync::mpsc::unbounded_channel();
        let (b, mut rb) = tokio::sync::mpsc::unbounded_channel();
        let changes = Changes::to(vec![a, b]);
        changes.send(Change::Add(vec![el("192.0.2.1/32")]));
        changes.send(Change::Remove(vec!["192.0.2.1/32".parse().unwrap()]));
        for r in [&mut ra, &mut rb] {
            assert!(matches!(r.try_recv(), Ok(Change::Add(_))));
            assert!(matches!(r.try_recv(), Ok(Change::Remove(_))));
            assert!(r.try_recv().is_err());
        }
        Changes::default().send(Change::Remove(Vec::new()));
    }
}
