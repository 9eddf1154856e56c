//! The HTTP side of loadctl: where the API is, which token to send, and what a failure means for
//! the exit code.
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Why a command failed, by what the operator should do about it.
#[derive(Debug)]
pub enum Failure {
    /// Settings that cannot work (bad URL, unreadable config file).
    Usage(String),
    /// The API answered 4xx (other than 401/403) with the contract's code.
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// 401 or 403.
    Denied {
        status: u16,
        code: String,
        message: String,
    },
    /// Transport error or 5xx.
    Unavailable(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Refused { .. } => 3,
            Failure::Denied { .. } => 4,
            Failure::Unavailable(_) => 5,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(m) => write!(f, "{m}"),
            Failure::Refused {
                status,
                code,
                message,
            } => write!(f, "{code} ({status}): {message}"),
            Failure::Denied {
                status: 403,
                code,
                message,
            } => {
                write!(
                    f,
                    "no permission: {code}: {message} (actions need a token with the operator role)"
                )
            }
            Failure::Denied {
                status,
                code,
                message,
            } => {
                write!(
                    f,
                    "not authenticated: {code} ({status}): {message} (set --token or LOADCTL_TOKEN)"
                )
            }
            Failure::Unavailable(m) => write!(f, "{m}"),
        }
    }
}

pub struct Api {
    http: reqwest::Client,
    base: String,
    /// monitor.refresh_seconds (the dashboard's default refresh).
    pub refresh_seconds: f64,
    token: Option<String>,
    operator_token: Option<String>,
}

impl Api {
    /// Flags (and their environment variables) over the configuration file's `monitor.*`, over
    /// the defaults.
    pub fn from_settings(
        server: Option<&str>,
        token: Option<&str>,
        operator_token: Option<&str>,
        config: Option<&Path>,
    ) -> Result<Api, Failure> {
        let path = lcconfig::config::config_path(config);
        let monitor = if path.exists() {
            let c = lcconfig::config::Config::load(&path, std::env::vars())
                .map_err(|e| Failure::Usage(format!("reading {}: {e}", path.display())))?;
            let port = c.server.port;
            let mut m = c.monitor;
            m.api_url
                .get_or_insert_with(|| format!("http://127.0.0.1:{port}"));
            m
        } else if config.is_some() {
            return Err(Failure::Usage(format!(
                "no configuration file at {}",
                path.display()
            )));
        } else {
            Default::default()
        };
        let base = server
            .map(str::to_string)
            .or(monitor.api_url)
            .unwrap_or_else(|| "http://127.0.0.1:8080".into());
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Failure::Usage(format!(
                "--server {base:?}: expected an http:// or https:// URL"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Failure::Usage(e.to_string()))?;
        let token = token.map(str::to_string).or(monitor.token);
        let operator_token = operator_token
            .map(str::to_string)
            .or(monitor.operator_token);
        Ok(Api {
            http,
            base: base.trim_end_matches('/').to_string(),
            refresh_seconds: monitor.refresh_seconds,
            token,
            operator_token,
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        token: Option<&String>,
    ) -> Result<Value, Failure> {
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .send()
            .await
            .map_err(|e| Failure::Unavailable(format!("cannot reach {}: {e}", self.base)))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let code = body["code"].as_str().unwrap_or("HTTP_ERROR").to_string();
        let mut message = body["message"].as_str().unwrap_or("").to_string();
        if let Some(d) = body.get("details").filter(|d| !d.is_null()) {
            message = format!("{message} {d}");
        }
        Err(match status {
            401 | 403 => Failure::Denied {
                status,
                code,
                message,
            },
            400..=499 => Failure::Refused {
                status,
                code,
                message,
            },
            _ => Failure::Unavailable(format!("{} answered {status} {code}: {message}", self.base)),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, Failure> {
        let mut url = format!("{}{path}", self.base);
        if !query.is_empty() {
            let mut q = form_urlencoded::Serializer::new(String::new());
            for (k, v) in query {
                q.append_pair(k, v);
            }
            url = format!("{url}?{}", q.finish());
        }
        let req = self.http.get(url);
        self.send(req, self.token.as_ref()).await
    }

    /// An operator action (POST): the operator token when one is set, else the token.
    pub async fn act(&self, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req, self.operator_token.as_ref().or(self.token.as_ref()))
            .await
    }
}
