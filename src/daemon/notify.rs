//! systemd's notify protocol: one datagram to $NOTIFY_SOCKET per state
//! change (READY=1, STOPPING=1, STATUS=...). Nothing happens without it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(std::path::Path::new(&path)),
    };
    if let Ok(addr) = addr {
        let _ = sock.send_to_addr(state.as_bytes(), &addr);
    }
}
