//! Where a peer apiserver is reached, and whether we may go there.
//!
//! Two sources, in this order of precedence:
//!
//! 1. the operator's mapping (`--peer-address lease/<lease-name>=ip:port` or
//!    `--peer-address host/<hostname>=ip:port`, a lease-name entry beating a hostname entry).
//!    It is the operator's explicit word, so it wins over whatever the lease says and it is not
//!    filtered by the CIDRs (it was validated when the flag was parsed). A `host/` entry is for
//!    the lease kube-apiserver names after that host, not for any lease whose hostname label
//!    claims it;
//! 2. the lease's `kubernetes.io/peer-advertise-address` annotation (`ip:port`, IPv6 in
//!    brackets). Anyone who can write Leases in `kube-system` can write it, so it is accepted
//!    only when it is a unicast IP literal with a port inside one of the operator-configured
//!    CIDRs. With no CIDR configured every annotation is refused. With `--peer-port` only its
//!    address is taken, with that port: kube-apiserver 1.36 and 1.37 advertise
//!    `--advertise-address` with their own `--secure-port` whatever `--peer-advertise-ip` and
//!    `--peer-advertise-port` say (those reach only upstream's own proxy), and under skewgate
//!    that port is Envoy's client port, not its peer port.
//!
//! IPv4-mapped IPv6 addresses (`[::ffff:10.0.0.1]:6444`) are taken as the IPv4 address they
//! carry, both for the CIDR check and for connecting, so a mapped spelling neither slips past
//! an IPv4 allow-list nor is refused by one.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;

use super::lease_name::identity_lease_name;

/// The lease annotation that carries an apiserver's peer address.
pub const PEER_ADVERTISE_ADDRESS_ANNOTATION: &str = "kubernetes.io/peer-advertise-address";

/// Longest annotation value we look at; anything longer is refused without parsing.
const MAX_ANNOTATION_LEN: usize = 64;

/// Why an address was not accepted. `label()` is the `reason` label of
/// `skewgate_peer_address_rejected_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    /// The lease has neither an annotation nor a mapping entry: it cannot be routed to.
    Missing,
    /// The annotation is present but empty.
    Empty,
    /// Not `ip:port` / `[ipv6]:port`: no port, port 0 or above 65535, unbracketed IPv6, zone
    /// ids, whitespace, too long.
    Invalid,
    /// A host name instead of an IP literal (we never resolve names from a lease).
    Hostname,
    /// Unspecified, multicast or broadcast address.
    NotUnicast,
    /// A valid address outside every configured CIDR.
    OutsideCidrs,
    /// No CIDR is configured, so no annotation is accepted.
    NoCidrs,
}

impl RejectReason {
    pub const ALL: [RejectReason; 7] = [
        RejectReason::Missing,
        RejectReason::Empty,
        RejectReason::Invalid,
        RejectReason::Hostname,
        RejectReason::NotUnicast,
        RejectReason::OutsideCidrs,
        RejectReason::NoCidrs,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RejectReason::Missing => "missing",
            RejectReason::Empty => "empty",
            RejectReason::Invalid => "invalid",
            RejectReason::Hostname => "hostname",
            RejectReason::NotUnicast => "not_unicast",
            RejectReason::OutsideCidrs => "outside_cidrs",
            RejectReason::NoCidrs => "no_cidrs",
        }
    }

    /// Position in [`RejectReason::ALL`] (for the metrics array).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Where an accepted address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressSource {
    /// `--peer-address lease/<name>=...`
    MappingByLease,
    /// `--peer-address host/<hostname>=...`
    MappingByHostname,
    /// The lease's `kubernetes.io/peer-advertise-address` annotation.
    Annotation,
}

impl AddressSource {
    /// The operator vouches for this address (`--peer-address`).
    pub fn is_mapping(self) -> bool {
        matches!(
            self,
            AddressSource::MappingByLease | AddressSource::MappingByHostname
        )
    }
}

/// IPv4-mapped IPv6 becomes the IPv4 address it carries.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

fn is_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

/// Parse an `ip:port` / `[ipv6]:port` literal, refusing host names, missing or zero ports and
/// non-unicast addresses. Shared by the annotation and the operator's mapping.
pub fn parse_socket_address(value: &str) -> Result<SocketAddr, RejectReason> {
    if value.is_empty() {
        return Err(RejectReason::Empty);
    }
    if value.len() > MAX_ANNOTATION_LEN {
        return Err(RejectReason::Invalid);
    }
    match SocketAddr::from_str(value) {
        Ok(addr) if addr.port() == 0 => Err(RejectReason::Invalid),
        Ok(addr) => {
            let addr = canonical(addr);
            if is_unicast(addr.ip()) {
                Ok(addr)
            } else {
                Err(RejectReason::NotUnicast)
            }
        }
        Err(_) => {
            // A name (evil.com:443, apiserver-b:6443, evil.com) rather than a broken literal?
            let host = match value.rsplit_once(':') {
                Some((h, _)) => h,
                None => value,
            };
            let looks_like_name = !host.is_empty()
                && !host.starts_with('[')
                && host.chars().any(|c| c.is_ascii_alphabetic())
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
                && IpAddr::from_str(host).is_err();
            if looks_like_name {
                Err(RejectReason::Hostname)
            } else {
                Err(RejectReason::Invalid)
            }
        }
    }
}

/// A CIDR from the command line: `10.0.0.0/8`, `fd00::/8`, or a bare address (`/32`, `/128`).
/// Host bits are cleared.
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    let net = match IpNet::from_str(s) {
        Ok(n) => n,
        Err(_) => match IpAddr::from_str(s) {
            Ok(ip) => IpNet::from(ip),
            Err(_) => return Err(format!("{s:?} is not a CIDR (10.0.0.0/8, fd00::/8)")),
        },
    };
    Ok(net.trunc())
}

/// One `--peer-address` entry: `lease/<lease-name>=ip:port` or `host/<hostname>=ip:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MappingEntry {
    ByLease(String, SocketAddr),
    ByHostname(String, SocketAddr),
}

impl FromStr for MappingEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage =
            || format!("{s:?}: expected lease/<lease-name>=<ip:port> or host/<hostname>=<ip:port>");
        let (key, addr) = s.split_once('=').ok_or_else(usage)?;
        let addr = parse_socket_address(addr.trim())
            .map_err(|r| format!("{s:?}: the address is not usable ({r})"))?;
        match key.trim().split_once('/') {
            Some(("lease", name)) if !name.is_empty() => {
                Ok(MappingEntry::ByLease(name.to_string(), addr))
            }
            Some(("host", name)) if !name.is_empty() => {
                Ok(MappingEntry::ByHostname(name.to_string(), addr))
            }
            _ => Err(usage()),
        }
    }
}

/// What the operator allows: the CIDRs for annotations, the port of every peer's Envoy peer
/// listener, and the explicit mapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    pub allowed_cidrs: Vec<IpNet>,
    /// `--peer-port`: an accepted annotation's address is reached at this port.
    pub peer_port: Option<u16>,
    pub by_lease: BTreeMap<String, SocketAddr>,
    pub by_hostname: BTreeMap<String, SocketAddr>,
}

impl AddressPolicy {
    pub fn new(cidrs: Vec<IpNet>, mapping: impl IntoIterator<Item = MappingEntry>) -> Self {
        let mut policy = AddressPolicy {
            allowed_cidrs: cidrs,
            ..Default::default()
        };
        for entry in mapping {
            match entry {
                MappingEntry::ByLease(n, a) => policy.by_lease.insert(n, a),
                MappingEntry::ByHostname(n, a) => policy.by_hostname.insert(n, a),
            };
        }
        policy
    }

    /// The same, with `--peer-port`.
    pub fn with_peer_port(self, peer_port: Option<u16>) -> Self {
        AddressPolicy { peer_port, ..self }
    }

    /// Check an annotation value against the policy: the address it accepts, at `--peer-port`
    /// when given.
    pub fn check_annotation(&self, value: &str) -> Result<SocketAddr, RejectReason> {
        let mut addr = parse_socket_address(value)?;
        if self.allowed_cidrs.is_empty() {
            return Err(RejectReason::NoCidrs);
        }
        if !self.allowed_cidrs.iter().any(|n| n.contains(&addr.ip())) {
            return Err(RejectReason::OutsideCidrs);
        }
        if let Some(port) = self.peer_port {
            addr.set_port(port);
        }
        Ok(addr)
    }

    /// The address of one lease: mapping by lease name, then by hostname, then the annotation.
    ///
    /// A hostname mapping is for the lease kube-apiserver names after that host
    /// ([`identity_lease_name`]) and no other: the hostname label is whatever the Lease writer
    /// put there, and a mapped address ranks first for `--max-peers`, so leases claiming a
    /// mapped host under other names could push known peers out. They fall back to their
    /// annotation, as any lease.
    pub fn resolve(
        &self,
        lease_name: &str,
        hostname: Option<&str>,
        annotation: Option<&str>,
    ) -> Result<(SocketAddr, AddressSource), RejectReason> {
        if let Some(a) = self.by_lease.get(lease_name) {
            return Ok((*a, AddressSource::MappingByLease));
        }
        let mapped = hostname.and_then(|h| {
            self.by_hostname
                .get(h)
                .filter(|_| identity_lease_name(h) == lease_name)
        });
        if let Some(a) = mapped {
            return Ok((*a, AddressSource::MappingByHostname));
        }
        match annotation {
            None => Err(RejectReason::Missing),
            Some(v) => self
                .check_annotation(v)
                .map(|a| (a, AddressSource::Annotation)),
        }
    }
}

/// A value fit for one log line: at most 64 characters, debug-escaped by the caller.
pub fn loggable(value: &str) -> String {
    value.chars().take(MAX_ANNOTATION_LEN).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn policy(cidrs: &[&str]) -> AddressPolicy {
        AddressPolicy::new(cidrs.iter().map(|c| parse_cidr(c).unwrap()).collect(), [])
    }

    #[test]
    fn socket_address_table() {
        use RejectReason::*;
        let cases: &[(&str, Result<&str, RejectReason>)] = &[
            ("10.0.0.1:6443", Ok("10.0.0.1:6443")),
            ("[fd00::1]:6444", Ok("[fd00::1]:6444")),
            ("[::1]:443", Ok("[::1]:443")),
            ("[::ffff:10.0.0.1]:6444", Ok("10.0.0.1:6444")),
            ("", Err(Empty)),
            ("evil.com:443", Err(Hostname)),
            ("evil.com", Err(Hostname)),
            ("apiserver-b:6443", Err(Hostname)),
            ("localhost:6443", Err(Hostname)),
            ("10.0.0.1:99999", Err(Invalid)),
            ("10.0.0.1:0", Err(Invalid)),
            ("10.0.0.1", Err(Invalid)),
            ("10.0.0.1:", Err(Invalid)),
            ("[::1]", Err(Invalid)),
            ("::1:443", Err(Invalid)),
            ("fd00::1:443", Err(Invalid)),
            ("[fe80::1%eth0]:443", Err(Invalid)),
            (" 10.0.0.1:6443", Err(Invalid)),
            ("10.0.0.1:6443 ", Err(Invalid)),
            ("010.0.0.1:6443", Err(Invalid)),
            ("10.0.0.1:6443,10.0.0.2:6443", Err(Invalid)),
            ("http://10.0.0.1:6443", Err(Invalid)),
            ("0.0.0.0:6443", Err(NotUnicast)),
            ("[::]:6443", Err(NotUnicast)),
            ("224.0.0.1:6443", Err(NotUnicast)),
            ("255.255.255.255:6443", Err(NotUnicast)),
            ("[ff02::1]:6443", Err(NotUnicast)),
        ];
        for (input, want) in cases {
            let got = parse_socket_address(input);
            assert_eq!(got, want.map(sa), "{input:?}");
        }
        let long = format!("10.0.0.1:6443{}", " ".repeat(100));
        assert_eq!(parse_socket_address(&long), Err(Invalid));
    }

    #[test]
    fn cidr_filter_ipv4_and_ipv6() {
        use RejectReason::*;
        let p = policy(&["10.0.0.0/24", "fd00:1::/64", "192.168.1.7"]);
        let cases: &[(&str, Result<&str, RejectReason>)] = &[
            ("10.0.0.12:6444", Ok("10.0.0.12:6444")),
            ("10.0.1.12:6444", Err(OutsideCidrs)),
            ("[fd00:1::12]:6444", Ok("[fd00:1::12]:6444")),
            ("[fd00:2::12]:6444", Err(OutsideCidrs)),
            ("192.168.1.7:6443", Ok("192.168.1.7:6443")),
            ("192.168.1.8:6443", Err(OutsideCidrs)),
            // The mapped spelling is the IPv4 address for the allow-list.
            ("[::ffff:10.0.0.12]:6444", Ok("10.0.0.12:6444")),
            ("[::ffff:10.9.0.12]:6444", Err(OutsideCidrs)),
            ("127.0.0.1:6443", Err(OutsideCidrs)),
            ("[::1]:6443", Err(OutsideCidrs)),
            ("evil.com:443", Err(Hostname)),
        ];
        for (input, want) in cases {
            assert_eq!(p.check_annotation(input), want.map(sa), "{input:?}");
        }
        // No CIDR configured: every annotation is refused, even a perfect one.
        let none = policy(&[]);
        assert_eq!(none.check_annotation("10.0.0.12:6444"), Err(NoCidrs));
        // Malformed is reported as malformed first.
        assert_eq!(none.check_annotation("10.0.0.1:99999"), Err(Invalid));
        // 0.0.0.0/0 still refuses the unspecified address.
        let all = policy(&["0.0.0.0/0", "::/0"]);
        assert_eq!(all.check_annotation("0.0.0.0:6443"), Err(NotUnicast));
        assert!(all.check_annotation("203.0.113.9:6443").is_ok());
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            parse_cidr("10.0.0.7/8").unwrap(),
            "10.0.0.0/8".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            parse_cidr("fd00::1").unwrap(),
            "fd00::1/128".parse::<IpNet>().unwrap()
        );
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("example.com/8").is_err());
    }

    #[test]
    fn mapping_entries() {
        assert_eq!(
            "lease/apiserver-abc=10.0.0.5:6444".parse(),
            Ok(MappingEntry::ByLease(
                "apiserver-abc".into(),
                sa("10.0.0.5:6444")
            ))
        );
        assert_eq!(
            "host/cp-2=[fd00::5]:6444".parse(),
            Ok(MappingEntry::ByHostname(
                "cp-2".into(),
                sa("[fd00::5]:6444")
            ))
        );
        for bad in [
            "apiserver-abc=10.0.0.5:6444",
            "lease/=10.0.0.5:6444",
            "node/x=10.0.0.5:6444",
            "lease/x=evil.com:443",
            "lease/x=10.0.0.5",
            "lease/x",
        ] {
            assert!(bad.parse::<MappingEntry>().is_err(), "{bad}");
        }
    }

    /// kube-apiserver 1.36 and 1.37 advertise `--advertise-address:--secure-port`, Envoy's
    /// client port under skewgate: with `--peer-port` the annotation gives the address and the
    /// operator the port. The annotation is still checked whole first, and a mapping keeps its
    /// own port.
    #[test]
    fn the_peer_port_replaces_the_annotations_port() {
        use AddressSource::*;
        let p = AddressPolicy::new(
            vec![parse_cidr("10.0.0.0/8").unwrap()],
            [MappingEntry::ByLease(
                "apiserver-m".into(),
                sa("10.9.0.1:7000"),
            )],
        )
        .with_peer_port(Some(6444));
        assert_eq!(
            p.resolve("apiserver-a", None, Some("10.0.0.12:6443")),
            Ok((sa("10.0.0.12:6444"), Annotation))
        );
        assert_eq!(
            p.resolve("apiserver-m", None, Some("10.0.0.13:6443")),
            Ok((sa("10.9.0.1:7000"), MappingByLease))
        );
        for (bad, why) in [
            ("192.0.2.1:6443", RejectReason::OutsideCidrs),
            ("10.0.0.12", RejectReason::Invalid),
            ("10.0.0.12:0", RejectReason::Invalid),
            ("evil.com:6443", RejectReason::Hostname),
        ] {
            assert_eq!(p.resolve("apiserver-a", None, Some(bad)), Err(why), "{bad}");
        }
        // Without it the annotation is taken as it is.
        assert_eq!(
            p.with_peer_port(None)
                .resolve("apiserver-a", None, Some("10.0.0.12:6443")),
            Ok((sa("10.0.0.12:6443"), Annotation))
        );
    }

    #[test]
    fn mapping_precedence() {
        use AddressSource::*;
        let p = AddressPolicy::new(
            vec![parse_cidr("10.0.0.0/8").unwrap()],
            [
                MappingEntry::ByLease("apiserver-a".into(), sa("10.1.0.1:1")),
                MappingEntry::ByHostname("cp-a".into(), sa("10.2.0.1:2")),
                MappingEntry::ByHostname("cp-b".into(), sa("192.0.2.1:3")),
            ],
        );
        let ann = Some("10.3.0.1:3");
        // Lease-name mapping beats hostname mapping beats annotation.
        assert_eq!(
            p.resolve("apiserver-a", Some("cp-a"), ann),
            Ok((sa("10.1.0.1:1"), MappingByLease))
        );
        let cp_a = identity_lease_name("cp-a");
        assert_eq!(
            p.resolve(&cp_a, Some("cp-a"), ann),
            Ok((sa("10.2.0.1:2"), MappingByHostname))
        );
        assert_eq!(
            p.resolve("apiserver-x", Some("cp-z"), ann),
            Ok((sa("10.3.0.1:3"), Annotation))
        );
        // Another lease claiming a mapped host is not that host's apiserver: its annotation
        // decides, as for any lease.
        assert_eq!(
            p.resolve("apiserver-x", Some("cp-a"), ann),
            Ok((sa("10.3.0.1:3"), Annotation))
        );
        assert_eq!(
            p.resolve(&identity_lease_name("cp-b"), Some("cp-a"), None),
            Err(RejectReason::Missing)
        );
        // The mapping is the operator's word: not filtered by the CIDRs, and it replaces a
        // hostile annotation.
        assert_eq!(
            p.resolve(
                &identity_lease_name("cp-b"),
                Some("cp-b"),
                Some("evil.com:443")
            ),
            Ok((sa("192.0.2.1:3"), MappingByHostname))
        );
        assert_eq!(
            p.resolve("apiserver-x", None, None),
            Err(RejectReason::Missing)
        );
        assert_eq!(
            p.resolve("apiserver-x", None, Some("")),
            Err(RejectReason::Empty)
        );
    }

    #[test]
    fn reason_labels_are_indexed() {
        for (i, r) in RejectReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(RejectReason::OutsideCidrs.to_string(), "outside_cidrs");
    }
}
