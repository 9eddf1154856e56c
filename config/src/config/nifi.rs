//! `nifi`: where dispatches go (PG-05), the client certificate, and the keys that sign them.
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// `nifi`: where the operator sends dispatches (NiFi's PG-05 receiver) and how it signs them.
#[derive(Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NifiConfig {
    /// PG-05's scheme, host and port, without a path (`https://nifi.example:9443`): PG-05 answers
    /// 404 under a path. The operator refuses to start without it; a LoadJob may name its own.
    #[schemars(regex(pattern = "^(https?://[^/?#]+.*)?$"))]
    pub receiver_url: Option<String>,
    /// A proxy in front of NiFi strips the receiver URL's path: allow one. Otherwise a
    /// `receiver_url` with a path refuses to start (a LoadJob with one gets `Ready=False`,
    /// `InvalidSpec`): PG-05 answers 404 under a path, and a 404 makes a dispatch DEAD at once.
    pub receiver_path_allowed: bool,
    /// PEM client certificate presented to NiFi (with `client_key`); read again every 5 s.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// PEM bundle that replaces the system trust store for NiFi's certificate.
    pub ca_bundle: Option<PathBuf>,
    /// Seconds one dispatch request may take; less than `dispatch.lease`.
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub timeout_seconds: f64,
    /// The HMAC key dispatches are signed with (`X-Lca-Signature`) when `signing_keys` is unset.
    /// Never logged.
    #[serde(skip_serializing)]
    pub signing_secret: Option<String>,
    /// Keys for rotation, `[{id, secret}]`: the first signs and its id goes in `X-Lca-Key-Id`;
    /// PG-05 accepts any of them while a rotation is under way. Never logged.
    #[serde(skip_serializing)]
    pub signing_keys: Option<Vec<SigningKey>>,
}

/// Never prints a secret: `signing_secret` and every key's secret are shown as `***`.
impl std::fmt::Debug for NifiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NifiConfig")
            .field("receiver_url", &self.receiver_url)
            .field("receiver_path_allowed", &self.receiver_path_allowed)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("ca_bundle", &self.ca_bundle)
            .field("timeout_seconds", &self.timeout_seconds)
            .field(
                "signing_secret",
                &self.signing_secret.as_ref().map(|_| crate::redact::MASK),
            )
            .field("signing_keys", &self.signing_keys)
            .finish()
    }
}

/// One entry of `nifi.signing_keys`: `{id, secret}`.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    /// The key's id, sent in `X-Lca-Key-Id`: 1 to 64 characters of `[A-Za-z0-9._-]`.
    #[schemars(regex(pattern = "^[A-Za-z0-9._-]{1,64}$"))]
    pub id: String,
    /// The HMAC key (a string: quote one YAML would read as a number).
    #[serde(deserialize_with = "secret_string", skip_serializing)]
    pub secret: String,
}

/// Shows the id only.
impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .field("secret", &crate::redact::MASK)
            .finish()
    }
}

/// A secret must be a string. Serde's own message would quote the value it refused (a secret
/// YAML read as a number or a boolean) into the start-up error; this one never does.
fn secret_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        other => Err(serde::de::Error::custom(format!(
            "must be a string, not a {} (quote a secret that YAML reads as a number, a boolean or null)",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(_) => "number",
                Value::Array(_) => "list",
                Value::Object(_) => "mapping",
                Value::String(_) => unreachable!(),
            }
        ))),
    }
}

/// A key id of `nifi.signing_keys`: `[A-Za-z0-9._-]{1,64}` (§6.4).
pub fn is_signing_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The key dispatches are signed with (§6.4): the first of `signing_keys` (with its id), else
/// `signing_secret` (without one), else none.
#[derive(Clone, PartialEq, Eq)]
pub struct Signer {
    pub key_id: Option<String>,
    pub secret: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .field("secret", &crate::redact::MASK)
            .finish()
    }
}

impl NifiConfig {
    /// See [`Signer`]; a validated configuration never has both.
    pub fn signer(&self) -> Option<Signer> {
        match (&self.signing_keys, &self.signing_secret) {
            (Some(keys), _) => keys.first().map(|k| Signer {
                key_id: Some(k.id.clone()),
                secret: k.secret.clone(),
            }),
            (None, Some(secret)) => Some(Signer {
                key_id: None,
                secret: secret.clone(),
            }),
            (None, None) => None,
        }
    }

    /// §10.4's checks of the `nifi` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.receiver_url
            && let Some(problem) =
                ledger::settings::receiver_url_problem(url, self.receiver_path_allowed)
        {
            return Err(invalid("nifi.receiver_url", problem));
        }
        self.validate_signing_keys()?;
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(invalid(
                "nifi.client_cert",
                "client_cert and client_key go together",
            ));
        }
        Ok(())
    }

    /// The §6.4 checks of `signing_keys`.
    fn validate_signing_keys(&self) -> Result<(), ConfigError> {
        let Some(keys) = &self.signing_keys else {
            return Ok(());
        };
        if self.signing_secret.is_some() {
            return Err(invalid(
                "nifi.signing_keys",
                "set either nifi.signing_secret or nifi.signing_keys, not both \
                 (signing_keys replaces signing_secret: to keep the current secret, make it an \
                 entry of signing_keys with an id)",
            ));
        }
        if keys.is_empty() {
            return Err(invalid(
                "nifi.signing_keys",
                "is an empty list: give at least one {id, secret} (the first signs), or leave \
                 it unset",
            ));
        }
        for (i, k) in keys.iter().enumerate() {
            if !is_signing_key_id(&k.id) {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].id"),
                    format!("{:?} must be 1..64 characters of [A-Za-z0-9._-]", k.id),
                ));
            }
            if let Some(j) = keys[..i].iter().position(|o| o.id == k.id) {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].id"),
                    format!("{:?} is already the id of nifi.signing_keys[{j}]", k.id),
                ));
            }
            if k.secret.is_empty() {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].secret"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

impl Default for NifiConfig {
    fn default() -> Self {
        NifiConfig {
            receiver_url: None,
            receiver_path_allowed: false,
            client_cert: None,
            client_key: None,
            ca_bundle: None,
            timeout_seconds: 10.0,
            signing_secret: None,
            signing_keys: None,
        }
    }
}
