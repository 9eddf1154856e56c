//! `auth`: the token digests the api-server accepts, inline or in a file it reads again.
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One named token of `auth.tokens`: its name shows in the events and logs of what it did.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// 1 to 100 characters of `[A-Za-z0-9._@:/-]`.
    #[schemars(length(min = 1, max = 100), regex(pattern = r"^[A-Za-z0-9._@:/\-]+$"))]
    pub name: String,
    /// `nifi` (the flow's calls) or `operator` (reads and the actions that unstick runs).
    #[schemars(extend("enum" = ["nifi", "operator"]))]
    pub role: String,
    /// The token's SHA-256, 64 hex characters (`load-control-api hash-token`).
    #[schemars(regex(pattern = "^[0-9a-fA-F]{64}$"))]
    pub sha256: String,
}

/// `auth.token_digests`: SHA-256 digests of anonymous tokens, by role.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TokenDigests {
    /// Digests (64 hex characters) of tokens with the `nifi` role.
    pub nifi: Vec<String>,
    /// Digests (64 hex characters) of tokens with the `operator` role.
    pub operator: Vec<String>,
}

/// `auth`: the bearer tokens the API accepts, as SHA-256 digests (never the tokens). With none at
/// all the api-server starts, warns, and refuses every protected call.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Digests of anonymous tokens, by role: keys `nifi` and `operator`.
    pub token_digests: TokenDigests,
    /// Named tokens: `[{name, role, sha256}]`.
    pub tokens: Vec<TokenEntry>,
    /// A file (a mounted Secret) of more token entries, YAML or JSON: the list `tokens` takes, or
    /// a mapping with `tokens` and/or `token_digests`; its entries come before those of `tokens`.
    /// Read at start (unreadable or invalid: the start is refused) and again every
    /// `server.reload_interval`; a new version that cannot be read or checked keeps the entries
    /// in force, logs a WARN naming the file and counts `lca_tokens_reload_failures_total`.
    pub tokens_file: Option<PathBuf>,
}

/// The contents of `auth.tokens_file`: YAML (or JSON), either the list `auth.tokens` takes
/// (`[{name, role, sha256}]`) or a mapping with `tokens` and/or `token_digests`, as in the `auth`
/// section. Only digests, never tokens: `load-control-api hash-token` makes them.
#[derive(Debug, Clone, Default)]
pub struct TokensFile {
    pub tokens: Vec<TokenEntry>,
    pub token_digests: TokenDigests,
}

impl TokensFile {
    /// Parses and checks the file's bytes. The error names the place (entry index, line and
    /// column) but never quotes the file's text, which could hold a token pasted by mistake.
    pub fn parse(bytes: &[u8]) -> Result<TokensFile, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Sections {
            #[serde(default)]
            tokens: Vec<TokenEntry>,
            #[serde(default)]
            token_digests: TokenDigests,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            List(Vec<TokenEntry>),
            Sections(Sections),
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
        let form: Option<Form> = serde_yaml::from_str(text).map_err(|e| match e.location() {
            Some(l) => format!(
                "is not a list of {{name, role, sha256}} nor a mapping of tokens/token_digests (YAML error at line {}, column {})",
                l.line(),
                l.column()
            ),
            None => "is not a list of {name, role, sha256} nor a mapping of tokens/token_digests"
                .to_string(),
        })?;
        let file = match form {
            // An empty file: no entries.
            None => TokensFile::default(),
            Some(Form::List(tokens)) => TokensFile {
                tokens,
                ..Default::default()
            },
            Some(Form::Sections(s)) => TokensFile {
                tokens: s.tokens,
                token_digests: s.token_digests,
            },
        };
        check_token_entries(&file.tokens, &file.token_digests, "").map_err(|e| match e {
            ConfigError::Invalid { key, message } => format!("{key}: {message}"),
            other => other.to_string(),
        })?;
        Ok(file)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
            && self.token_digests.nifi.is_empty()
            && self.token_digests.operator.is_empty()
    }
}

/// The checks of §10.4 on token entries; keys are named under `prefix` (`auth.` in the
/// configuration, nothing in a tokens file). Messages never quote a digest.
pub(super) fn check_token_entries(
    tokens: &[TokenEntry],
    digests: &TokenDigests,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (i, t) in tokens.iter().enumerate() {
        let key = format!("{prefix}tokens[{i}]");
        if t.role != "nifi" && t.role != "operator" {
            return Err(invalid(&format!("{key}.role"), "is not nifi or operator"));
        }
        if !is_digest(&t.sha256) {
            return Err(invalid(
                &format!("{key}.sha256"),
                "must be 64 hex characters (SHA-256 of the token)",
            ));
        }
        let name_ok = (1..=100).contains(&t.name.chars().count())
            && t.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._@:/-".contains(c));
        if !name_ok {
            return Err(invalid(
                &format!("{key}.name"),
                "must be 1..100 characters of [A-Za-z0-9._@:/-]",
            ));
        }
    }
    for (role, list) in [("nifi", &digests.nifi), ("operator", &digests.operator)] {
        for (i, d) in list.iter().enumerate() {
            if !is_digest(d) {
                return Err(invalid(
                    &format!("{prefix}token_digests.{role}[{i}]"),
                    "must be 64 hex characters",
                ));
            }
        }
    }
    Ok(())
}

fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}
