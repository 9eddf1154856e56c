//! Logs (CONTRACT §9.2): JSON lines on stdout by default, or human-readable text.
use crate::config::LoggingConfig;
use tracing_subscriber::EnvFilter;

fn level(l: &str) -> &'static str {
    match l.to_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARNING" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => "info",
    }
}

/// Installs the global subscriber; `RUST_LOG`, when set, wins over the configuration.
pub fn init(c: &LoggingConfig) {
    let mut directives = vec![level(&c.level).to_string()];
    for (logger, l) in &c.loggers {
        directives.push(format!("{logger}={}", level(l)));
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives.join(",")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout);
    let result = match c.format.as_str() {
        "json" => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        "console" => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .try_init(),
        _ => builder.with_ansi(false).try_init(),
    };
    if result.is_err() {
        eprintln!("logging already initialised");
    }
    if c.file.is_some() {
        tracing::warn!(
            event = "log_file_unsupported",
            "logging.file is accepted but not written yet; logging to stdout only"
        );
    }
}
