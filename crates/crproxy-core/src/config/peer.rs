//! What a peer address may be, wherever peers come from (the configuration's
//! static list and DNS name, the peer file): a DNS name, an IPv4 address or an
//! IPv6 address in brackets, and for a `host:port` a port from 1 to 65535 in
//! digits. Anything else would only fail later, at every dial, as a peer that
//! cannot be reached; refused when read, it is named.
//!
//! A host whose every label is a number (decimal, or hex after `0x`) is an IPv4
//! address or nothing: the resolver would read `10.1`, `0x7f.1` or `010.0.0.1`
//! as an address the writer never meant (C's `inet_aton` forms), so only the
//! four-part decimal form is taken.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Whether `entry` is `host:port` as described above.
pub fn is_host_port(entry: &str) -> bool {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return false;
    };
    let port_valid =
        port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|port| port != 0);
    let host_valid = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(ipv6) => ipv6.parse::<Ipv6Addr>().is_ok(),
        None => is_host(host),
    };
    port_valid && host_valid
}

/// Whether `host` is a DNS name or an IPv4 address, as described above.
pub fn is_host(host: &str) -> bool {
    if host.split('.').all(is_numeric_label) {
        return host.parse::<Ipv4Addr>().is_ok();
    }
    host.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// Whether a host label is a number as `inet_aton` reads one: decimal (octal with
/// a leading zero) or hex after `0x`. An empty label counts, so an empty host or
/// one of dots is refused as no address.
fn is_numeric_label(label: &str) -> bool {
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => label.bytes().all(|b| b.is_ascii_digit()),
    }
}
