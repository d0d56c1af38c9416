//! Reads an nftables set back from the kernel (`nft -j list set`), so tests
//! check what is enforced rather than what the daemon says it did.

use super::{require, run_ok, NetNs};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The nft stand-in of `nft_shim.rs`, built once per test process (to a
/// temporary name, then renamed: test binaries build it side by side).
fn shim_program() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
            let out = dir.join("fbt-nft-shim");
            let tmp = dir.join(format!("fbt-nft-shim.{}", std::process::id()));
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/nft_shim.rs");
            run_ok(
                Command::new(require("rustc"))
                    .args(["--edition", "2021", "-O", "-o"])
                    .arg(&tmp)
                    .arg(&src),
            );
            std::fs::rename(&tmp, &out).expect("rename the nft shim");
            out
        })
        .clone()
}

/// An nft that a test can make fail or hang: the daemon's environment
/// (`FLEETBAN_NFT` and what the shim reads) and its control folder.
/// `fail()`: every transaction is refused until `heal()`; `hang()`: every
/// call waits until `release()`; `hang_if(text)`: the transactions holding
/// `text`, until `release_if()`.
pub struct NftShim {
    pub ctl: tempfile::TempDir,
    program: String,
    real: String,
    ctl_text: String,
}

impl NftShim {
    pub fn new() -> NftShim {
        let ctl = tempfile::Builder::new().prefix("fbt-nftctl-").tempdir().unwrap();
        NftShim {
            program: shim_program().to_string_lossy().into_owned(),
            real: require("nft").to_string_lossy().into_owned(),
            ctl_text: ctl.path().to_string_lossy().into_owned(),
            ctl,
        }
    }

    /// The environment that makes a daemon run nft through the shim.
    pub fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("FLEETBAN_NFT", self.program.as_str()),
            ("FBT_NFT_REAL", self.real.as_str()),
            ("FBT_NFT_CTL", self.ctl_text.as_str()),
        ]
    }

    fn flag(&self, name: &str, on: bool) {
        let p = self.ctl.path().join(name);
        match on {
            true => std::fs::write(&p, "").unwrap(),
            false => {
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    pub fn fail(&self) {
        self.flag("fail", true)
    }

    pub fn heal(&self) {
        self.flag("fail", false)
    }

    /// Transactions refused so far.
    pub fn refused(&self) -> usize {
        std::fs::read_to_string(self.ctl.path().join("failed")).map_or(0, |t| t.lines().count())
    }

    pub fn hang(&self) {
        self.flag("hang", true)
    }

    pub fn release(&self) {
        self.flag("hang", false)
    }

    /// Every transaction whose text contains `text` waits until
    /// `release_if()`; the others run.
    pub fn hang_if(&self, text: &str) {
        std::fs::write(self.ctl.path().join("hang-if"), text).unwrap()
    }

    pub fn release_if(&self) {
        self.flag("hang-if", false)
    }

    /// Whether an nft call is waiting in the shim now.
    pub fn hanging(&self) -> bool {
        self.ctl.path().join("hanging").exists()
    }
}

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
/// plain set `v4` (single addresses) and the sets per prefix length
/// `v4nL` (each address shown as `ADDR/L`); "v6" lists `v6` (/64 prefixes
/// by their network address, shown as `ADDR/64`) and `v6nL` (a /128 shown
/// as the bare address). Sorted by text.
pub fn nft_bans(ns: &NetNs, table: &str, family: &str) -> Vec<(String, Option<u64>)> {
    nft_bans_detailed(ns, table, family)
        .into_iter()
        .map(|e| (e.elem, e.timeout_ms))
        .collect()
}

/// As [`nft_bans`], with the time left (`expires`) too.
pub fn nft_bans_detailed(ns: &NetNs, table: &str, family: &str) -> Vec<NftElem> {
    let mut out: Vec<NftElem> = Vec::new();
    for (set, len) in ban_sets(ns, table, family) {
        let max = if family == "v4" { 32 } else { 128 };
        out.extend(
            nft_set_elements_detailed(ns, table, &set)
                .into_iter()
                .map(|e| match len {
                    Some(len) if len != max => NftElem {
                        elem: format!("{}/{len}", e.elem),
                        ..e
                    },
                    _ => e,
                }),
        );
    }
    out.sort_by(|a, b| (&a.elem, a.timeout_ms).cmp(&(&b.elem, b.timeout_ms)));
    out
}

/// The ban sets of `family` in the table: (`v4`, None) or (`v6`, Some(64)),
/// then each `v4nL` / `v6nL` with its L, and the old layout's interval set
/// `v4net` / `v6net` (None) if it is there.
pub fn ban_sets(ns: &NetNs, table: &str, family: &str) -> Vec<(String, Option<u8>)> {
    let fixed = if family == "v6" { Some(64) } else { None };
    let mut out = vec![(family.to_owned(), fixed)];
    let listed = ns.run(&["nft", "-j", "list", "sets", "inet"]);
    let doc: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
    for item in doc["nftables"].as_array().into_iter().flatten() {
        let Some(set) = item.get("set").filter(|s| s["table"] == table) else {
            continue;
        };
        let name = set["name"].as_str().unwrap_or_default();
        if let Some(len) = name
            .strip_prefix(&format!("{family}n"))
            .and_then(|l| l.parse::<u8>().ok())
        {
            out.push((name.to_owned(), Some(len)));
        } else if name == format!("{family}net") {
            out.push((name.to_owned(), None));
        }
    }
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
