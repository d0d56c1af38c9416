//! Networks that are never counted and never banned: loopback, this host's
//! own addresses, and the configured `allow:` list.

use std::net::IpAddr;

use ipnet::IpNet;

#[derive(Clone, Debug, Default)]
pub struct AllowList {
    nets: Vec<IpNet>,
}

impl AllowList {
    /// Loopback, the host's interface addresses and `configured`.
    pub fn new(configured: &[IpNet]) -> AllowList {
        let mut nets: Vec<IpNet> = vec![
            "127.0.0.0/8".parse().expect("literal"),
            "::1/128".parse().expect("literal"),
        ];
        nets.extend(local_addresses().into_iter().map(IpNet::from));
        nets.extend_from_slice(configured);
        AllowList { nets }
    }

    /// Only the given networks (tests, replay of another host's logs).
    pub fn only(nets: &[IpNet]) -> AllowList {
        AllowList { nets: nets.to_vec() }
    }

    pub fn contains(&self, a: IpAddr) -> bool {
        let a = super::normalize(a);
        self.nets.iter().any(|n| n.contains(&a))
    }

    /// True when banning `net` would drop any allowed address.
    pub fn overlaps(&self, net: &IpNet) -> bool {
        self.nets.iter().any(|n| n.contains(net) || net.contains(n))
    }
}

/// The addresses of this host's interfaces (getifaddrs).
fn local_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs fills a linked list we only read and then free.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_configured() {
        let a = AllowList::new(&["192.0.2.0/24".parse().unwrap()]);
        assert!(a.contains("127.0.0.1".parse().unwrap()));
        assert!(a.contains("::1".parse().unwrap()));
        assert!(a.contains("192.0.2.77".parse().unwrap()));
        assert!(a.contains("::ffff:192.0.2.77".parse().unwrap()));
        assert!(!a.contains("198.51.100.1".parse().unwrap()));
        assert!(a.overlaps(&"192.0.0.0/16".parse().unwrap()));
    }
}
