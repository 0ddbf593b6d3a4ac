//! Command line and environment configuration.

use clap::{Parser, ValueEnum};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Human-readable text.
    Plain,
}

/// Rolls Kubernetes workloads when the ConfigMaps or Secrets they depend on change.
///
/// Connects with `KUBECONFIG` (or `~/.kube/config`) outside a cluster and with the pod's service
/// account inside one.
#[derive(Debug, Clone, Parser)]
#[command(name = "reloader", version, about, long_about)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "RELOADER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// Log level or `tracing` filter directive (e.g. `info`, `debug`, `reloader=debug,kube=info`).
    #[arg(long, env = "RELOADER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_plain_and_info() {
        let cli = Cli::try_parse_from(["reloader"]).unwrap();
        assert_eq!(cli.log_format, LogFormat::Plain);
        assert_eq!(cli.log_level, "info");
    }

    #[test]
    fn log_format_json_is_accepted_and_unknown_rejected() {
        let cli = Cli::try_parse_from(["reloader", "--log-format", "json"]).unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        let err = Cli::try_parse_from(["reloader", "--log-format", "xml"]).unwrap_err();
        assert!(err.to_string().contains("xml"), "{err}");
    }
}
