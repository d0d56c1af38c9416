//! Where the endpoint listens: [`bind`] makes the socket `http.listen`
//! names (a unix socket replacing a stale one, mode 0660 and the group
//! `http.group` or `www-data`, else root's only; or loopback TCP), and the
//! server accepts on it one stream type whichever it is.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::config::{HttpConfig, Listen, DEFAULT_HTTP_GROUP};

/// A bound `http.listen`.
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// Binds `http.listen`. A unix socket replaces a stale one, gets mode 0660
/// and the group `http.group` (default `www-data`) when that group exists;
/// otherwise it stays root's (0600) and a warning says so.
pub async fn bind(http: &HttpConfig) -> std::io::Result<Listener> {
    match &http.listen {
        Listen::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr).await?)),
        Listen::Unix(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // A socket left by a previous run refuses bind: remove it.
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = UnixListener::bind(path)?;
            let name = http.group.as_deref().unwrap_or(DEFAULT_HTTP_GROUP);
            let mode = match give_group(path, name) {
                Ok(()) => 0o660,
                Err(why) => {
                    tracing::warn!(socket = %path.display(), group = name, "{why}; the socket is root's only (mode 0600).");
                    0o600
                }
            };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            Ok(Listener::Unix(listener))
        }
    }
}

/// Gives the socket at `path` the group `name`: nothing to do when it was
/// created with it (the process's group, e.g. a unit's `Group=`), else a
/// chown, which needs root or membership of the group.
fn give_group(path: &Path, name: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let gid = group_id(name).ok_or_else(|| format!("group `{name}` does not exist"))?;
    if std::fs::metadata(path).is_ok_and(|m| m.gid() == gid) {
        return Ok(());
    }
    std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| format!("giving it group `{name}` failed: {e}"))
}

/// The id of the group `name`, from the system's group database.
fn group_id(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    // SAFETY: an all-zero `group` is a valid value (null pointers, zero id);
    // getgrnam_r only writes into it and into `buf`, within `buf.len()`.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `found` is set to
    // `&mut group` or null.
    let rc = unsafe { libc::getgrnam_r(name.as_ptr(), &mut group, buf.as_mut_ptr(), buf.len(), &mut found) };
    (rc == 0 && !found.is_null()).then_some(group.gr_gid)
}

/// One accepted connection, of either kind.
pub(super) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

pub(super) async fn accept(listener: &Listener) -> std::io::Result<Stream> {
    match listener {
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
    }
}
