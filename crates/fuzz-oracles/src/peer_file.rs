//! The peer file (`crproxy_proxy::sources::parse_peer_file`): a JSON array or YAML
//! sequence of `host:port` strings that whoever manages the peers writes, read
//! again on every change. Whatever the file holds, reading it never panics, and:
//! - a list it accepts holds only `host:port` entries, trimmed, each a valid HTTP
//!   authority and header value with a port from 1 to 65535; a bracketed host is
//!   an IPv6 address, and a host of numbers alone a four-part IPv4 address (never
//!   a shorthand a resolver would read as another one); sorted, without
//!   duplicates, so two files with the same peers compare equal;
//! - the list written back out as JSON reads back as the same list;
//! - a refusal is one line, for the log line that reports it.

use std::path::Path;

use crproxy_proxy::sources::parse_peer_file;

/// Checks one input against the properties above; a panic is a finding.
pub fn check(data: &[u8]) {
    let path = Path::new("/etc/crproxy/peers.yaml");
    let list = match parse_peer_file(path, data) {
        Ok(list) => list,
        Err(err) => {
            let message = err.to_string();
            assert!(
                !message.contains(['\n', '\r']),
                "{message:?}, from {data:?}"
            );
            return;
        }
    };
    for entry in &list {
        assert_eq!(entry.trim(), entry, "from {data:?}");
        let authority: http::uri::Authority = entry
            .parse()
            .unwrap_or_else(|e| panic!("{entry:?} is no authority ({e}), from {data:?}"));
        let port = authority.port_u16();
        assert!(port.is_some_and(|p| p != 0), "{entry:?}, from {data:?}");
        assert!(
            http::HeaderValue::from_str(entry).is_ok(),
            "{entry:?} is no header value, from {data:?}"
        );
        let host = authority.host();
        if let Some(bracketed) = host.strip_prefix('[') {
            let ipv6 = bracketed.strip_suffix(']').unwrap_or(bracketed);
            assert!(
                ipv6.parse::<std::net::Ipv6Addr>().is_ok(),
                "{entry:?}, from {data:?}"
            );
        } else if host.split('.').all(inet_aton_number) {
            // Numbers alone: taken only as a plain IPv4 address.
            assert!(
                host.parse::<std::net::Ipv4Addr>().is_ok(),
                "{entry:?} could be read as another address, from {data:?}"
            );
        }
    }
    assert!(
        list.windows(2).all(|pair| pair[0] < pair[1]),
        "{list:?} is not sorted and unique, from {data:?}"
    );
    let written = serde_json::to_vec(&list).expect("a list of strings is JSON");
    let again = parse_peer_file(path, &written)
        .unwrap_or_else(|e| panic!("{list:?} written out is refused: {e}"));
    assert_eq!(again, list, "from {data:?}");
}

/// A part `inet_aton` reads as a number: decimal digits (octal after a leading
/// zero), or hex digits after `0x` or `0X`.
fn inet_aton_number(part: &str) -> bool {
    let hex = part.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("0x"));
    if hex {
        part[2..].bytes().all(|b| b.is_ascii_hexdigit())
    } else {
        part.bytes().all(|b| b.is_ascii_digit())
    }
}
