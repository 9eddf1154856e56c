//! `server`: the api-server's listener, its deadlines, TLS and the proxies it believes.
use super::Dur;
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `server.forwarded_allow_ips`: the peers whose `X-Forwarded-For` is believed (§10.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustedProxies {
    /// `*`: every peer.
    Any,
    Only(Vec<std::net::IpAddr>),
}

impl TrustedProxies {
    /// `*`, or addresses separated by commas (spaces allowed around them).
    pub fn parse(text: &str) -> Result<TrustedProxies, String> {
        let entries: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        if entries.contains(&"*") {
            return Ok(TrustedProxies::Any);
        }
        entries
            .iter()
            .map(|e| {
                e.parse()
                    .map_err(|_| format!("`{e}` is not an IP address (nor `*`)"))
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies::Only)
    }

    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        match self {
            TrustedProxies::Any => true,
            TrustedProxies::Only(ips) => ips.contains(&ip) || ips.contains(&ip.to_canonical()),
        }
    }
}

/// `server`: the api-server's HTTP listener.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The address the api-server listens on.
    pub host: String,
    /// The port the api-server listens on (1..65535).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i64,
    /// A second port, always plain HTTP, that answers `/healthz` and `/readyz` only (404 to
    /// anything else), for the kubelet's probes when `ssl_client_cert_required` keeps them off
    /// `port` (a probe has no client certificate). None: no second listener.
    #[schemars(range(min = 1, max = 65535))]
    pub health_port: Option<i64>,
    /// Accepted for compatibility, at least 1, and without effect: the api-server is one
    /// multi-threaded process per container; scale with replicas.
    #[schemars(range(min = 1))]
    pub workers: i64,
    /// A path prefix a proxy in front of the API strips (`/lca`): the API also answers under it.
    pub root_path: String,
    /// Read the client's address from `X-Forwarded-For` when the peer is one of
    /// `forwarded_allow_ips` (the access log's `client`).
    pub proxy_headers: bool,
    /// The proxies whose `X-Forwarded-For` is believed: addresses separated by commas, or `*`.
    pub forwarded_allow_ips: String,
    /// Seconds a connection may wait for the first byte of a request, fresh or kept alive.
    pub timeout_keep_alive: f64,
    /// Seconds a client has for a whole request head once it started sending it (and for a TLS
    /// handshake).
    pub header_read_timeout: f64,
    /// Seconds a client has for a whole request body; then 408 `REQUEST_TIMEOUT` and the
    /// connection is closed.
    pub body_read_timeout: f64,
    /// Open connections per process, and as many TLS handshakes in progress. At the cap a new
    /// connection takes the place of an open one: one that never presented a valid bearer token
    /// and has no request in flight (the earliest accepted), else the authenticated one idle
    /// longest (`lca_http_connections_shed_total`); it is closed at once only when every open
    /// connection is busy (`lca_http_connections_refused_total`).
    #[schemars(range(min = 1))]
    pub max_connections: usize,
    /// Seconds in-flight requests have to finish after SIGTERM.
    pub timeout_graceful_shutdown: f64,
    /// `/v1` requests handled at once (none: no limit); beyond it 503 `SERVICE_UNAVAILABLE`,
    /// after authentication and the body (413/408), not before. A request takes its permit once
    /// its body has arrived, so a body being trickled in holds none; the bytes of bodies being
    /// read or handled are bounded by `limit_concurrency × max_body_bytes` in all.
    #[schemars(range(min = 1))]
    pub limit_concurrency: Option<usize>,
    /// PEM certificate (chain) of the API: with `ssl_keyfile`, the api-server speaks HTTPS only.
    pub ssl_certfile: Option<PathBuf>,
    /// PEM private key of `ssl_certfile`.
    pub ssl_keyfile: Option<PathBuf>,
    /// PEM bundle the client certificates are verified against.
    pub ssl_ca_certs: Option<PathBuf>,
    /// Refuse clients without a certificate in the TLS handshake (needs the certificate, the key
    /// and `ssl_ca_certs`).
    pub ssl_client_cert_required: bool,
    /// The largest request body accepted; a larger one is answered 413.
    #[schemars(range(min = 1))]
    pub max_body_bytes: usize,
    /// How often the api-server reads `ssl_certfile`/`ssl_keyfile` and `auth.tokens_file` again:
    /// a renewed certificate serves the next handshakes (open connections keep theirs), a changed
    /// tokens file the next requests, without a restart.
    pub reload_interval: Dur,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 8080,
            health_port: None,
            workers: 1,
            root_path: String::new(),
            proxy_headers: true,
            forwarded_allow_ips: "127.0.0.1".into(),
            timeout_keep_alive: 5.0,
            header_read_timeout: 10.0,
            body_read_timeout: 10.0,
            max_connections: 1024,
            timeout_graceful_shutdown: 30.0,
            limit_concurrency: None,
            ssl_certfile: None,
            ssl_keyfile: None,
            ssl_ca_certs: None,
            ssl_client_cert_required: false,
            max_body_bytes: 16 * 1024 * 1024,
            reload_interval: Dur::secs(5),
        }
    }
}

impl ServerConfig {
    /// §10.4's checks of the `server` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let s = self;
        if s.ssl_certfile.is_some() != s.ssl_keyfile.is_some() {
            return Err(invalid(
                "server.ssl_certfile",
                "ssl_certfile and ssl_keyfile go together",
            ));
        }
        if s.ssl_client_cert_required && (s.ssl_certfile.is_none() || s.ssl_ca_certs.is_none()) {
            return Err(invalid(
                "server.ssl_client_cert_required",
                "needs ssl_certfile, ssl_keyfile and ssl_ca_certs",
            ));
        }
        TrustedProxies::parse(&s.forwarded_allow_ips)
            .map_err(|m| invalid("server.forwarded_allow_ips", m))?;
        if !(1..=65535).contains(&s.port) {
            return Err(invalid(
                "server.port",
                format!("{} is outside 1..65535", s.port),
            ));
        }
        if let Some(p) = s.health_port {
            if !(1..=65535).contains(&p) {
                return Err(invalid(
                    "server.health_port",
                    format!("{p} is outside 1..65535"),
                ));
            }
            if p == s.port {
                return Err(invalid(
                    "server.health_port",
                    format!("{p} is server.port: the health port is a second listener"),
                ));
            }
        }
        if s.workers < 1 {
            return Err(invalid("server.workers", "must be at least 1"));
        }
        if s.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be positive"));
        }
        for (key, v) in [
            ("server.timeout_keep_alive", s.timeout_keep_alive),
            ("server.header_read_timeout", s.header_read_timeout),
            ("server.body_read_timeout", s.body_read_timeout),
        ] {
            if !(v.is_finite() && (0.1..=3600.0).contains(&v)) {
                return Err(invalid(key, "must be between 0.1 and 3600 seconds"));
            }
        }
        if s.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        if s.reload_interval.0 < std::time::Duration::from_millis(100) {
            return Err(invalid(
                "server.reload_interval",
                "must be at least 0.1 seconds",
            ));
        }
        Ok(())
    }
}
