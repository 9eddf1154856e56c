//! Logs (CONTRACT §9.2, §10.2): JSON lines on stdout by default, or human-readable text, and/or a
//! size-rotated file (`logging.file`).
use crate::config::{LogFileConfig, LoggingConfig};
use crate::redact::{Scrubbing, Secrets};
use file_rotate::compression::Compression;
use file_rotate::suffix::AppendCount;
use file_rotate::{ContentLimit, FileRotate};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

fn level(l: &str) -> &'static str {
    match l.to_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARNING" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => "info",
    }
}

/// The file of `logging.file` with `{service}` replaced, rotated by size as Python's
/// `RotatingFileHandler` does: `<path>`, then `<path>.1` (newest) … `<path>.<backup_count>`.
fn log_file(
    f: &LogFileConfig,
    service: &str,
) -> Result<std::sync::Mutex<FileRotate<AppendCount>>, String> {
    let path = std::path::absolute(f.path.replace("{service}", service))
        .map_err(|e| format!("invalid configuration at `logging.file.path`: {e}"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "invalid configuration at `logging.file.path`: cannot create {}: {e}",
                dir.display()
            )
        })?;
    }
    // Opened once here so that a path that cannot be written stops the start with its reason
    // (the rotating writer would only panic).
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| {
            format!(
                "invalid configuration at `logging.file.path`: cannot write {}: {e}",
                path.display()
            )
        })?;
    let limit = if f.backup_count == 0 || f.max_bytes == 0 {
        ContentLimit::None
    } else {
        ContentLimit::BytesSurpassed(f.max_bytes as usize)
    };
    Ok(std::sync::Mutex::new(FileRotate::new(
        path,
        AppendCount::new(f.backup_count as usize),
        limit,
        Compression::None,
        None,
    )))
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// A formatting layer writing `format` (json, console or text) to `writer`.
fn output<W>(format: &str, writer: W, ansi: bool) -> BoxedLayer
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        "json" => layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        "console" => layer.with_ansi(ansi).boxed(),
        _ => layer.with_ansi(false).boxed(),
    }
}

/// Installs the global subscriber: stdout (`logging.stdout`, in `logging.format`) and/or the
/// rotated file (`logging.file`, in its own format); `{service}` in the file's path is `service`
/// (`server` for the api-server, `worker` for the operator). `RUST_LOG`, when set, wins over the
/// levels of the configuration. An unwritable log file is an error naming the key. Every line, on
/// either output, is scrubbed of `secrets` as it is written (§9.2).
pub fn init(c: &LoggingConfig, service: &str, secrets: &Secrets) -> Result<(), String> {
    let mut directives = vec![level(&c.level).to_string()];
    for (logger, l) in &c.loggers {
        directives.push(format!("{logger}={}", level(l)));
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives.join(",")));
    let mut layers: Vec<BoxedLayer> = vec![];
    if c.stdout {
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
        layers.push(output(
            &c.format,
            Scrubbing::new(std::io::stdout, secrets.clone()),
            ansi,
        ));
    }
    if let Some(f) = &c.file {
        layers.push(output(
            &f.format,
            Scrubbing::new(log_file(f, service)?, secrets.clone()),
            false,
        ));
    }
    if tracing_subscriber::registry()
        .with(layers)
        .with(filter)
        .try_init()
        .is_err()
    {
        eprintln!("logging already initialised");
    }
    Ok(())
}
