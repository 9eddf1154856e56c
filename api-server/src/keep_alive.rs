//! Early answers on kept-alive connections. Some answers go out before the request body was read
//! (401, 403, 413, a 408 at the body deadline, other early 4xx; a 503 of the concurrency limit
//! comes only once the body has arrived). The client, pooled and keeping the connection alive, has
//! sent or is still sending that body; if the server then simply stops reading, the next request
//! on the connection runs into a closed socket. Every response
//! whose request body was not read to its end therefore says `Connection: close`, and hyper closes
//! the connection after it, so a pooled client opens a fresh one instead of writing into a dead one.
use crate::watched_body::{BodyWatch, watched};
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Body as HttpBody;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a request body was read to its end.
#[derive(Default)]
struct Ended(AtomicBool);

impl BodyWatch for Ended {
    fn ended(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Middleware: `Connection: close` on every response whose request body was left unread.
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        // No body (a GET, or Content-Length: 0): nothing can be left on the connection.
        return next.run(Request::from_parts(parts, body)).await;
    }
    let ended = Arc::new(Ended::default());
    let tracked = watched(body, ended.clone());
    let mut response = next.run(Request::from_parts(parts, tracked)).await;
    if !ended.0.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
