//! Whether this Redis user may do what fleetban does (`fleetban check
//! --online`): PING, then `lua/probe.lua`, loaded and called by SHA as the
//! daemon calls its scripts, tries every command fleetban sends (directly
//! or inside its scripts: Redis checks both against the user) on two probe
//! keys of the two key patterns of `config/redis-acl.conf`, and names the
//! ones refused. Nothing it writes outlives the call.

use super::{Conn, Keys, PROBE};

/// What the probe found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Commands the user may not run, as ACL rules name them (`zcount`,
    /// `script|load`, `xinfo|stream`), in the order fleetban needs them.
    pub denied: Vec<String>,
    /// The probe script could not run (`evalsha` or `script|load`
    /// refused): the commands inside the scripts were not tried.
    pub scripts_unchecked: bool,
}

/// A refusal by the server's ACL, not another error.
fn is_denied(e: &redis::RedisError) -> bool {
    let text = e.to_string();
    e.code() == Some("NOPERM") || text.contains("NOPERM") || text.contains("can't run this command")
}

/// Asks the server. An error is Redis not answering (or refusing the
/// connection, the password): nothing could be probed.
pub async fn probe(con: &mut Conn, keys: &Keys) -> redis::RedisResult<Probe> {
    let mut found = Probe::default();
    match redis::cmd("PING").query_async::<String>(con).await {
        Ok(_) => {}
        Err(e) if is_denied(&e) => found.denied.push("ping".to_owned()),
        Err(e) => return Err(e),
    }
    if let Err(e) = PROBE.load(con).await {
        if !is_denied(&e) {
            return Err(e);
        }
        found.denied.push("script|load".to_owned());
    }
    let [w, l] = keys.probe();
    match PROBE.run::<Vec<String>>(con, &PROBE.cmd(&[&w, &l])).await {
        Ok(denied) => found.denied.extend(denied),
        Err(e) if is_denied(&e) => {
            found.denied.push("evalsha".to_owned());
            found.scripts_unchecked = true;
        }
        // SCRIPT LOAD was refused, so the script is not there to run.
        Err(e) if super::is_noscript(&e) => found.scripts_unchecked = true,
        Err(e) => return Err(e),
    }
    Ok(found)
}
