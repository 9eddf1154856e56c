//! Bearer tokens with named identities (CONTRACT §3.6): the configuration holds only SHA-256
//! digests; the presented token's digest is compared with every entry in constant time. The
//! entries of `auth.tokens_file` are replaced while the process runs (`server.rs` watches it).
use crate::config::{AuthConfig, TokenDigests, TokenEntry, TokensFile};
use crate::error::ApiError;
use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};
use std::sync::{Arc, PoisonError, RwLock};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Nifi,
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Nifi => "nifi",
            Role::Operator => "operator",
        }
    }
}

/// Who called: the role that matched and the name of the token's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    pub identity: String,
}

struct Entry {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The token entries in force: those of the configuration, plus those of `auth.tokens_file`,
/// which a reload replaces as a whole (a request sees one set or the other, never a mix).
pub struct Authenticator {
    /// `auth.tokens` then `auth.token_digests`, fixed for the life of the process.
    configured: Arc<Vec<Entry>>,
    /// The file's entries, then the configured ones.
    current: RwLock<Arc<Vec<Entry>>>,
}

pub fn sha256_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Entries of `tokens` first, then `token_digests` (named after their role). Assumes checked
/// entries (64-hex digests, known roles).
fn entries(tokens: &[TokenEntry], digests: &TokenDigests) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut add = |name: &str, role: &str, digest: &str| {
        let role = if role == "operator" {
            Role::Operator
        } else {
            Role::Nifi
        };
        let mut d = [0u8; 32];
        if hex::decode_to_slice(digest.to_ascii_lowercase(), &mut d).is_ok() {
            entries.push(Entry {
                name: name.to_string(),
                role,
                digest: d,
            });
        }
    };
    for t in tokens {
        add(&t.name, &t.role, &t.sha256);
    }
    for d in &digests.nifi {
        add("nifi", "nifi", d);
    }
    for d in &digests.operator {
        add("operator", "operator", d);
    }
    entries
}

impl Authenticator {
    /// The configuration's entries: `auth.tokens`, then `auth.token_digests`.
    pub fn from_config(c: &AuthConfig) -> Self {
        let configured = Arc::new(entries(&c.tokens, &c.token_digests));
        Authenticator {
            current: RwLock::new(configured.clone()),
            configured,
        }
    }

    /// From the next request on, the entries of `file` (first) and of the configuration are in
    /// force; the file's previous entries no longer are.
    pub fn set_file(&self, file: &TokensFile) {
        let mut all = entries(&file.tokens, &file.token_digests);
        all.extend(self.configured.iter().map(|e| Entry {
            name: e.name.clone(),
            role: e.role,
            digest: e.digest,
        }));
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(all);
    }

    fn entries(&self) -> Arc<Vec<Entry>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// 401 without a usable bearer token; 403 when no entry of an allowed role matches.
    pub fn authenticate(&self, headers: &HeaderMap, allowed: &[Role]) -> Result<Caller, ApiError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(ApiError::unauthenticated)?;
        let (scheme, token) = value
            .trim()
            .split_once(' ')
            .ok_or_else(ApiError::unauthenticated)?;
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(ApiError::unauthenticated());
        }
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let entries = self.entries();
        // Compare with every entry so the time spent does not tell which one matched.
        let matches: Vec<bool> = entries
            .iter()
            .map(|e| bool::from(e.digest.ct_eq(&presented)))
            .collect();
        for role in [Role::Nifi, Role::Operator] {
            if !allowed.contains(&role) {
                continue;
            }
            if let Some(e) = entries
                .iter()
                .zip(&matches)
                .find(|(e, m)| **m && e.role == role)
                .map(|(e, _)| e)
            {
                return Ok(Caller {
                    role,
                    identity: e.name.clone(),
                });
            }
        }
        Err(ApiError::forbidden())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn roles_identities_and_refusals() {
        let cfg = AuthConfig {
            tokens: vec![TokenEntry {
                name: "alice".into(),
                role: "operator".into(),
                sha256: sha256_hex("op-secret").to_uppercase(),
            }],
            token_digests: TokenDigests {
                nifi: vec![sha256_hex("nifi-secret")],
                operator: vec![],
            },
            tokens_file: None,
        };
        let a = Authenticator::from_config(&cfg);
        let both = [Role::Nifi, Role::Operator];
        assert_eq!(
            a.authenticate(&headers("Bearer nifi-secret"), &both)
                .unwrap(),
            Caller {
                role: Role::Nifi,
                identity: "nifi".into()
            }
        );
        assert_eq!(
            a.authenticate(&headers("bearer op-secret"), &both)
                .unwrap()
                .identity,
            "alice"
        );
        assert_eq!(
            a.authenticate(&headers("Bearer nifi-secret"), &[Role::Operator])
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            a.authenticate(&headers("Bearer nope"), &both)
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            a.authenticate(&headers("Basic abc"), &both)
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            a.authenticate(&headers("Bearer "), &both)
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            a.authenticate(&HeaderMap::new(), &both).unwrap_err().status,
            401
        );
    }

    #[test]
    fn a_new_tokens_file_replaces_the_previous_one_and_keeps_the_configured_entries() {
        let cfg = AuthConfig {
            tokens: vec![TokenEntry {
                name: "alice".into(),
                role: "operator".into(),
                sha256: sha256_hex("op-secret"),
            }],
            ..Default::default()
        };
        let a = Authenticator::from_config(&cfg);
        let nifi = [Role::Nifi];
        let file = |tokens: &[&str]| TokensFile {
            tokens: tokens
                .iter()
                .map(|t| TokenEntry {
                    name: format!("nifi-{t}"),
                    role: "nifi".into(),
                    sha256: sha256_hex(t),
                })
                .collect(),
            ..Default::default()
        };
        a.set_file(&file(&["old", "new"]));
        for t in ["old", "new"] {
            assert_eq!(
                a.authenticate(&headers(&format!("Bearer {t}")), &nifi)
                    .unwrap()
                    .identity,
                format!("nifi-{t}")
            );
        }
        a.set_file(&file(&["new"]));
        assert_eq!(
            a.authenticate(&headers("Bearer old"), &nifi)
                .unwrap_err()
                .status,
            403
        );
        assert!(a.authenticate(&headers("Bearer new"), &nifi).is_ok());
        assert_eq!(
            a.authenticate(&headers("Bearer op-secret"), &[Role::Operator])
                .unwrap()
                .identity,
            "alice"
        );
    }
}
