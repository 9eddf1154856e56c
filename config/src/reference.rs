//! The configuration reference, generated from the configuration types: their doc comments,
//! defaults and limits (`Config`'s JSON schema). `docs/configuration.md` and
//! `config/config.schema.json` are what this writes (`cargo run -p load-control-config --bin
//! config-reference`); a test fails when either is stale, and the chart's values schema takes its
//! `config.*` part from the JSON file (`scripts/chart-readme`).
use crate::config::Config;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// `Config`'s JSON schema with every subschema inlined (no `$ref`), so another schema can embed
/// any part of it.
pub fn schema() -> Value {
    let generator = SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    generator.into_root_schema_for::<Config>().to_value()
}

/// The committed JSON file: the schema, pretty-printed, with a final newline.
pub fn schema_json() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).expect("a JSON value prints");
    text.push('\n');
    text
}

/// One key of the file, as the reference lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// `section.key`, `section.key.sub`, or `section.list[].field` for the fields of list items.
    pub path: String,
    /// What it takes: `string`, `integer`, `duration`, `FAIL \| REISSUE`, ...
    pub kind: String,
    /// The default as YAML would spell it, or `none`; `—` where the key has to be given.
    pub default: String,
    /// `LCA_SECTION__KEY`, or none for the fields of list items.
    pub env: Option<String>,
    pub description: String,
}

/// Every key of the file, sections and keys in alphabetical order (the schema's).
pub fn keys() -> Vec<Key> {
    let schema = schema();
    let mut out = Vec::new();
    for (section, sub) in properties(&schema) {
        walk(&section, sub, &mut out);
    }
    out
}

fn properties(schema: &Value) -> Vec<(String, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v)).collect())
        .unwrap_or_default()
}

/// The schema without its `null` alternative (an `Option`).
fn present(schema: &Value) -> &Value {
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = schema.get(key).and_then(Value::as_array) {
            let some: Vec<&Value> = alts.iter().filter(|a| a["type"] != "null").collect();
            if some.len() == 1 {
                return some[0];
            }
        }
    }
    schema
}

fn is_object_with_keys(schema: &Value) -> bool {
    type_names(schema).iter().any(|t| t == "object") && schema.get("properties").is_some()
}

fn walk(path: &str, schema: &Value, out: &mut Vec<Key>) {
    let inner = present(schema);
    if is_object_with_keys(inner) && !path.contains("[]") && path.matches('.').count() >= 1 {
        // A nested mapping (`logging.file`): a row for it, then its keys.
        out.push(row(path, schema));
        for (key, sub) in properties(inner) {
            walk(&format!("{path}.{key}"), sub, out);
        }
    } else if is_object_with_keys(inner) {
        // A section: its keys.
        for (key, sub) in properties(inner) {
            walk(&format!("{path}.{key}"), sub, out);
        }
    } else if let Some(items) = inner
        .get("items")
        .filter(|i| is_object_with_keys(present(i)))
    {
        out.push(row(path, schema));
        for (key, sub) in properties(present(items)) {
            walk(&format!("{path}[].{key}"), sub, out);
        }
    } else {
        out.push(row(path, schema));
    }
}

fn row(path: &str, schema: &Value) -> Key {
    let env = (!path.contains("[]")).then(|| {
        format!(
            "LCA_{}",
            path.split('.')
                .map(str::to_uppercase)
                .collect::<Vec<_>>()
                .join("__")
        )
    });
    let inner = present(schema);
    let description = schema
        .get("description")
        .or_else(|| inner.get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .replace('\n', " ");
    let nullable = !std::ptr::eq(inner, schema) || type_names(schema).contains(&"null".into());
    let default = match schema.get("default") {
        Some(Value::Null) => "none".into(),
        Some(v) => yaml_inline(v),
        None if nullable => "none".into(),
        None => "—".into(),
    };
    Key {
        path: path.into(),
        kind: kind(inner),
        default,
        env,
        description,
    }
}

fn type_names(schema: &Value) -> Vec<String> {
    match &schema["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}

fn kind(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    if schema.get("pattern").and_then(Value::as_str) == Some(crate::config::DURATION_PATTERN) {
        return "duration".into();
    }
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        let shapes: Vec<String> = alts
            .iter()
            .filter(|a| a["type"] != "null")
            .map(|a| match (a.get("const"), a["type"].as_str()) {
                (Some(c), _) => c.as_str().unwrap_or_default().to_string(),
                (None, Some("object")) => format!(
                    "{{{}}}",
                    properties(a)
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (None, Some(t)) => t.to_string(),
                (None, None) => "value".into(),
            })
            .collect();
        return shapes.join(" \\| ");
    }
    let names: Vec<String> = type_names(schema)
        .into_iter()
        .filter(|t| t != "null")
        .collect();
    match names.first().map(String::as_str) {
        Some("array") => {
            let item = schema
                .get("items")
                .map(present)
                .map_or("value".into(), kind);
            format!("list of {item}")
        }
        Some("object") => match schema.get("additionalProperties").map(present) {
            Some(v) if v.is_object() => format!("map of {}", kind(v)),
            _ => "mapping".into(),
        },
        Some(t) => t.to_string(),
        None => "any".into(),
    }
}

/// A default as one would write it in the YAML file.
fn yaml_inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::String(s) if s.is_empty() => "\"\"".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(yaml_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{k}: {}", yaml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// `docs/configuration.md`.
pub fn markdown() -> String {
    let schema = schema();
    let mut md = String::from(
        "<!-- Generated by `cargo run -p load-control-config --bin config-reference` from the \
         configuration types (config/src/config/); do not edit. -->\n\
         # Configuration reference\n\n\
         `load-control-api`, `load-control-operator` and `loadctl` read one YAML file: `--config \
         PATH`, else `$LCA_CONFIG`, else `./config/config.yaml` (the image sets \
         `LCA_CONFIG=/etc/load-control/config.yaml`; `loadctl` uses only `monitor` and starts \
         without a file). Precedence: command-line flags, then the environment, then the file, \
         then these defaults.\n\n\
         * **Environment.** Any key can be set by `LCA_<SECTION>__<KEY>` (`__` between levels, \
         at any depth: `LCA_LOGGING__FILE__PATH`). A key that takes text gets the variable's \
         value exactly as written; any other key reads it as YAML (`9090`, `false`, `null`, \
         `[{id: k1, secret: s}]`). `DATABASE_URL` supplies `database.url` when nothing else \
         does.\n\
         * **Durations** are ISO-8601 (`PT90M`, `P3D`), a number of seconds, or \
         `<n>s|m|h|d` (`90m`, `2h`, `3d`).\n\
         * **Refusals.** An unknown section or key, or a value of the wrong type or out of \
         range, refuses to start with a message naming the key.\n\
         * **Per job.** A LoadJob's `spec` overrides the keys marked \"Per job\" for its runs.\n\
         * **Editors.** [`config/config.schema.json`](../config/config.schema.json) is the same \
         reference as a JSON schema: `# yaml-language-server: $schema=<path to it>` on the first \
         line of a configuration file checks it as you type.\n\n\
         Other keys are the chart's to set in Kubernetes (charts/load-control/README.md names \
         the values that own `server.port`, `database.url`, `auth.*` and the secrets).\n",
    );
    let keys = keys();
    for (section, sub) in properties(&schema) {
        md.push_str(&format!("\n## `{section}`\n\n"));
        let about = present(sub)
            .get("description")
            .or_else(|| sub.get("description"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .replace('\n', " ");
        // The types' comments open with the section's name, which the heading already says.
        let about = about
            .strip_prefix(&format!("`{section}`: "))
            .map(|rest| {
                let mut c = rest.chars();
                c.next()
                    .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                    .unwrap_or_default()
            })
            .unwrap_or(about);
        if !about.is_empty() {
            md.push_str(&about);
            md.push_str("\n\n");
        }
        md.push_str(
            "| key | takes | default | environment | what it does |\n|---|---|---|---|---|\n",
        );
        for key in keys
            .iter()
            .filter(|k| k.path == section || k.path.starts_with(&format!("{section}.")))
        {
            md.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                key.path,
                key.kind,
                cell_code(&key.default),
                key.env.as_deref().map_or("—".into(), |e| format!("`{e}`")),
                key.description.replace('|', "\\|"),
            ));
        }
    }
    md
}

fn cell_code(text: &str) -> String {
    if text == "—" || text == "none" {
        text.into()
    } else {
        format!("`{}`", text.replace('|', "\\|"))
    }
}
