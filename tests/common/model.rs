//! The brute-force model of DESIGN §2, written as plainly as the text: each
//! hit in log order; a client banned at the hit's time is not counted;
//! members at or before now - window leave; a member seen before is not
//! counted twice; a window already holding `limit` members bans.
//! No batching, no expiry, no optimisation: the reference the real
//! implementations are compared with.

use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct ModelHit {
    pub rule: usize,
    pub key: String,
    pub time: i64,
    pub member: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct ModelRule {
    pub limit: usize,
    pub window: i64,
    pub ban_ms: i64,
}

/// A ban the model decides: which hit (index into the input) crossed the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelBan {
    pub hit: usize,
    pub key: String,
    pub rule: usize,
    pub at: i64,
    pub until: i64,
}

pub fn model(hits: &[ModelHit], rules: &[ModelRule]) -> Vec<ModelBan> {
    let mut windows: HashMap<(usize, String), Vec<(i64, u64)>> = HashMap::new();
    let mut banned_until: HashMap<String, i64> = HashMap::new();
    let mut out = Vec::new();
    for (i, h) in hits.iter().enumerate() {
        if banned_until.get(&h.key).is_some_and(|&u| h.time < u) {
            continue;
        }
        let r = rules[h.rule];
        let w = windows.entry((h.rule, h.key.clone())).or_default();
        w.retain(|&(score, _)| score > h.time - r.window);
        if w.iter().any(|&(_, m)| m == h.member) {
            continue;
        }
        if w.len() >= r.limit {
            let until = h.time + r.ban_ms;
            banned_until.insert(h.key.clone(), until);
            out.push(ModelBan {
                hit: i,
                key: h.key.clone(),
                rule: h.rule,
                at: h.time,
                until,
            });
            continue;
        }
        w.push((h.time, h.member));
    }
    out
}
