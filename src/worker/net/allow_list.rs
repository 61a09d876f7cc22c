//! `--allow-net`, parsed once: which hosts user code may reach, and which addresses (issue 47's
//! rules against server-side request forgery).
//!
//! An entry is a name (`api.example.org`), a wildcard for its subdomains (`*.example.org`, which
//! does not match `example.org` itself), an address (`10.0.0.5`, `::1`) or a range of them in
//! CIDR form (`10.0.0.0/8`, `fd00::/8`); a name, a wildcard or an address may end in `:port`
//! (an IPv6 address then in brackets, `[::1]:8080`), and without one allows every port.
//!
//! A URL passes when an entry matches its host and port. The addresses a name resolves to are
//! checked again at connect time ([`AllowList::admits_address`]): an address of a special class
//! (loopback, private, shared, link-local, unique-local, multicast, unspecified, broadcast) is
//! used only when an entry names that address or a range holding it, so that a listed name
//! that resolves to `127.0.0.1` or `169.254.169.254` (DNS rebinding, a cloud's metadata
//! service) reaches nothing.

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use thiserror::Error;

/// One `--allow-net` entry that is not one of the forms the module's documentation names.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("--allow-net entry {entry:?} is not a host, *.domain, address or CIDR range, with an optional :port")]
pub struct BadEntry {
    /// The entry as given.
    pub entry: String,
}

/// What an entry's host part matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// One name, lower case.
    Name(String),
    /// Every name ending in `.suffix` (the suffix lower case, without its leading dot).
    Subdomains(String),
    /// One address, or a range of them.
    Addresses(IpNet),
}

/// One `--allow-net` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// As the operator wrote it (trimmed): the egress metrics' `allowed` label.
    text: String,
    pattern: Pattern,
    /// `None`: every port.
    port: Option<u16>,
}

/// Whether an address is of a class.
type IsOfClass = fn(IpAddr) -> bool;

/// The special classes of address, each with the words a refusal gives it.
const CLASSES: [(IsOfClass, &str); 8] = [
    (|ip| ip.is_loopback(), "a loopback address"),
    (is_private, "a private address"),
    (is_shared, "a shared (carrier-grade NAT) address"),
    (
        is_link_local,
        "a link-local address (a cloud's metadata service is one)",
    ),
    (is_unique_local, "a unique-local address"),
    (|ip| ip.is_multicast(), "a multicast address"),
    (
        |ip| ip.is_unspecified() || is_this_network(ip),
        "an unspecified address",
    ),
    (is_broadcast, "the broadcast address"),
];

/// `--allow-net`, parsed (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// The entries of `--allow-net` (each trimmed, empty ones left out).
    ///
    /// Errors: the first entry that is not one of the forms above ([`BadEntry`]).
    pub fn parse(entries: &[String]) -> Result<AllowList, BadEntry> {
        let entries = entries
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
            .map(|e| {
                entry(e).ok_or_else(|| BadEntry {
                    entry: e.to_owned(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(AllowList { entries })
    }

    /// Whether a URL with `host` and `port` may be asked for (the tests' shorthand for
    /// [`entry_for`](Self::entry_for)).
    #[cfg(test)]
    pub fn admits(&self, host: &str, port: u16) -> bool {
        self.entry_for(host, port).is_some()
    }

    /// The first entry, as the operator wrote it, that admits a URL with `host` (a name, or an
    /// address in brackets or not) and `port`.
    pub fn entry_for(&self, host: &str, port: u16) -> Option<&str> {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        let address = host.parse::<IpAddr>().ok();
        let found = self.entries.iter().find(|entry| {
            entry.port.is_none_or(|p| p == port)
                && match (&entry.pattern, address) {
                    (Pattern::Addresses(net), Some(ip)) => net.contains(&canonical(ip)),
                    (Pattern::Name(name), None) => *name == host,
                    (Pattern::Subdomains(suffix), None) => host
                        .strip_suffix(suffix.as_str())
                        .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
                    _ => false,
                }
        });
        found.map(|entry| entry.text.as_str())
    }

    /// The first of this list's entries, as written, that no single entry of `outer` holds
    /// whole; `None` when every one is within `outer` (so this list admits nothing `outer`
    /// does not). An entry is held by one of the same host pattern or a wider one (a name by
    /// `*.` its parent domain or an ancestor's, a wildcard by a wildcard of its own or a parent
    /// domain, an address or range by a range holding it), with that entry's port or every
    /// port. Used where a list may only narrow another: a `--secret`'s hosts and a sandbox's
    /// `allow_net` (issue 47).
    pub fn outside<'a>(&'a self, outer: &AllowList) -> Option<&'a str> {
        self.entries
            .iter()
            .find(|inner| !outer.entries.iter().any(|o| holds(o, inner)))
            .map(|inner| inner.text.as_str())
    }

    /// Whether the list names nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as the operator wrote them, in order.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.text.as_str())
    }

    /// The first entry, as the operator wrote it, that admits `url`'s host and port (the
    /// scheme's default when it names none): [`entry_for`](Self::entry_for) of a URL.
    pub fn entry_for_url(&self, url: &reqwest::Url) -> Option<&str> {
        // `http` and `https` always have a default port; were there none, port 0 matches no
        // `host:port` anyone would allow.
        let port = url.port_or_known_default().unwrap_or(0);
        self.entry_for(url.host_str()?, port)
    }

    /// Whether `ip`, an address a name resolved to, may be connected to on `port` (`None`: on
    /// any port an entry names; the resolver does not know the port, which the URL's check
    /// already did): any public address; one of a special class only when an entry names it,
    /// or a range holding it, literally. `Err` gives the class's words.
    pub fn admits_address(&self, ip: IpAddr, port: Option<u16>) -> Result<(), &'static str> {
        let ip = canonical(ip);
        let Some(class) = CLASSES.iter().find(|(is, _)| is(ip)).map(|(_, w)| *w) else {
            return Ok(());
        };
        let named = self.entries.iter().any(|entry| {
            (entry.port.is_none() || port.is_none() || entry.port == port)
                && matches!(&entry.pattern, Pattern::Addresses(net) if net.contains(&ip))
        });
        if named {
            Ok(())
        } else {
            Err(class)
        }
    }
}

/// Whether `outer` admits everything `inner` admits (see [`AllowList::outside`]).
fn holds(outer: &Entry, inner: &Entry) -> bool {
    let ports = outer.port.is_none() || outer.port == inner.port;
    let within_domain = |name: &str, suffix: &str| {
        name.strip_suffix(suffix)
            .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.'))
    };
    ports
        && match (&outer.pattern, &inner.pattern) {
            (Pattern::Name(o), Pattern::Name(i)) => o == i,
            (Pattern::Subdomains(o), Pattern::Name(i)) => within_domain(i, o),
            (Pattern::Subdomains(o), Pattern::Subdomains(i)) => o == i || within_domain(i, o),
            (Pattern::Addresses(o), Pattern::Addresses(i)) => o.contains(i),
            _ => false,
        }
}

/// One entry, or `None` when it is none of the forms.
fn entry(text: &str) -> Option<Entry> {
    let lower = text.to_ascii_lowercase();
    if lower.contains('/') {
        let net = lower.parse::<IpNet>().ok()?;
        return Some(Entry {
            text: text.to_owned(),
            pattern: Pattern::Addresses(net.trunc()),
            port: None,
        });
    }
    let (host, port) = split_port(&lower)?;
    let pattern = if let Ok(ip) = host.parse::<IpAddr>() {
        Pattern::Addresses(IpNet::from(canonical(ip)))
    } else if let Some(suffix) = host.strip_prefix("*.") {
        Pattern::Subdomains(valid_name(suffix)?.to_owned())
    } else {
        Pattern::Name(valid_name(host)?.to_owned())
    };
    Some(Entry {
        text: text.to_owned(),
        pattern,
        port,
    })
}

/// `host` and its port: `[v6]:port`, `[v6]`, a bare IPv6 address (no port), `host:port` or
/// `host`.
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(port.parse().ok()?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    if text.parse::<Ipv6Addr>().is_ok() {
        return Some((text, None));
    }
    match text.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((text, None)),
    }
}

/// `name` when it is a DNS name: labels of letters, digits, `-` and `_`, none empty.
fn valid_name(name: &str) -> Option<&str> {
    let ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    ok.then_some(name)
}

/// `ip`, with an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn is_private(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.is_private())
}

/// 100.64.0.0/10 (RFC 6598).
fn is_shared(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 100 && v4.octets()[1] & 0xc0 == 64)
}

/// 169.254.0.0/16, fe80::/10.
fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// fc00::/7 (RFC 4193).
fn is_unique_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xfe00 == 0xfc00)
}

/// 0.0.0.0/8 (RFC 1122: "this network").
fn is_this_network(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 0)
}

fn is_broadcast(ip: IpAddr) -> bool {
    ip == IpAddr::V4(Ipv4Addr::BROADCAST)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        AllowList::parse(&entries).expect("valid")
    }

    #[test]
    fn names_wildcards_addresses_and_ranges_with_or_without_a_port() {
        let allow = list(&[
            "api.example.org",
            "*.example.com:443",
            "10.1.2.3",
            "[::1]:8080",
            "192.168.0.0/16",
            "Host.Test:81",
        ]);
        assert!(allow.admits("api.example.org", 1));
        assert!(allow.admits("API.example.org", 443));
        assert!(!allow.admits("example.org", 443));
        assert!(allow.admits("a.example.com", 443) && allow.admits("b.a.example.com", 443));
        assert!(!allow.admits("a.example.com", 80));
        assert!(!allow.admits("example.com", 443) && !allow.admits("badexample.com", 443));
        assert!(allow.admits("10.1.2.3", 9) && !allow.admits("10.1.2.4", 9));
        assert!(allow.admits("[::1]", 8080) && !allow.admits("[::1]", 8081));
        assert!(allow.admits("192.168.7.7", 1));
        assert!(allow.admits("host.test", 81) && !allow.admits("host.test", 80));
        // A name is never an address, nor the other way round.
        assert!(!list(&["127.0.0.1"]).admits("localhost", 80));
        assert!(!list(&[]).admits("localhost", 80));
    }

    #[test]
    fn a_list_is_within_another_when_each_entry_is_held_by_one() {
        let outer = list(&[
            "api.example.org",
            "*.example.com",
            "10.0.0.0/8",
            "host.test:81",
        ]);
        for inside in [
            "api.example.org:443",
            "a.example.com",
            "*.b.example.com:8443",
            "*.example.com",
            "10.1.0.0/16",
            "10.2.3.4:80",
            "host.test:81",
        ] {
            assert_eq!(list(&[inside]).outside(&outer), None, "{inside}");
        }
        for outside in [
            "example.org",
            "example.com",
            "*.org",
            "11.0.0.1",
            "10.0.0.0/7",
            "host.test",
            "host.test:82",
        ] {
            assert_eq!(list(&[outside]).outside(&outer), Some(outside), "{outside}");
        }
        assert_eq!(list(&[]).outside(&list(&[])), None);
    }

    #[test]
    fn entries_that_are_none_of_the_forms_are_refused() {
        for bad in [
            "http://x",
            "a b",
            "x:port",
            "*.",
            "[::1",
            "10.0.0.0/40",
            "x:99999",
            "a..b",
        ] {
            let refused = AllowList::parse(&[bad.to_owned()]).expect_err(bad);
            assert_eq!(
                refused,
                BadEntry {
                    entry: bad.to_owned()
                }
            );
        }
    }

    #[test]
    fn special_addresses_pass_only_when_named_literally() {
        let by_name = list(&["localhost", "metadata.internal"]);
        for (ip, words) in [
            ("127.0.0.1", "a loopback address"),
            ("::1", "a loopback address"),
            ("::ffff:127.0.0.1", "a loopback address"),
            ("10.0.0.1", "a private address"),
            ("172.16.5.5", "a private address"),
            ("100.64.1.1", "a shared (carrier-grade NAT) address"),
            (
                "169.254.169.254",
                "a link-local address (a cloud's metadata service is one)",
            ),
            (
                "fe80::1",
                "a link-local address (a cloud's metadata service is one)",
            ),
            ("fd00::1", "a unique-local address"),
            ("224.0.0.1", "a multicast address"),
            ("0.0.0.0", "an unspecified address"),
            ("255.255.255.255", "the broadcast address"),
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert_eq!(by_name.admits_address(ip, Some(80)), Err(words), "{ip}");
        }
        assert_eq!(
            by_name.admits_address("93.184.216.34".parse().expect("ip"), Some(80)),
            Ok(())
        );
        let literal = list(&["127.0.0.1:8000", "10.0.0.0/8"]);
        assert_eq!(
            literal.admits_address("127.0.0.1".parse().expect("ip"), Some(8000)),
            Ok(())
        );
        assert!(literal
            .admits_address("127.0.0.1".parse().expect("ip"), Some(8001))
            .is_err());
        assert_eq!(
            literal.admits_address("10.9.9.9".parse().expect("ip"), None),
            Ok(())
        );
    }
}
