//! Reads an nftables set back from the kernel (`nft -j list set`), so tests
//! check what is enforced rather than what the daemon says it did.

use super::NetNs;
use serde_json::Value;

/// One set element as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftElem {
    /// `"203.0.113.7"`, `"2001:db8::/64"`, or `"a-b"` for a range that is not
    /// a prefix.
    pub elem: String,
    /// The timeout it was added with, in ms; None for a permanent element.
    /// `nft -j` reports whole seconds, so this is a multiple of 1000.
    pub timeout_ms: Option<u64>,
    /// Time left before the kernel drops it, in ms (whole seconds, as above).
    pub expires_ms: Option<u64>,
}

/// The elements of set `set` in `table inet <table>` inside `ns`, sorted by
/// text, with their timeouts in ms (None: permanent). Empty if the set is
/// empty; panics if the set does not exist.
pub fn nft_set_elements(ns: &NetNs, table: &str, set: &str) -> Vec<(String, Option<u64>)> {
    nft_set_elements_detailed(ns, table, set)
        .into_iter()
        .map(|e| (e.elem, e.timeout_ms))
        .collect()
}

/// The bans of one family in fleetban's layout: `family` "v4" lists the
/// plain set `v4` (single addresses) and the interval set `v4net`; "v6"
/// lists `v6` (/64 prefixes by their network address, shown as `ADDR/64`)
/// and `v6net`. Sorted by text.
pub fn nft_bans(ns: &NetNs, table: &str, family: &str) -> Vec<(String, Option<u64>)> {
    nft_bans_detailed(ns, table, family)
        .into_iter()
        .map(|e| (e.elem, e.timeout_ms))
        .collect()
}

/// As [`nft_bans`], with the time left (`expires`) too.
pub fn nft_bans_detailed(ns: &NetNs, table: &str, family: &str) -> Vec<NftElem> {
    let mut out: Vec<NftElem> = nft_set_elements_detailed(ns, table, family)
        .into_iter()
        .map(|e| match family {
            "v6" => NftElem {
                elem: format!("{}/64", e.elem),
                ..e
            },
            _ => e,
        })
        .chain(nft_set_elements_detailed(ns, table, &format!("{family}net")))
        .collect();
    out.sort_by(|a, b| (&a.elem, a.timeout_ms).cmp(&(&b.elem, b.timeout_ms)));
    out
}

/// As [`nft_set_elements`], with the time left (`expires`) too.
pub fn nft_set_elements_detailed(ns: &NetNs, table: &str, set: &str) -> Vec<NftElem> {
    let out = ns.run(&["nft", "-j", "list", "set", "inet", table, set]);
    let text = String::from_utf8_lossy(&out.stdout);
    parse_set_json(&text).unwrap_or_else(|e| panic!("nft -j list set {table} {set}: {e}\n{text}"))
}

/// Parses the output of `nft -j list set`. Public to the harness so its own
/// tests can feed it canned JSON.
pub fn parse_set_json(text: &str) -> Result<Vec<NftElem>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let items = doc["nftables"].as_array().ok_or("no \"nftables\" array")?;
    let set = items.iter().find_map(|i| i.get("set")).ok_or("no set object")?;
    let Some(elems) = set.get("elem") else {
        return Ok(Vec::new());
    };
    let elems = elems.as_array().ok_or("\"elem\" is not an array")?;
    let mut out = elems.iter().map(parse_elem).collect::<Result<Vec<_>, _>>()?;
    out.sort_by(|a, b| a.elem.cmp(&b.elem));
    Ok(out)
}

fn parse_elem(v: &Value) -> Result<NftElem, String> {
    if let Some(inner) = v.get("elem") {
        let secs = |k: &str| inner.get(k).and_then(Value::as_u64).map(|s| s * 1000);
        return Ok(NftElem {
            elem: value_text(&inner["val"])?,
            timeout_ms: secs("timeout"),
            expires_ms: secs("expires"),
        });
    }
    Ok(NftElem {
        elem: value_text(v)?,
        timeout_ms: None,
        expires_ms: None,
    })
}

fn value_text(v: &Value) -> Result<String, String> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_string());
    }
    if let Some(n) = v.as_u64() {
        return Ok(n.to_string());
    }
    if let Some(p) = v.get("prefix") {
        let addr = p["addr"].as_str().ok_or_else(|| format!("bad prefix {p}"))?;
        let len = p["len"].as_u64().ok_or_else(|| format!("bad prefix {p}"))?;
        return Ok(format!("{addr}/{len}"));
    }
    if let Some(r) = v.get("range").and_then(Value::as_array) {
        if let [a, b] = &r[..] {
            return Ok(format!("{}-{}", value_text(a)?, value_text(b)?));
        }
    }
    Err(format!("unknown element form {v}"))
}
