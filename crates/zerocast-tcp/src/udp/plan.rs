//! From an endpoint and a config to what the socket must be: the bind
//! address, the multicast interface, TTL, loop and group. No I/O here except
//! resolving a host name in a `ud://` endpoint.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use zerocast_core::{Endpoint, Scheme};

use super::{UdpConfig, UdpError};

/// The interface multicast goes out of and groups are joined on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Iface {
    /// An IPv4 interface, named by one of its addresses.
    V4(Ipv4Addr),
    /// An IPv6 interface index, if one was given.
    V6(Option<u32>),
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Iface::V4(a) => write!(f, "{a}"),
            Iface::V6(Some(i)) => write!(f, "index {i}"),
            Iface::V6(None) => f.write_str("(none)"),
        }
    }
}

/// How to set up one socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    /// Where to bind.
    pub(super) bind: SocketAddr,
    pub(super) iface: Iface,
    /// The group to join at once (`mcast://` only).
    pub(super) group: Option<IpAddr>,
    pub(super) ttl: u32,
    pub(super) mcast_loop: bool,
    /// Most sources tracked.
    pub(super) max_sources: usize,
}

fn bad(ep: &Endpoint, reason: impl Into<String>) -> UdpError {
    UdpError::BadEndpoint { endpoint: ep.to_string(), reason: reason.into() }
}

/// `ud://host:port[?iface=…]`.
pub(super) fn unicast(ep: &Endpoint, cfg: &UdpConfig) -> Result<Plan, UdpError> {
    if ep.scheme() != Scheme::Ud {
        return Err(bad(ep, format!("UdpSocket::bind takes ud://host:port, not {}://", ep.scheme())));
    }
    let port = ep.port().ok_or_else(|| bad(ep, "no port; write ud://host:port (port 0 picks one)"))?;
    let bind = match ep.host().parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => ep
            .authority()
            .to_socket_addrs()
            .map_err(|e| UdpError::Resolve { endpoint: ep.to_string(), source: Some(e) })?
            .next()
            .ok_or_else(|| UdpError::Resolve { endpoint: ep.to_string(), source: None })?,
    };
    if bind.ip().is_multicast() {
        return Err(bad(
            ep,
            "a multicast group cannot be bound with ud://; use mcast://group:port?iface=addr",
        ));
    }
    let default_v4 = match bind.ip() {
        IpAddr::V4(a) if !a.is_unspecified() => a,
        _ => Ipv4Addr::LOCALHOST,
    };
    let iface = iface(ep, &bind, default_v4)?;
    let max_sources = max_sources(ep, cfg)?;
    Ok(Plan { bind, iface, group: None, ttl: cfg.multicast_ttl, mcast_loop: cfg.multicast_loop, max_sources })
}

/// `mcast://group:port[?iface=…&ttl=N&loop=0|1]`.
pub(super) fn multicast(ep: &Endpoint, cfg: &UdpConfig) -> Result<Plan, UdpError> {
    if ep.scheme() != Scheme::Mcast {
        return Err(bad(
            ep,
            format!("UdpSocket::multicast takes mcast://group:port, not {}://", ep.scheme()),
        ));
    }
    let group: IpAddr = ep
        .host()
        .parse()
        .map_err(|_| bad(ep, "the group must be an IP address such as 239.1.2.3, not a host name"))?;
    if !group.is_multicast() {
        return Err(bad(
            ep,
            format!("{group} is not a multicast group; use 239.0.0.0/8 locally, or ff00::/8"),
        ));
    }
    let port = match ep.port() {
        Some(p) if p != 0 => p,
        _ => return Err(bad(ep, "a multicast group needs a fixed port that every member binds")),
    };
    let bind = SocketAddr::new(group, port);
    let iface = iface(ep, &bind, Ipv4Addr::LOCALHOST)?;
    if iface == Iface::V6(None) {
        return Err(bad(
            ep,
            "IPv6 multicast needs `?iface=N`, an interface index (see `ip link`; lo is usually 1)",
        ));
    }
    let ttl = ep.param_as::<u32>("ttl").map_err(|e| bad(ep, e.to_string()))?.unwrap_or(cfg.multicast_ttl);
    if ttl > 255 {
        return Err(bad(ep, format!("ttl={ttl} is out of range; use 0..=255")));
    }
    let mcast_loop = match ep.param("loop") {
        None => cfg.multicast_loop,
        Some("1" | "true") => true,
        Some("0" | "false") => false,
        Some(v) => return Err(bad(ep, format!("loop={v} is not a flag; use loop=0 or loop=1"))),
    };
    let max_sources = max_sources(ep, cfg)?;
    Ok(Plan { bind, iface, group: Some(group), ttl, mcast_loop, max_sources })
}

/// The `max_sources` parameter, else the config's.
fn max_sources(ep: &Endpoint, cfg: &UdpConfig) -> Result<usize, UdpError> {
    let n =
        ep.param_as::<usize>("max_sources").map_err(|e| bad(ep, e.to_string()))?.unwrap_or(cfg.max_sources);
    if n == 0 {
        return Err(bad(ep, "max_sources=0 would track no source; use 1 or more (default 4096)"));
    }
    Ok(n)
}

/// The `iface` parameter: an IPv4 address for IPv4, an interface index for IPv6.
fn iface(ep: &Endpoint, bind: &SocketAddr, default_v4: Ipv4Addr) -> Result<Iface, UdpError> {
    let given = ep.param("iface");
    Ok(match bind {
        SocketAddr::V4(_) => Iface::V4(match given {
            None => default_v4,
            Some(v) => v
                .parse::<Ipv4Addr>()
                .map_err(|_| bad(ep, format!("iface={v} is not an IPv4 address; name the interface by its address")))?,
        }),
        SocketAddr::V6(_) => Iface::V6(match given {
            None => None,
            Some(v) => Some(v.parse::<u32>().map_err(|_| {
                bad(ep, format!("iface={v} is not an interface index; IPv6 names the interface by its index (`ip link`)"))
            })?),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> Endpoint {
        Endpoint::parse(s).unwrap()
    }

    fn reason(r: Result<Plan, UdpError>) -> String {
        match r {
            Err(UdpError::BadEndpoint { reason, .. }) => reason,
            other => panic!("expected BadEndpoint, got {other:?}"),
        }
    }

    #[test]
    fn unicast_plans() {
        let cfg = UdpConfig::default();
        let p = unicast(&ep("ud://127.0.0.1:0"), &cfg).unwrap();
        assert_eq!(p.bind, "127.0.0.1:0".parse().unwrap());
        assert_eq!(p.iface, Iface::V4(Ipv4Addr::LOCALHOST));
        assert_eq!((p.group, p.ttl, p.mcast_loop), (None, 1, true));
        let p = unicast(&ep("ud://0.0.0.0:9000"), &cfg).unwrap();
        assert_eq!(p.iface, Iface::V4(Ipv4Addr::LOCALHOST), "unspecified binds default to loopback");
        let p = unicast(&ep("ud://0.0.0.0:9000?iface=10.1.2.3"), &cfg).unwrap();
        assert_eq!(p.iface, Iface::V4(Ipv4Addr::new(10, 1, 2, 3)));
        let p = unicast(&ep("ud://[::1]:7?iface=1"), &cfg).unwrap();
        assert_eq!((p.bind, p.iface), ("[::1]:7".parse().unwrap(), Iface::V6(Some(1))));
        assert_eq!(unicast(&ep("ud://localhost:5"), &cfg).unwrap().bind.port(), 5);
    }

    #[test]
    fn max_sources_from_the_endpoint_or_the_config() {
        let cfg = UdpConfig::default();
        assert_eq!(unicast(&ep("ud://127.0.0.1:0"), &cfg).unwrap().max_sources, 4096);
        let small = UdpConfig::default().with_max_sources(8);
        assert_eq!(unicast(&ep("ud://127.0.0.1:0"), &small).unwrap().max_sources, 8);
        assert_eq!(unicast(&ep("ud://127.0.0.1:0?max_sources=16"), &small).unwrap().max_sources, 16);
        assert_eq!(multicast(&ep("mcast://239.1.2.3:5000?max_sources=3"), &cfg).unwrap().max_sources, 3);
        assert!(reason(unicast(&ep("ud://127.0.0.1:0?max_sources=0"), &cfg)).contains("1 or more"));
        assert!(reason(multicast(&ep("mcast://239.1.2.3:5000?max_sources=x"), &cfg)).contains("max_sources"));
    }

    #[test]
    fn multicast_plans() {
        let cfg = UdpConfig::default();
        let p = multicast(&ep("mcast://239.1.2.3:5000"), &cfg).unwrap();
        assert_eq!(p.bind, "239.1.2.3:5000".parse().unwrap());
        assert_eq!(p.group, Some("239.1.2.3".parse().unwrap()));
        assert_eq!(p.iface, Iface::V4(Ipv4Addr::LOCALHOST), "iface defaults to loopback");
        let p = multicast(&ep("mcast://239.1.2.3:5000?iface=127.0.0.1&ttl=4&loop=0"), &cfg).unwrap();
        assert_eq!((p.ttl, p.mcast_loop), (4, false));
        let p = multicast(&ep("mcast://ff15::1:5000?iface=1"), &cfg).unwrap();
        assert_eq!(p.iface, Iface::V6(Some(1)));
        assert_eq!(p.iface.to_string(), "index 1");
    }

    #[test]
    fn bad_endpoints_say_what_to_write() {
        let cfg = UdpConfig::default();
        assert!(reason(unicast(&ep("tcp://127.0.0.1:1"), &cfg)).contains("ud://host:port"));
        assert!(reason(unicast(&ep("ud://239.1.1.1:1"), &cfg)).contains("mcast://"));
        assert!(reason(unicast(&ep("ud://0.0.0.0:1?iface=eth0"), &cfg)).contains("not an IPv4 address"));
        assert!(reason(multicast(&ep("ud://239.1.1.1:1"), &cfg)).contains("mcast://group:port"));
        assert!(reason(multicast(&ep("mcast://10.0.0.1:1"), &cfg)).contains("not a multicast group"));
        assert!(reason(multicast(&ep("mcast://grp.example:1"), &cfg)).contains("IP address"));
        assert!(reason(multicast(&ep("mcast://239.1.1.1:0"), &cfg)).contains("fixed port"));
        assert!(reason(multicast(&ep("mcast://239.1.1.1:1?ttl=300"), &cfg)).contains("0..=255"));
        assert!(reason(multicast(&ep("mcast://239.1.1.1:1?ttl=x"), &cfg)).contains("ttl"));
        assert!(reason(multicast(&ep("mcast://239.1.1.1:1?loop=yes"), &cfg)).contains("loop=0"));
        assert!(reason(multicast(&ep("mcast://ff15::1:1"), &cfg)).contains("?iface=N"));
        assert!(reason(multicast(&ep("mcast://ff15::1:1?iface=lo"), &cfg)).contains("index"));
    }
}
