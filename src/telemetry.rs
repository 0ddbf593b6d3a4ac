//! Logging with `tracing`, as JSON or plain text.

use crate::cli::LogFormat;
use crate::{Error, Result};
use tracing_subscriber::EnvFilter;

/// Parses a level or filter directive such as `info` or `reloader=debug,kube=warn`. A bare
/// level name of logrus (stakater/Reloader's logger) means that level: `warning` is `warn`,
/// `fatal` and `panic` are `error`; any other bare word would be read as a target and silence
/// everything else.
pub fn filter(level: &str) -> Result<EnvFilter> {
    let directive = match level.trim().to_ascii_lowercase().as_str() {
        "warning" => "warn".to_string(),
        "fatal" | "panic" => "error".to_string(),
        l @ ("trace" | "debug" | "info" | "warn" | "error" | "off") => l.to_string(),
        _ => level.to_string(),
    };
    EnvFilter::builder()
        .parse(&directive)
        .map_err(|e| Error::LogLevel { level: level.to_string(), reason: e.to_string() })
}

/// Installs the global subscriber. Logs go to stderr so stdout stays free for commands that print.
pub fn init(format: LogFormat, level: &str) -> Result<()> {
    let filter = filter(level)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        LogFormat::Plain => builder.try_init(),
    };
    installed.map_err(|e| Error::Telemetry(e.to_string()))?;
    crate::runtime::containment::install_panic_hook();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_levels_and_directives() {
        for ok in ["info", "debug", "reloader=debug,kube=warn", "warn"] {
            assert!(filter(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn logrus_level_names_are_levels_not_targets() {
        for (name, want) in [
            ("warning", "warn"),
            ("WARNING", "warn"),
            ("fatal", "error"),
            ("panic", "error"),
            ("Info", "info"),
        ] {
            assert_eq!(filter(name).unwrap().to_string(), want, "{name}");
        }
    }

    #[test]
    fn rejects_garbage_with_the_offending_value() {
        let err = filter("reloader=notalevel").unwrap_err();
        assert!(err.to_string().contains("notalevel"), "{err}");
    }
}
