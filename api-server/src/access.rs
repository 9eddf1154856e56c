//! What the access log says about a request (CONTRACT §9.2): the client's address, believed from
//! `X-Forwarded-For` only when the peer is a trusted proxy (`server.proxy_headers`,
//! `server.forwarded_allow_ips`), and the request and response bodies, clipped at
//! `logging.access_body_max` characters (`logging.access_body`), with the value of every `*token`
//! field masked first (§9.2: claim and publish tokens are never logged).
use crate::watched_body::{BodyWatch, watched};
use axum::body::Body;
use axum::http::HeaderMap;
use lcconfig::config::TrustedProxies;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// The client of a request. The peer's own address unless it is a trusted proxy that sent
/// `X-Forwarded-For`; then the hops are read from the right (the nearest proxy's view first) and
/// the first one the proxies are not trusted to have added is the client. When every hop is
/// trusted, the leftmost one is.
pub fn client(
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    proxy_headers: bool,
    trusted: &TrustedProxies,
) -> String {
    let Some(peer) = peer else {
        return String::new();
    };
    if !proxy_headers || !trusted.trusts(peer.ip()) {
        return peer.to_string();
    }
    let forwarded: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|hop| !hop.is_empty())
        .collect();
    for hop in forwarded.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if trusted.trusts(ip) => continue,
            _ => return (*hop).to_string(),
        }
    }
    forwarded
        .first()
        .map(|hop| hop.to_string())
        .unwrap_or_else(|| peer.to_string())
}

/// `text` cut at `max` characters, with `...(+<n> chars)` saying how many were left out.
pub fn clip(text: &str, total_chars: usize, max: usize) -> String {
    if total_chars <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}...(+{} chars)", total_chars - max)
}

/// Characters in UTF-8 `bytes`, counted by their first bytes (continuation bytes excluded), so a
/// body is counted without being decoded.
fn utf8_chars(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| (**b & 0xC0) != 0x80).count()
}

/// The bytes that hold the first `max_chars` characters, at most (a character takes 4 at most).
fn head_bytes(max_chars: usize) -> usize {
    max_chars.saturating_mul(4).saturating_add(4)
}

/// A body of `total_chars` characters whose first bytes are `head`, as the access log shows it:
/// its `*token` fields masked, then clipped at `max` characters. The count of what was left out is
/// the masked body's.
fn shown(head: &[u8], total_chars: usize, max: usize) -> String {
    // This runs in the middleware, outside the handler's panic guard: a bug here must cost the
    // log its body, never the client its answer (nor a token its secrecy).
    std::panic::catch_unwind(|| {
        let text = String::from_utf8_lossy(head);
        let masked = lcconfig::redact::mask_token_fields(&text);
        let total = (total_chars + masked.chars().count()).saturating_sub(text.chars().count());
        clip(&masked, total, max)
    })
    .unwrap_or_else(|_| format!("(body of {total_chars} chars not shown: masking failed)"))
}

/// A query string as the access log shows it: its `*token` parameters masked.
pub fn shown_query(query: &str) -> String {
    std::panic::catch_unwind(|| lcconfig::redact::mask_token_fields(query).into_owned())
        .unwrap_or_else(|_| "(query not shown: masking failed)".into())
}

/// A whole body (a response) as the access log shows it: only its head is decoded.
pub fn clip_bytes(bytes: &[u8], max: usize) -> String {
    shown(
        &bytes[..bytes.len().min(head_bytes(max))],
        utf8_chars(bytes),
        max,
    )
}

/// What a [`Tee`] has seen of a body: its first bytes and its length in characters.
#[derive(Default)]
struct Seen {
    head: Vec<u8>,
    chars: usize,
}

impl Seen {
    fn clipped(&self, max: usize) -> String {
        shown(&self.head, self.chars, max)
    }
}

/// Keeps a copy of what the handler reads of a request body (never more than the log shows).
pub struct Tee {
    seen: Mutex<Seen>,
    keep: usize,
}

impl Tee {
    /// Wraps `body`, keeping enough bytes for `max_chars` characters.
    pub fn wrap(body: Body, max_chars: usize) -> (Body, Arc<Tee>) {
        let tee = Arc::new(Tee {
            seen: Mutex::new(Seen::default()),
            keep: head_bytes(max_chars),
        });
        (watched(body, tee.clone()), tee)
    }

    /// The body as the access log shows it.
    pub fn clipped(&self, max: usize) -> String {
        self.seen.lock().expect("tee").clipped(max)
    }
}

impl BodyWatch for Tee {
    fn data(&self, chunk: &[u8]) {
        let mut seen = self.seen.lock().expect("tee");
        let room = self.keep.saturating_sub(seen.head.len());
        seen.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
        seen.chars += utf8_chars(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_client_is_believed_only_from_trusted_proxies() {
        let local = TrustedProxies::parse("127.0.0.1").unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let stranger: SocketAddr = "192.0.2.9:5000".parse().unwrap();
        let xff = headers(&["203.0.113.7"]);
        assert_eq!(client(Some(peer), &xff, true, &local), "203.0.113.7");
        assert_eq!(client(Some(peer), &xff, false, &local), "127.0.0.1:40000");
        assert_eq!(client(Some(stranger), &xff, true, &local), "192.0.2.9:5000");
        assert_eq!(
            client(Some(peer), &headers(&[]), true, &local),
            "127.0.0.1:40000"
        );
        // A client that forges the header is one hop further left than the proxy's own entry.
        let chain = headers(&["198.51.100.1, 203.0.113.7", "127.0.0.1"]);
        assert_eq!(client(Some(peer), &chain, true, &local), "203.0.113.7");
        let any = TrustedProxies::parse("*").unwrap();
        assert_eq!(client(Some(stranger), &chain, true, &any), "198.51.100.1");
        assert_eq!(client(None, &chain, true, &any), "");
    }

    #[test]
    fn bodies_are_clipped_with_what_was_left_out() {
        assert_eq!(clip("abc", 3, 3), "abc");
        assert_eq!(clip("abcdef", 6, 4), "abcd...(+2 chars)");
        assert_eq!(clip("ééé", 3, 1), "é...(+2 chars)");
        assert_eq!(clip_bytes("ééé".as_bytes(), 1), "é...(+2 chars)");
        assert_eq!(clip_bytes(b"abc", 3), "abc");
    }

    #[test]
    fn token_fields_are_masked_before_the_body_is_clipped() {
        let body = br#"{"claimToken":"3f2a9c1e-0b6f-4d2a-9a51-2c3d4e5f6a7b","chunkIndex":7}"#;
        assert_eq!(
            clip_bytes(body, 100),
            r#"{"claimToken":"***","chunkIndex":7}"#
        );
        // Clipped inside the value: nothing of it shows, and the count is the masked body's.
        assert_eq!(
            clip_bytes(body, 20),
            r#"{"claimToken":"***",...(+15 chars)"#
        );
    }
}
