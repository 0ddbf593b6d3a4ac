//! The library's error type. `anyhow` is kept to `main`.

/// Everything that can go wrong inside the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable Kubernetes client configuration (kubeconfig or in-cluster).
    #[error("cannot load Kubernetes client configuration: {0}")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// The API server did not answer the first request.
    #[error("cannot reach the Kubernetes API server at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: kube::Error,
    },

    /// A call to the Kubernetes API failed.
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),

    /// The log level or filter string does not parse.
    #[error("invalid log level {level:?}: {reason}")]
    LogLevel { level: String, reason: String },

    /// The logging subsystem could not be installed.
    #[error("cannot initialise logging: {0}")]
    Telemetry(String),

    /// The HTTP endpoint could not bind its address.
    #[error("cannot serve metrics on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },

    /// A setting that cannot be honoured safely (named in the message).
    #[error("{0}")]
    Settings(String),

    /// Leader election is misconfigured or its Lease cannot be set up.
    #[error(transparent)]
    Leader(#[from] crate::kube::leader::LeaderError),

    /// The admission webhook is misconfigured or cannot start.
    #[error(transparent)]
    Webhook(#[from] crate::serve::admission::WebhookError),

    /// `--hash-mode hmac-sha256` and the key cannot be loaded.
    #[error("--hash-mode hmac-sha256 needs the hash key: {0}")]
    HashKey(#[from] crate::kube::hash_key::KeyError),

    /// Installing a signal handler failed.
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
