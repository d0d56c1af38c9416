//! Changes to the local set, the vocabulary between who decides a ban and
//! the task that owns the firewall: this host's decisions (`bans`) and the
//! fleet's (`fleet`) are sent as [`Change`]s through [`Changes`] to the
//! enforcer task and to the pipeline's view of the list, and the enforcer
//! folds what queued up into one nft transaction ([`fold`]).

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
pub fn fold(queue: Vec<Change>) -> Folded {
    let mut f = Folded::default();
    for c in queue {
        match c {
            Change::Replace(elems) => {
                f = Folded {
                    replace: Some(elems),
                    ..Folded::default()
                };
            }
            Change::Add(elems) => {
                f.removes.retain(|n| !elems.iter().any(|e| e.net == *n));
                match &mut f.replace {
                    Some(r) => {
                        r.retain(|x| !elems.iter().any(|e| e.net == x.net));
                        r.extend(elems);
                    }
                    None => f.adds.extend(elems),
                }
            }
            Change::Remove(nets) => {
                f.adds.retain(|e| !nets.contains(&e.net));
                match &mut f.replace {
                    Some(r) => r.retain(|e| !nets.contains(&e.net)),
                    None => f.removes.extend(nets),
                }
            }
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
