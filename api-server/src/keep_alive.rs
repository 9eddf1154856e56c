//! Early answers on kept-alive connections. Some answers go out before the request body was read
//! (401, 403, 413, a 503 from the concurrency limit, other early 4xx). The client, pooled and
//! keeping the connection alive, has sent or is still sending that body; if the server then simply
//! stops reading, the next request on the connection runs into a closed socket. Every response
//! whose request body was not read to its end therefore says `Connection: close`, and hyper closes
//! the connection after it, so a pooled client opens a fresh one instead of writing into a dead one.
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// A request body that records whether it was read to its end.
struct Tracked {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: `Connection: close` on every response whose request body was left unread.
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        // No body (a GET, or Content-Length: 0): nothing can be left on the connection.
        return next.run(Request::from_parts(parts, body)).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let tracked = Body::new(Tracked {
        inner: body,
        ended: ended.clone(),
    });
    let mut response = next.run(Request::from_parts(parts, tracked)).await;
    if !ended.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
