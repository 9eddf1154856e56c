//! `monitor` (what `loadctl` reads) and `worker` (the operator's metrics listener).
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `monitor`: what `loadctl` reads (the only section it uses; it starts without a file).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// The API `loadctl` talks to; none: `http://127.0.0.1:<server.port>`. `--server` and
    /// `$LOADCTL_SERVER` come first.
    pub api_url: Option<String>,
    /// The raw token (not its digest) `loadctl` reads with. Never logged.
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// The raw token for actions (resolve, resend, cancel); none: `token`. Never logged.
    #[serde(skip_serializing)]
    pub operator_token: Option<String>,
    /// Seconds between refreshes of `loadctl`'s live views; at least 1.
    #[schemars(range(min = 1.0))]
    pub refresh_seconds: f64,
    /// Accepted for compatibility and unused.
    pub log_dir: String,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            api_url: None,
            token: None,
            operator_token: None,
            refresh_seconds: 5.0,
            log_dir: "logs".into(),
        }
    }
}

/// `worker`: the operator's metrics and health listener.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The address of the operator's `/metrics`, `/healthz` and `/readyz`.
    pub metrics_host: String,
    /// Its port; `null` turns the listener off.
    #[schemars(range(min = 1, max = 65535))]
    pub metrics_port: Option<i64>,
    /// Serve `metrics_port` in HTTPS with the API's certificate and key (`server.ssl_certfile`,
    /// `ssl_keyfile`, re-read every `server.reload_interval`) and its client-certificate check
    /// (`server.ssl_ca_certs`, `ssl_client_cert_required`), so that the operator's metrics are
    /// protected as the API's are. Needs `server.ssl_certfile`.
    pub metrics_tls: bool,
    /// A second port, always plain HTTP, that answers `/healthz` and `/readyz` only (404 to
    /// anything else), for the kubelet's probes when `metrics_tls` with
    /// `server.ssl_client_cert_required` keeps them off `metrics_port` (a probe has no client
    /// certificate). None: no second listener.
    #[schemars(range(min = 1, max = 65535))]
    pub health_port: Option<i64>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            metrics_host: "0.0.0.0".into(),
            metrics_port: Some(9100),
            metrics_tls: false,
            health_port: None,
        }
    }
}

impl MonitorConfig {
    /// §10.4's checks of the `monitor` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.refresh_seconds < 1.0 {
            return Err(invalid("monitor.refresh_seconds", "must be at least 1"));
        }
        Ok(())
    }
}

impl WorkerConfig {
    /// §10.4's checks of the `worker` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.metrics_port
            && !(1..=65535).contains(&p)
        {
            return Err(invalid(
                "worker.metrics_port",
                format!("{p} is outside 1..65535"),
            ));
        }
        if let Some(p) = self.health_port {
            if !(1..=65535).contains(&p) {
                return Err(invalid(
                    "worker.health_port",
                    format!("{p} is outside 1..65535"),
                ));
            }
            if Some(p) == self.metrics_port {
                return Err(invalid(
                    "worker.health_port",
                    format!("{p} is also worker.metrics_port; the probes need a port of their own"),
                ));
            }
        }
        if self.metrics_tls && self.metrics_port.is_none() {
            return Err(invalid(
                "worker.metrics_tls",
                "needs worker.metrics_port (the listener it protects)",
            ));
        }
        Ok(())
    }
}
