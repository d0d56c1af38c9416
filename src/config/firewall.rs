//! The `firewall:` section, and the enforcer it asks for.

use std::path::Path;

use super::{schema, ActionSpec, Backend, ConfigError};
use crate::enforce::{Action, EnforceError, Enforcer, NftOptions};

#[derive(Debug, Clone)]
pub struct FirewallConfig {
    pub backend: Backend,
    pub table: String,
    pub action: ActionSpec,
    pub ports: Vec<u16>,
}

impl FirewallConfig {
    /// The firewall this section asks for (`log` on a dry run). The nft
    /// binary is `nft`, or `$FLEETBAN_NFT` (tests, unusual installs: a
    /// path, run as argv, never as a shell string, for every command: the
    /// in-process libnftables is the system nft's).
    pub fn enforcer(&self, dry_run: bool) -> Result<Enforcer, EnforceError> {
        if dry_run || self.backend == Backend::Log {
            return Ok(Enforcer::log());
        }
        let (command, library) = match std::env::var("FLEETBAN_NFT") {
            Ok(p) if !p.is_empty() => (vec![p], false),
            _ => (vec!["nft".to_owned()], true),
        };
        Enforcer::nft(NftOptions {
            table: self.table.clone(),
            action: match self.action {
                ActionSpec::Drop => Action::Drop,
                ActionSpec::Reject => Action::Reject,
            },
            ports: self.ports.clone(),
            command,
            library,
            list_max: crate::enforce::LIST_MAX,
        })
    }
}

pub(super) fn firewall_config(
    file: &Path,
    f: &schema::FirewallSection,
    errors: &mut Vec<ConfigError>,
) -> FirewallConfig {
    let table = match &f.table {
        None => "fleetban".to_owned(),
        Some(t) => {
            let ok = !t.value.is_empty()
                && t.value.len() <= 32
                && t.value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                errors.push(ConfigError::at(
                    file,
                    t.referenced,
                    format!("invalid table name `{}`: expected 1-32 letters, digits or `_`", t.value),
                ));
            }
            t.value.clone()
        }
    };
    FirewallConfig {
        backend: f.backend,
        table,
        action: f.action,
        ports: f.ports.0.iter().map(|p| p.0).collect(),
    }
}
