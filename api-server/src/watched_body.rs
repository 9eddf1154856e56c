//! A request body that tells an observer what passes through it, for middleware that must know
//! what the handler read without reading the body itself (the keep-alive rule of `keep_alive.rs`,
//! the access log's bodies in `access.rs`): the body is read once, under the handler's own size
//! and time limits.
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// What an observer of a body is told.
pub trait BodyWatch: Send + Sync + 'static {
    /// A chunk of the body, as the handler reads it.
    fn data(&self, _chunk: &[u8]) {}
    /// The body was read to its end.
    fn ended(&self) {}
}

struct Watched {
    inner: Body,
    watch: Arc<dyn BodyWatch>,
}

/// `body`, reporting to `watch`.
pub fn watched(body: Body, watch: Arc<dyn BodyWatch>) -> Body {
    Body::new(Watched { inner: body, watch })
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.watch.data(data);
        }
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.watch.ended();
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
