//! The HTTP edge: accepting connections and serving HTTP/1.1 on them with deadlines, so that a
//! slow or idle client cannot hold a file descriptor or a request permit for long.
//!
//! | limit | setting (default) | what a client that breaks it gets |
//! |---|---|---|
//! | open connections per process | `server.max_connections` (1024) | see below |
//! | wait for the first byte of a request (fresh or kept-alive connection) | `server.timeout_keep_alive` (5 s) | connection closed |
//! | a whole request head, once started | `server.header_read_timeout` (10 s) | connection closed (hyper's timer) |
//! | a whole request body | `server.body_read_timeout` (10 s) | 408 `REQUEST_TIMEOUT`, connection closed (`input.rs`) |
//! | a TLS handshake | the same `header_read_timeout` | connection dropped (`tls.rs`) |
//!
//! **Slots at the cap.** When `max_connections` are open, a new connection takes the place of an
//! open one instead of being refused: first of a connection that has never presented a valid
//! bearer token and has no request in flight (the earliest accepted of them), else of an
//! authenticated connection that is idle (the one idle longest). The connection whose place is
//! taken is closed at once when it is between requests (a half-sent head of an unauthenticated
//! client included); a request that raced in is answered first, with `Connection: close`. Only
//! when every open connection is serving a request, or is authenticated and not idle, is the new
//! one closed at once. So clients that never authenticate — kept alive with `/healthz`,
//! reconnecting, or silent — cannot keep NiFi out: each new connection of NiFi's pushes out the
//! oldest of theirs, and NiFi's kept-alive connections are only ever given up when none of theirs
//! is left. (A limit per peer address would not help: behind an ingress every peer is the proxy.)
//!
//! **Shutdown.** At SIGTERM (in Kubernetes after the preStop's `api.drainSeconds`, when the
//! endpoint is already gone) the listener closes, then for [`DRAIN_WINDOW`] (at most
//! `server.timeout_graceful_shutdown`) kept-alive connections stay open and every answer on them
//! carries `Connection: close`; then idle ones are closed and in-flight requests finish.
use axum::body::Body;
use axum::extract::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

/// How long kept-alive connections stay open at shutdown, answered with `Connection: close`: a
/// busy client (NiFi's pooled connections) sends within it, gets its answer and moves to another
/// pod; only a connection idle for the whole window is closed under its client.
pub const DRAIN_WINDOW: Duration = Duration::from_secs(3);

/// The edge's limits, from `server.*`.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    pub max_connections: usize,
    pub keep_alive: Duration,
    pub header_read: Duration,
}

impl EdgeLimits {
    pub fn of(s: &lcconfig::config::ServerConfig) -> EdgeLimits {
        EdgeLimits {
            max_connections: s.max_connections.max(1),
            keep_alive: Duration::from_secs_f64(s.timeout_keep_alive.max(0.1)),
            header_read: Duration::from_secs_f64(s.header_read_timeout.max(0.1)),
        }
    }
}

/// Counters the metrics endpoint reads.
#[derive(Debug, Default)]
pub struct EdgeStats {
    pub open: AtomicUsize,
    pub refused: AtomicU64,
    pub idle_closed: AtomicU64,
    /// Open connections whose place a new one took at the cap.
    pub shed: AtomicU64,
}

/// One connection's request state, shared by its IO and its service.
struct ConnState {
    /// Order of acceptance.
    id: u64,
    origin: Instant,
    in_flight: AtomicUsize,
    /// Bytes of the next request have arrived since the last response.
    reading: AtomicBool,
    /// When the connection last became idle (accepted, or its last response was produced), in
    /// milliseconds since `origin`.
    idle_since_ms: AtomicU64,
    /// A request on it presented a valid bearer token (set by the auth extractor through
    /// [`ConnectionMark`]).
    authenticated: AtomicBool,
    /// A new connection took its place: close it as soon as it is between requests.
    shed: AtomicBool,
    /// The IO's pending read, woken when the connection is shed.
    reader: futures::task::AtomicWaker,
}

impl ConnState {
    fn new(id: u64) -> ConnState {
        ConnState {
            id,
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            reading: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            authenticated: AtomicBool::new(false),
            shed: AtomicBool::new(false),
            reader: futures::task::AtomicWaker::new(),
        }
    }

    fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn is_shed(&self) -> bool {
        self.shed.load(Ordering::Acquire)
    }

    fn shed(&self) {
        self.shed.store(true, Ordering::Release);
        self.reader.wake();
    }

    /// Shed and ready to go without losing a request: never authenticated and no request in
    /// flight (a half-sent head is dropped), or idle.
    fn closes_now(&self, keep_alive: Duration) -> bool {
        self.is_shed()
            && if self.is_authenticated() {
                self.idle_deadline(keep_alive).is_some()
            } else {
                !self.in_flight()
            }
    }

    fn idle_deadline(&self, keep_alive: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 || self.reading.load(Ordering::Acquire) {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.origin + since + keep_alive)
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn response_ready(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.reading.store(false, Ordering::Release);
            self.idle_since_ms
                .store(self.origin.elapsed().as_millis() as u64, Ordering::Release);
        }
    }
}

/// A request's handle on its connection: the auth extractor marks the connection authenticated
/// (the slots at the cap keep it over connections that never were).
#[derive(Clone)]
pub struct ConnectionMark(Arc<ConnState>);

impl ConnectionMark {
    /// The request presented a valid bearer token.
    pub fn authenticated(&self) {
        self.0.authenticated.store(true, Ordering::Release);
    }
}

/// The open connections, for `max_connections` and the choice of whose place a new one takes.
struct Slots {
    max: usize,
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Slots {
    /// Admits `conn`, shedding another connection when `max` are open; false: no place for it.
    fn admit(&self, conn: &Arc<ConnState>, stats: &EdgeStats) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= self.max {
            let Some(victim) = Self::victim(&open) else {
                return false;
            };
            if let Some(v) = open.remove(&victim) {
                v.shed();
                stats.shed.fetch_add(1, Ordering::Relaxed);
            }
        }
        open.insert(conn.id, conn.clone());
        true
    }

    /// Whose place a new connection takes: a never-authenticated connection without a request
    /// in flight, the earliest accepted; else the authenticated connection idle longest.
    fn victim(open: &HashMap<u64, Arc<ConnState>>) -> Option<u64> {
        let unauthenticated = open
            .values()
            .filter(|c| !c.is_authenticated() && !c.in_flight())
            .map(|c| c.id)
            .min();
        unauthenticated.or_else(|| {
            open.values()
                .filter(|c| c.is_authenticated())
                .filter_map(|c| Some((c.idle_deadline(Duration::ZERO)?, c.id)))
                .min()
                .map(|(_, id)| id)
        })
    }

    fn leave(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
}

/// A connection's IO that reads as closed once it has waited `keep_alive` for the first byte of
/// a request (hyper then closes it as an idle connection the client gave up on), or once it was
/// shed at the cap and is between requests.
struct IdleIo<T> {
    inner: T,
    state: Arc<ConnState>,
    keep_alive: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    stats: Arc<EdgeStats>,
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Shed and never authenticated: end of stream at once, even within a half-sent head.
        if self.state.is_shed() && !self.state.is_authenticated() && !self.state.in_flight() {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.state.reading.store(true, Ordering::Release);
                    self.sleep = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // Registered before the check: a shed after it wakes this read.
                self.state.reader.register(cx.waker());
                if self.state.closes_now(self.keep_alive) {
                    return Poll::Ready(Ok(()));
                }
                let Some(deadline) = self.state.idle_deadline(self.keep_alive) else {
                    return Poll::Pending;
                };
                let deadline = tokio::time::Instant::from_std(deadline);
                match &mut self.sleep {
                    Some(s) if s.deadline() == deadline => {}
                    Some(s) => s.as_mut().reset(deadline),
                    None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
                }
                let sleep = self.sleep.as_mut().expect("set above");
                match sleep.as_mut().poll(cx) {
                    // End of stream, as if the client had closed: hyper ends the connection.
                    Poll::Ready(()) => {
                        self.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Serves `app` on `listener` until `stop` turns true, then lets open connections finish their
/// request for `grace` at most.
pub async fn serve<L, S>(
    mut listener: L,
    app: S,
    limits: EdgeLimits,
    stats: Arc<EdgeStats>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<
            Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let slots = Arc::new(Slots {
        max: limits.max_connections,
        open: Mutex::new(HashMap::new()),
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let draining = Arc::new(AtomicBool::new(false));
    // One connection per round; the loop ends with `stop`.
    for id in 0u64.. {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let state = Arc::new(ConnState::new(id));
        if !slots.admit(&state, &stats) {
            let n = stats.refused.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() {
                tracing::warn!(
                    event = "connection_refused",
                    refused_total = n + 1,
                    max_connections = limits.max_connections,
                    "too many open connections, all busy: a new one was closed at once (server.max_connections)"
                );
            }
            drop(io);
            continue;
        }
        let io = IdleIo {
            inner: io,
            state: state.clone(),
            keep_alive: limits.keep_alive,
            sleep: None,
            stats: stats.clone(),
        };
        let app = app.clone();
        let draining = draining.clone();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                state.request_started();
                let state = state.clone();
                let mut req = req.map(Body::new);
                // The peer's address, for the access log's client (access.rs).
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req.extensions_mut().insert(ConnectionMark(state.clone()));
                let call = tower::ServiceExt::oneshot(app.clone(), req);
                let draining = draining.clone();
                async move {
                    let mut response = call.await;
                    // Shed while this request was in flight, or the server is draining: the
                    // connection ends after it.
                    if (state.is_shed() || draining.load(Ordering::Acquire))
                        && let Ok(r) = &mut response
                    {
                        r.headers_mut().insert(
                            axum::http::header::CONNECTION,
                            axum::http::HeaderValue::from_static("close"),
                        );
                    }
                    state.response_ready();
                    response
                }
            });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        let (stats, slots) = (stats.clone(), slots.clone());
        stats.open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Errors here are the client's (a reset, a malformed or timed-out head).
            let _ = connection.await;
            stats.open.fetch_sub(1, Ordering::Relaxed);
            slots.leave(id);
        });
    }
    // Draining from before the listener closes: a client refused a new connection never gets an
    // answer without `Connection: close` on an old one.
    draining.store(true, Ordering::Release);
    drop(listener);
    // Draining: kept-alive connections stay open a moment longer and every answer on them says
    // `Connection: close`, so a pooled client (NiFi) that sends once more gets its answer and
    // opens a new connection (to a pod that stays) instead of writing into a socket closed under
    // it, a failed call. Closing idle connections at once, as graceful shutdown does, races
    // every such client. Those still idle when the window ends are closed then.
    let window = DRAIN_WINDOW.min(grace);
    let drain_started = Instant::now();
    while stats.open.load(Ordering::Relaxed) > 0 && drain_started.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if tokio::time::timeout(
        grace.saturating_sub(drain_started.elapsed()),
        graceful.shutdown(),
    )
    .await
    .is_err()
    {
        tracing::warn!(
            event = "shutdown_timeout",
            "in-flight requests did not finish within timeout_graceful_shutdown"
        );
    }
}
