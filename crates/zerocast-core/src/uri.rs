//! Endpoint URIs: which transport, and where.
//!
//! | URI | transport |
//! |---|---|
//! | `tcp://host:port` | TCP byte stream |
//! | `rc://host:port` | RDMA reliable connected, connected through rdma_cm |
//! | `rc+oob://host:port` | RDMA RC, QP details exchanged over a TCP side channel |
//! | `ud://host:port` | unreliable datagrams: RDMA UD, or UDP as the fallback |
//! | `mcast://group:port?iface=addr` | multicast datagrams |
//! | `mem://name` | in-process, for tests and same-process pipelines |
//! | `host:port` or `auto://host:port` | the first usable transport of an ordered list |
//!
//! Query parameters (`?k=v&k2=v2`) are checked against the scheme: an
//! unknown key is an error, not something silently ignored.

use std::fmt;
use std::str::FromStr;

/// The transport a URI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `tcp://`
    Tcp,
    /// `rc://`
    Rc,
    /// `rc+oob://`
    RcOob,
    /// `ud://`
    Ud,
    /// `mcast://`
    Mcast,
    /// `mem://`
    Mem,
    /// `auto://` or no scheme: resolved from a [`TransportList`].
    Auto,
}

impl Scheme {
    /// The scheme as written in a URI.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::Rc => "rc",
            Scheme::RcOob => "rc+oob",
            Scheme::Ud => "ud",
            Scheme::Mcast => "mcast",
            Scheme::Mem => "mem",
            Scheme::Auto => "auto",
        }
    }

    /// Whether the scheme names a connection-oriented (stream) transport.
    pub fn is_connected(self) -> bool {
        matches!(self, Scheme::Tcp | Scheme::Rc | Scheme::RcOob | Scheme::Mem | Scheme::Auto)
    }

    fn params(self) -> &'static [&'static str] {
        match self {
            Scheme::Tcp => &["window", "heartbeat_ms", "close_timeout_ms", "max_payload"],
            Scheme::Rc | Scheme::RcOob => &[
                "window",
                "heartbeat_ms",
                "close_timeout_ms",
                "max_payload",
                "dev",
                "gid_index",
                "srq",
                "srq_limit",
            ],
            Scheme::Ud => &["iface", "dev", "max_sources"],
            Scheme::Mcast => &["iface", "dev", "ttl", "loop", "max_sources"],
            Scheme::Mem => &["window", "heartbeat_ms", "max_payload"],
            Scheme::Auto => &["window", "heartbeat_ms", "close_timeout_ms", "max_payload"],
        }
    }
}

impl FromStr for Scheme {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, UriError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "tcp" => Scheme::Tcp,
            "rc" => Scheme::Rc,
            "rc+oob" => Scheme::RcOob,
            "ud" => Scheme::Ud,
            "mcast" => Scheme::Mcast,
            "mem" => Scheme::Mem,
            "auto" => Scheme::Auto,
            _ => return Err(UriError::UnknownScheme(s.to_owned())),
        })
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed endpoint URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    scheme: Scheme,
    /// Host name or address (`mem://`: the name). IPv6 without brackets.
    host: String,
    port: Option<u16>,
    params: Vec<(String, String)>,
}

/// Why a URI could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// A scheme zerocast does not know.
    #[error("unknown transport scheme `{0}`; use tcp, rc, rc+oob, ud, mcast, mem or auto")]
    UnknownScheme(String),
    /// No host (or, for `mem://`, no name).
    #[error("endpoint `{0}` has no host")]
    MissingHost(String),
    /// A network scheme without a port.
    #[error("endpoint `{0}` needs a port, as in tcp://127.0.0.1:7000")]
    MissingPort(String),
    /// A port that is not a number in 0..=65535.
    #[error("endpoint `{0}` has a bad port")]
    BadPort(String),
    /// A query parameter the scheme does not take.
    #[error("`{key}` is not a parameter of {scheme}:// (it takes: {allowed})")]
    UnknownParam {
        /// The scheme.
        scheme: Scheme,
        /// The key given.
        key: String,
        /// The keys the scheme takes.
        allowed: String,
    },
    /// A parameter given as `k` without `=v`, or twice.
    #[error("malformed query parameter `{0}`")]
    BadParam(String),
    /// A parameter whose value does not parse.
    #[error("parameter `{key}` has a bad value `{value}`")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
    },
    /// An empty transport list, or one naming `auto`.
    #[error("transport list `{0}` must name one or more of tcp, rc, rc+oob, ud, mcast, mem")]
    BadList(String),
}

impl Endpoint {
    /// Parse a URI. A string without `://` is `auto://` plus that string.
    pub fn parse(s: &str) -> Result<Endpoint, UriError> {
        let (scheme, rest) = match s.split_once("://") {
            Some((sch, rest)) => (sch.parse::<Scheme>()?, rest),
            None => (Scheme::Auto, s),
        };
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.trim_end_matches('/');
        let (host, port) = if scheme == Scheme::Mem {
            (authority.to_owned(), None)
        } else {
            let (host, port) =
                split_host_port(authority).ok_or_else(|| UriError::MissingPort(s.to_owned()))?;
            let port = port.parse::<u16>().map_err(|_| UriError::BadPort(s.to_owned()))?;
            (host.to_owned(), Some(port))
        };
        if host.is_empty() {
            return Err(UriError::MissingHost(s.to_owned()));
        }
        let mut params: Vec<(String, String)> = Vec::new();
        for kv in query.into_iter().flat_map(|q| q.split('&')).filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| UriError::BadParam(kv.to_owned()))?;
            if !scheme.params().contains(&k) {
                return Err(UriError::UnknownParam {
                    scheme,
                    key: k.to_owned(),
                    allowed: scheme.params().join(", "),
                });
            }
            if params.iter().any(|(pk, _)| pk == k) {
                return Err(UriError::BadParam(kv.to_owned()));
            }
            params.push((k.to_owned(), v.to_owned()));
        }
        Ok(Endpoint { scheme, host, port, params })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host (or the `mem://` name).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port; `None` only for `mem://`.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// `host:port`, with IPv6 hosts bracketed, ready for address resolution.
    pub fn authority(&self) -> String {
        match self.port {
            Some(p) if self.host.contains(':') => format!("[{}]:{p}", self.host),
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }

    /// A query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A query parameter parsed as `T`.
    pub fn param_as<T: FromStr>(&self, key: &str) -> Result<Option<T>, UriError> {
        self.param(key)
            .map(|v| {
                v.parse::<T>().map_err(|_| UriError::BadValue { key: key.to_owned(), value: v.to_owned() })
            })
            .transpose()
    }

    /// A query parameter that is a size in bytes: digits with an optional
    /// `K`, `M` or `G` (powers of 1024; `KiB`, `MB` and the like read the
    /// same), as in `?max_payload=128M`.
    pub fn param_size(&self, key: &str) -> Result<Option<u64>, UriError> {
        let Some(v) = self.param(key) else { return Ok(None) };
        let bad = || UriError::BadValue { key: key.to_owned(), value: v.to_owned() };
        let upper = v.trim().to_ascii_uppercase();
        let unit = upper.trim_end_matches("IB").trim_end_matches('B');
        let (digits, shift) = match unit.as_bytes().last() {
            Some(b'K') => (&unit[..unit.len() - 1], 10),
            Some(b'M') => (&unit[..unit.len() - 1], 20),
            Some(b'G') => (&unit[..unit.len() - 1], 30),
            _ => (unit, 0),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        n.checked_mul(1 << shift).map(Some).ok_or_else(bad)
    }

    /// The same endpoint over another transport (used to resolve `auto://`).
    pub fn with_scheme(&self, scheme: Scheme) -> Endpoint {
        Endpoint { scheme, ..self.clone() }
    }

    /// The same endpoint at another host (or `mem://` name), for example
    /// the name a `mem://` listener chose.
    pub fn with_host(&self, host: &str) -> Endpoint {
        Endpoint { host: host.to_owned(), ..self.clone() }
    }

    /// The same endpoint on another port (for example the port a listener bound).
    pub fn with_port(&self, port: u16) -> Endpoint {
        Endpoint { port: Some(port), ..self.clone() }
    }
}

fn split_host_port(a: &str) -> Option<(&str, &str)> {
    if let Some(rest) = a.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        Some((host, after.strip_prefix(':')?))
    } else {
        a.rsplit_once(':')
    }
}

impl FromStr for Endpoint {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, UriError> {
        Endpoint::parse(s)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority())?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

/// An ordered list of transports to try, as in `ZEROCAST_TRANSPORTS=rc,tcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportList(Vec<Scheme>);

impl TransportList {
    /// The name of the environment variable the facade reads the list from.
    pub const ENV: &'static str = "ZEROCAST_TRANSPORTS";

    /// Parse a comma-separated list such as `rc,tcp`.
    pub fn parse(s: &str) -> Result<TransportList, UriError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let sch: Scheme = part.parse()?;
            if sch == Scheme::Auto {
                return Err(UriError::BadList(s.to_owned()));
            }
            if !out.contains(&sch) {
                out.push(sch);
            }
        }
        if out.is_empty() {
            return Err(UriError::BadList(s.to_owned()));
        }
        Ok(TransportList(out))
    }

    /// The schemes in order of preference.
    pub fn schemes(&self) -> &[Scheme] {
        &self.0
    }
}

impl FromStr for TransportList {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, UriError> {
        TransportList::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        let e = Endpoint::parse("tcp://127.0.0.1:7000").unwrap();
        assert_eq!((e.scheme(), e.host(), e.port()), (Scheme::Tcp, "127.0.0.1", Some(7000)));
        assert_eq!(Endpoint::parse("rc://node1:18515").unwrap().scheme(), Scheme::Rc);
        assert_eq!(Endpoint::parse("rc+oob://node1:1").unwrap().scheme(), Scheme::RcOob);
        assert_eq!(Endpoint::parse("ud://h:1").unwrap().scheme(), Scheme::Ud);
        let m = Endpoint::parse("mcast://239.1.2.3:5000?iface=127.0.0.1").unwrap();
        assert_eq!(m.param("iface"), Some("127.0.0.1"));
        assert_eq!(m.to_string(), "mcast://239.1.2.3:5000?iface=127.0.0.1");
        let mem = Endpoint::parse("mem://pipeline-a").unwrap();
        assert_eq!((mem.host(), mem.port()), ("pipeline-a", None));
        let auto = Endpoint::parse("example.org:80").unwrap();
        assert_eq!(auto.scheme(), Scheme::Auto);
        assert_eq!(auto.with_scheme(Scheme::Tcp).to_string(), "tcp://example.org:80");
        let v6 = Endpoint::parse("tcp://[::1]:9").unwrap();
        assert_eq!((v6.host(), v6.authority()), ("::1", "[::1]:9".to_owned()));
    }

    #[test]
    fn rejects_bad_uris() {
        assert!(matches!(Endpoint::parse("quic://a:1"), Err(UriError::UnknownScheme(_))));
        assert!(matches!(Endpoint::parse("tcp://a"), Err(UriError::MissingPort(_))));
        assert!(matches!(Endpoint::parse("tcp://a:99999"), Err(UriError::BadPort(_))));
        assert!(matches!(Endpoint::parse("tcp://:80"), Err(UriError::MissingHost(_))));
        assert!(matches!(Endpoint::parse("mem://"), Err(UriError::MissingHost(_))));
        assert!(matches!(Endpoint::parse("tcp://a:1?iface=x"), Err(UriError::UnknownParam { .. })));
        assert!(matches!(Endpoint::parse("tcp://a:1?max_sources=8"), Err(UriError::UnknownParam { .. })));
        let d = Endpoint::parse("ud://a:1?max_sources=8").unwrap();
        assert_eq!(d.param_as::<usize>("max_sources").unwrap(), Some(8));
        assert!(Endpoint::parse("mcast://239.1.2.3:1?max_sources=8").is_ok());
        assert!(matches!(Endpoint::parse("tcp://a:1?window"), Err(UriError::BadParam(_))));
        let e = Endpoint::parse("tcp://a:1?window=x").unwrap();
        assert!(matches!(e.param_as::<u32>("window"), Err(UriError::BadValue { .. })));
    }

    #[test]
    fn transport_lists() {
        let l = TransportList::parse("rc, tcp,rc").unwrap();
        assert_eq!(l.schemes(), &[Scheme::Rc, Scheme::Tcp]);
        assert!(TransportList::parse("").is_err());
        assert!(TransportList::parse("auto").is_err());
        assert!(TransportList::parse("rc,bogus").is_err());
    }
}
