//! The api-server's Prometheus series (CONTRACT §9.1), served at `/metrics`.
use ledger::LockWaitObserver;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{
    Histogram, exponential_buckets, exponential_buckets_range,
};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabel {
    cert: &'static str,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<EndpointLabel, Histogram>,
    chunk_reports: Family<ResultLabel, Counter>,
    unavailable: Family<CodeLabel, Counter>,
    run_lock_wait: Histogram,
    connections_retired: Counter,
    connections_open: Gauge,
    connections_refused: Counter,
    connections_idle_closed: Counter,
    connections_shed: Counter,
    certificate_expiry: Family<CertLabel, FloatGauge>,
    certificate_reloaded: Family<CertLabel, FloatGauge>,
    certificate_reload_failures: Family<CertLabel, Counter>,
    tokens_reloaded: FloatGauge,
    tokens_reload_failures: Counter,
    /// Serializes the catch-up of the counters kept elsewhere (`catch_up`).
    catch_up_lock: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds = Family::<EndpointLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        let chunk_reports = Family::<ResultLabel, Counter>::default();
        let unavailable = Family::<CodeLabel, Counter>::default();
        registry.register(
            "lca_unavailable",
            "Requests answered 503 by cause: code DATABASE_UNAVAILABLE (the ledger unreachable, failing over or on an unsupported schema) or SERVICE_UNAVAILABLE (server.limit_concurrency full: overload)",
            unavailable.clone(),
        );
        let run_lock_wait = Histogram::new(exponential_buckets_range(0.001, 5.0, 12));
        registry.register(
            "lca_requests",
            "HTTP requests by route template and status",
            requests.clone(),
        );
        registry.register(
            "lca_request_seconds",
            "HTTP request latency by route template",
            request_seconds.clone(),
        );
        registry.register(
            "lca_chunk_reports",
            "Accepted chunk reports by outcome",
            chunk_reports.clone(),
        );
        registry.register(
            "lca_run_lock_wait_seconds",
            "Time partition calls spent acquiring the run row lock",
            run_lock_wait.clone(),
        );
        let connections_retired = Counter::default();
        registry.register(
            "lca_db_connections_retired",
            "Pooled database connections closed because their server could not take writes (read-only, standby, shutting down): each burst is a failover or switchover seen by this process",
            connections_retired.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "lca_http_connections_open",
            "Open HTTP connections of this process (server.max_connections caps them)",
            connections_open.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "lca_http_connections_refused",
            "Connections closed at once because server.max_connections were open and none of them could make room (all serving a request, or authenticated and not idle)",
            connections_refused.clone(),
        );
        let connections_shed = Counter::default();
        registry.register(
            "lca_http_connections_shed",
            "Open connections closed to make room for a new one at server.max_connections (never-authenticated ones without a request in flight first, then the authenticated one idle longest)",
            connections_shed.clone(),
        );
        let connections_idle_closed = Counter::default();
        registry.register(
            "lca_http_connections_idle_closed",
            "Connections closed after server.timeout_keep_alive without the first byte of a request",
            connections_idle_closed.clone(),
        );
        let certificate_expiry = Family::<CertLabel, FloatGauge>::default();
        registry.register(
            "lca_certificate_expiry_timestamp_seconds",
            "When the certificate in use expires (its notAfter), Unix seconds, by cert (api: the API's server certificate); alert on it minus time()",
            certificate_expiry.clone(),
        );
        let certificate_reloaded = Family::<CertLabel, FloatGauge>::default();
        registry.register(
            "lca_certificate_last_reload_timestamp_seconds",
            "When the certificate in use was loaded (at start, then at each rotation seen), Unix seconds",
            certificate_reloaded.clone(),
        );
        let certificate_reload_failures = Family::<CertLabel, Counter>::default();
        registry.register(
            "lca_certificate_reload_failures",
            "New certificate or key files that could not be used (unreadable, unparsable, a key that does not match): the previous certificate stays in use",
            certificate_reload_failures.clone(),
        );
        let tokens_reloaded = FloatGauge::default();
        registry.register(
            "lca_tokens_last_reload_timestamp_seconds",
            "When the entries of auth.tokens_file in use were read (at start, then at each change seen), Unix seconds",
            tokens_reloaded.clone(),
        );
        let tokens_reload_failures = Counter::default();
        registry.register(
            "lca_tokens_reload_failures",
            "New contents of auth.tokens_file that could not be used (unreadable, not the format, an invalid entry): the previous tokens stay in force",
            tokens_reload_failures.clone(),
        );
        Metrics {
            registry,
            tokens_reloaded,
            tokens_reload_failures,
            certificate_expiry,
            certificate_reloaded,
            certificate_reload_failures,
            requests,
            request_seconds,
            chunk_reports,
            unavailable,
            run_lock_wait,
            connections_retired,
            connections_open,
            connections_refused,
            connections_idle_closed,
            connections_shed,
            catch_up_lock: Default::default(),
        }
    }
}

impl Metrics {
    pub fn request(&self, endpoint: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                status,
            })
            .inc();
        self.request_seconds
            .get_or_create(&EndpointLabel {
                endpoint: endpoint.to_string(),
            })
            .observe(seconds);
    }

    /// A request answered 503, by its error code (the cause).
    pub fn unavailable(&self, code: &'static str) {
        self.unavailable.get_or_create(&CodeLabel { code }).inc();
    }

    pub fn chunk_report(&self, result: ledger::ChunkResult) {
        self.chunk_reports
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// Brings `lca_db_connections_retired` up to the ledger's count.
    pub fn connections_retired(&self, total: u64) {
        let _one_at_a_time = self.catch_up_lock.lock().unwrap_or_else(|p| p.into_inner());
        catch_up(&self.connections_retired, total);
    }

    /// Brings the edge's connection figures up to `stats`.
    pub fn edge(&self, stats: &crate::edge::EdgeStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let _one_at_a_time = self.catch_up_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.connections_open.set(stats.open.load(Relaxed) as i64);
        catch_up(&self.connections_refused, stats.refused.load(Relaxed));
        catch_up(
            &self.connections_idle_closed,
            stats.idle_closed.load(Relaxed),
        );
        catch_up(&self.connections_shed, stats.shed.load(Relaxed));
    }

    /// A certificate was loaded (`cert`: `api`); `not_after` in Unix seconds.
    pub fn certificate_loaded(&self, cert: &'static str, not_after: i64) {
        self.certificate_expiry
            .get_or_create(&CertLabel { cert })
            .set(not_after as f64);
        self.certificate_reloaded
            .get_or_create(&CertLabel { cert })
            .set(unix_now());
    }

    /// New files for `cert` could not be used.
    pub fn certificate_reload_failed(&self, cert: &'static str) {
        self.certificate_reload_failures
            .get_or_create(&CertLabel { cert })
            .inc();
    }

    /// The entries of `auth.tokens_file` were (re)read.
    pub fn tokens_loaded(&self) {
        self.tokens_reloaded.set(unix_now());
    }

    /// New contents of `auth.tokens_file` could not be used.
    pub fn tokens_reload_failed(&self) {
        self.tokens_reload_failures.inc();
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl LockWaitObserver for Metrics {
    fn observe(&self, seconds: f64) {
        self.run_lock_wait.observe(seconds);
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Raises a counter to a total kept elsewhere (the ledger's, the edge's own atomics).
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}
