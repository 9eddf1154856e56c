//! Loading the configuration (CONTRACT §10.1) on figment: the YAML file over the defaults (each
//! struct's `Default`), the `LCA_` environment over the file. `LCA_A__B__C` sets `a.b.c`: `__`
//! separates the levels, at any depth, and names are lowercased.
//!
//! The field's type decides how an environment value is read, not a list of keys: a field that
//! takes text (a secret, a URL, a name, a path, a duration, an enum) gets the value exactly as
//! written, so `123456`, `yes` or `null` stay strings there; a field that does not (a number, a
//! boolean, a list, a mapping, or `null` for an optional number) gets the value read as YAML.
//! Every value is offered as text first; one its field refuses as text is read as YAML and the
//! configuration extracted again, so a run takes at most one extraction per variable.
use crate::error::ConfigError;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;

/// The name figment gives the values of the environment (their errors name the variable).
const ENVIRONMENT: &str = "LCA_ environment";

/// One layer of values: the file, or the environment.
struct Layer {
    name: &'static str,
    values: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}

/// An `LCA_` variable: its name, the key it sets, what it holds, and that as YAML once its field
/// refused the text.
struct Var {
    name: String,
    key: Vec<String>,
    text: String,
    yaml: Option<Value>,
}

/// Reads a file's YAML text into the values of its layer: a mapping of sections; empty or
/// `null` is none. `Err(None)` when the document is something else than a mapping.
pub(crate) fn file_values(yaml: &str) -> Result<Dict, Option<serde_yaml::Error>> {
    if yaml.trim().is_empty() {
        return Ok(Dict::new());
    }
    match serde_yaml::from_str::<Value>(yaml).map_err(Some)? {
        Value::Dict(_, dict) => Ok(dict),
        Value::Empty(..) => Ok(Dict::new()),
        _ => Err(None),
    }
}

/// `T` from the file's values under the `LCA_` variables of `env` (other variables and
/// `LCA_CONFIG`, which names the file, are not configuration keys).
pub(crate) fn extract<T: DeserializeOwned>(
    file: Dict,
    env: &[(String, String)],
) -> Result<T, ConfigError> {
    let mut vars: Vec<Var> = env
        .iter()
        .filter(|(name, _)| name != "LCA_CONFIG")
        .filter_map(|(name, text)| {
            let key = name.strip_prefix("LCA_")?;
            Some(Var {
                name: name.clone(),
                key: key.split("__").map(str::to_lowercase).collect(),
                text: text.clone(),
                yaml: None,
            })
        })
        .collect();
    // A variable of a shorter key first, so that `LCA_A__B` lands inside `LCA_A`'s mapping,
    // which must be one.
    vars.sort_by(|a, b| (a.key.len(), &a.name).cmp(&(b.key.len(), &b.name)));
    for i in 0..vars.len() {
        if let Some(inner) = vars[i + 1..]
            .iter()
            .find(|v| v.key.starts_with(&vars[i].key))
        {
            let outer = &vars[i];
            match serde_yaml::from_str(&outer.text) {
                Ok(yaml @ Value::Dict(..)) => vars[i].yaml = Some(yaml),
                _ => {
                    return Err(ConfigError::Env {
                        var: outer.name.clone(),
                        message: format!(
                            "must be a YAML mapping, as {} sets a key in it",
                            inner.name
                        ),
                    });
                }
            }
        }
    }
    let file = Figment::from(Layer {
        name: "the configuration file",
        values: file,
    });
    for _ in 0..=vars.len() {
        let mut values = Dict::new();
        for var in &vars {
            let value = var.yaml.clone().unwrap_or_else(|| var.text.as_str().into());
            set(&mut values, &var.key, value);
        }
        let figment = file.clone().merge(Layer {
            name: ENVIRONMENT,
            values,
        });
        let e = match figment.extract::<T>() {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let key = key_name(&e.path);
        let from_env = e.metadata.as_ref().is_some_and(|m| m.name == ENVIRONMENT);
        // The variable that set the key in error, else one that set a key inside it (`missing
        // field` in a mapping the environment made).
        let at = vars
            .iter()
            .enumerate()
            .filter(|(_, v)| from_env && e.path.starts_with(&v.key))
            .max_by_key(|(_, v)| v.key.len())
            .map(|(i, _)| i);
        let inside = vars
            .iter()
            .position(|v| from_env && v.key.starts_with(&e.path));
        let Some(var) = at.or(inside).map(|i| &mut vars[i]) else {
            return Err(ConfigError::Invalid {
                key,
                message: describe(&e.kind),
            });
        };
        if at.is_none() || var.yaml.is_some() || var.text.is_empty() {
            return Err(ConfigError::Env {
                var: var.name.clone(),
                message: format!("invalid configuration at `{key}`: {}", describe(&e.kind)),
            });
        }
        var.yaml = Some(
            serde_yaml::from_str(&var.text).map_err(|e| ConfigError::Env {
                var: var.name.clone(),
                message: format!("not a YAML value: {e}"),
            })?,
        );
    }
    // Each round returned or read one more variable as YAML: the last one returned.
    Err(ConfigError::Invalid {
        key: "$".into(),
        message: "the environment could not be read (a bug: please report it)".into(),
    })
}

/// Puts `value` at `key` in `values`, making the mappings on the way (in place of whatever else
/// was there).
fn set(values: &mut Dict, key: &[String], value: Value) {
    let Some((last, parents)) = key.split_last() else {
        return;
    };
    let mut dict = values;
    for k in parents {
        let entry = dict.entry(k.clone()).or_insert_with(|| Dict::new().into());
        if !matches!(entry, Value::Dict(..)) {
            *entry = Dict::new().into();
        }
        match entry {
            Value::Dict(_, inner) => dict = inner,
            _ => return, // made a mapping just above
        }
    }
    dict.insert(last.clone(), value);
}

/// figment's message, but serde's wording for an unknown key (figment quotes the list of keys
/// in backquotes as a whole).
fn describe(kind: &figment::error::Kind) -> String {
    match kind {
        figment::error::Kind::UnknownField(key, expected) => format!(
            "unknown field `{key}`, expected one of {}",
            expected
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// `nifi.signing_keys[0].secret` for the path `nifi`, `signing_keys`, `0`, `secret`.
fn key_name(path: &[String]) -> String {
    let mut out = String::new();
    for k in path {
        if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{k}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(k);
        }
    }
    if out.is_empty() { "$".into() } else { out }
}
