//! What the proxy puts on the wire, read as raw HTTP/2 frames from a real TLS
//! connection: properties no HTTP client shows, because its decoder hides them.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crproxy_core::config::AccessMode;

use crate::target_support::{caller_tls, harness, send, widget, OWNER_LABELS, WIDGETS};

const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// One HTTP/2 frame header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len())
        .expect("small frame")
        .to_be_bytes();
    let mut out = vec![length[1], length[2], length[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK header field as a literal without indexing, with a literal name and
/// no Huffman coding (every field here is shorter than 127 bytes).
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![0x00, u8::try_from(name.len()).expect("short name")];
    out.extend_from_slice(name.as_bytes());
    out.push(u8::try_from(value.len()).expect("short value"));
    out.extend_from_slice(value.as_bytes());
    out
}

/// An HPACK integer with an `prefix`-bit prefix starting at `block[*at]`.
fn integer(block: &[u8], at: &mut usize, prefix: u32) -> usize {
    let mask = (1usize << prefix) - 1;
    let mut value = usize::from(block[*at]) & mask;
    *at += 1;
    if value < mask {
        return value;
    }
    let mut shift = 0;
    loop {
        let byte = block[*at];
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return value;
        }
    }
}

/// Skips an HPACK string literal (its Huffman bit is in the length's prefix).
fn skip_string(block: &[u8], at: &mut usize) {
    let length = integer(block, at, 7);
    *at += length;
}

/// How many fields of a header block are literals never to be indexed.
fn never_indexed_fields(block: &[u8]) -> usize {
    let mut at = 0;
    let mut count = 0;
    while at < block.len() {
        let first = block[at];
        let (prefix, has_value) = match first {
            f if f & 0x80 != 0 => (7, false), // indexed field
            f if f & 0x40 != 0 => (6, true),  // literal, incremental indexing
            f if f & 0x20 != 0 => (5, false), // dynamic table size update
            f if f & 0x10 != 0 => (4, true),  // literal, never indexed
            _ => (4, true),                   // literal, without indexing
        };
        if first & 0xf0 == 0x10 {
            count += 1;
        }
        let name_index = integer(block, &mut at, prefix);
        if has_value {
            if name_index == 0 {
                skip_string(block, &mut at);
            }
            skip_string(block, &mut at);
        }
    }
    count
}

/// The header block of the answer to a GET of `path`, sent as the aggregator
/// sends it, on a connection of its own.
async fn answer_header_block(h: &crate::target_support::Harness, path: &str) -> Vec<u8> {
    let mut tls = caller_tls(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let mut request = Vec::new();
    request.extend_from_slice(&[0x82, 0x87]); // :method GET, :scheme https
    request.extend_from_slice(&literal(":path", path));
    request.extend_from_slice(&literal(":authority", "localhost"));
    request.extend_from_slice(&literal("accept", "application/json"));
    request.extend_from_slice(&literal("x-remote-user", "alice"));
    request.extend_from_slice(&literal("x-remote-group", "system:authenticated"));
    request.extend_from_slice(&literal("audit-id", "a0000000-0000-4000-8000-000000000001"));
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&frame(SETTINGS, 0, 0, &[]));
    // END_STREAM | END_HEADERS
    out.extend_from_slice(&frame(HEADERS, 0x1 | END_HEADERS, 1, &request));
    tls.write_all(&out).await.expect("request written");
    let read = async {
        // A bounded number of frames: settings, their ack, window updates, the answer.
        for _ in 0..32 {
            let mut head = [0u8; 9];
            tls.read_exact(&mut head).await.expect("frame header");
            let length =
                usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; length];
            tls.read_exact(&mut payload).await.expect("frame payload");
            if kind == SETTINGS && flags & ACK == 0 {
                tls.write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .expect("ack");
            }
            if kind == HEADERS && stream == 1 {
                assert_ne!(flags & END_HEADERS, 0, "the answer's head fits one frame");
                return payload;
            }
        }
        panic!("no answer within 32 frames");
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("an answer within 30 s")
}

/// The listener agrees the hybrid post-quantum key exchange (X25519MLKEM768)
/// with a caller that offers it, as the aggregators of kube-apiservers built with
/// Go 1.24 or later do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_agrees_a_post_quantum_key_exchange() {
    let h = harness(AccessMode::Owned).await;
    let tls = caller_tls(h.addr, &h.serving_ca_pem, &h.front_proxy_client).await;
    let agreed = tls.get_ref().1.negotiated_key_exchange_group();
    assert_eq!(
        agreed.map(|group| group.name()),
        Some(rustls::NamedGroup::X25519MLKEM768)
    );
}

/// The target's `Audit-Id` is new on every answer: the proxy sends it as a
/// literal never to be indexed, so that no HPACK table on the caller's
/// connection fills with values no later answer repeats. The test decodes no
/// Huffman text: the answer's other fields are indexed or indexable, so the
/// one never-indexed field is the Audit-Id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_request_audit_id_is_never_indexed() {
    let h = harness(AccessMode::Owned).await;
    let labels = serde_json::from_str(OWNER_LABELS).expect("labels");
    let created = send(
        &h,
        "POST",
        WIDGETS,
        Some("application/json"),
        widget("wired", labels).to_string(),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(
        created.headers.contains_key("audit-id"),
        "the target sends one"
    );
    let block = answer_header_block(&h, &format!("{WIDGETS}/wired")).await;
    assert_eq!(never_indexed_fields(&block), 1, "{block:02x?}");
    h.proxy.shutdown().await;
}
