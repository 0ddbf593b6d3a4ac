//! Command line and environment configuration.
//!
//! The only module that knows clap: it turns flags into plain values and into the settings of
//! the layers below the runtime (`kube::leader::LeaderConfig`, `report::alerts::AlertSettings`,
//! the webhook's `serve::admission::Scope`). It imports nothing of `runtime/`: the wiring,
//! `runtime/operator.rs`, reads the parsed flags and builds the engine's `EngineConfig` from
//! them (`operator::engine_config`), so the dependency goes one way, runtime → cli, and the
//! engine's settings stay the runtime's own type without the runtime knowing clap.

use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{ArgAction, Parser, ValueEnum};

use crate::model::annotations::AnnotationKeys;
use crate::model::strategy::Strategy;
use crate::model::workload::HashMode;
use crate::model::workload::WorkloadKind;
use crate::serve::admission::{CertSource, Endpoint, Scope, WebhookError, parse_labels, url_host};

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

    /// Accepted for compatibility with stakater/Reloader and ignored: profiling is never
    /// served (a warning says so at start).
    #[arg(long, env = "RELOADER_ENABLE_PPROF", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_pprof: bool,

    /// Accepted for compatibility with stakater/Reloader and ignored (see `--enable-pprof`).
    #[arg(long, env = "RELOADER_PPROF_ADDR")]
    pub pprof_addr: Option<String>,

    /// Log level or `tracing` filter directive (e.g. `info`, `debug`, `reloader=debug,kube=info`).
    /// stakater/Reloader's level names work too (`warning`, `fatal`, `panic`).
    #[arg(long, env = "RELOADER_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Address of the HTTP endpoint (`/metrics`, `/live`, `/readyz`); `:9090` means every
    /// interface, port 9090.
    #[arg(long, env = "RELOADER_METRICS_ADDR", value_parser = parse_listen_addr, default_value = ":9090")]
    pub metrics_addr: std::net::SocketAddr,

    /// Requests per second this client sends to the API server at most (watches count once,
    /// when they start); Events take what the other requests leave. 0 turns the limit off.
    /// Leader-election requests are not limited.
    #[arg(long, env = "RELOADER_KUBE_API_QPS", default_value_t = 100.0, value_parser = parse_rate)]
    pub kube_api_qps: f64,

    /// Requests that may go at once before `--kube-api-qps` paces them.
    #[arg(long, env = "RELOADER_KUBE_API_BURST", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_api_burst: u32,

    #[command(flatten)]
    pub reload: ReloadArgs,

    #[command(flatten)]
    pub ha: HaArgs,

    #[command(flatten)]
    pub alerts: AlertArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// One-off commands; without one, the operator runs.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the ReloadPolicy CustomResourceDefinition (YAML) and exit.
    Crd,
    /// Why a workload did (not) roll and what the operator does next (read-only; exit 0 up to
    /// date, 1 error, 2 a reload is next, 3 held by a gate). Also `kubectl reloader explain`.
    Explain(Box<ExplainArgs>),
}

/// `reloader explain <kind>/<name>`: the operator's flags are given here, with the operator's
/// names, or read from its Deployment with `--operator-deployment`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// The workload (`deploy/web`, `statefulset/db`, `cronjobs/nightly`, ...) or a
    /// ReloadPolicy (`rp/name`: each target's gates, and who else its sources roll).
    pub target: String,

    /// Its namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long = "namespace")]
    pub namespace: Option<String>,

    /// `text` for people, `json` for tools (a stable schema).
    #[arg(short = 'o', long = "output", value_parser = ["text", "json"], default_value = "text")]
    pub output: String,

    /// Read the operator's flags from the args of this Deployment (`namespace/name`) instead
    /// of this command line (and its ServiceAccount, when its pod template names one).
    #[arg(long)]
    pub operator_deployment: Option<String>,

    /// The operator's ServiceAccount (`namespace/name`): its rights are reviewed
    /// (SubjectAccessReviews) to say how it follows the workload's kind (watched, listed on
    /// change, not at all). Without it or `--operator-deployment`, kinds are taken as watched.
    #[arg(long)]
    pub operator_account: Option<String>,

    #[command(flatten)]
    pub reload: ReloadArgs,
}

/// The annotation-mode flags of an operator started with `args` (its container's args), parsed
/// as the operator parses them.
pub fn reload_args_of(args: &[String]) -> Result<ReloadArgs, String> {
    let argv = std::iter::once("reloader".to_string()).chain(args.iter().cloned());
    Cli::try_parse_from(argv).map(|cli| cli.reload).map_err(|e| e.to_string())
}

/// Annotation mode: what is watched and how workloads are reloaded (stakater/Reloader's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ReloadArgs {
    /// Reload every workload that references a changed ConfigMap/Secret, annotated or not
    /// (`reloader.stakater.com/auto: "false"` still opts out).
    #[arg(long, env = "RELOADER_AUTO_RELOAD_ALL", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub auto_reload_all: bool,

    /// How a reload is triggered: `env-vars` (STAKATER_* variable), `annotations`
    /// (`reloader.stakater.com/last-reloaded-from`) or `restart` (`kubectl.kubernetes.io/restartedAt`).
    #[arg(long, env = "RELOADER_RELOAD_STRATEGY", value_parser = one_of::<Strategy>(Strategy::ALL.map(Strategy::as_str)), default_value_t = Strategy::EnvVars)]
    pub reload_strategy: Strategy,

    /// Also reload when a referenced ConfigMap/Secret is created.
    #[arg(long, env = "RELOADER_RELOAD_ON_CREATE", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub reload_on_create: bool,

    /// Also reload when a referenced ConfigMap/Secret is deleted.
    #[arg(long, env = "RELOADER_RELOAD_ON_DELETE", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub reload_on_delete: bool,

    /// With `--reload-on-create`: at start, treat existing sources as created, so workloads
    /// with no stored hash for them are reloaded (workloads already current never are).
    #[arg(long, env = "RELOADER_SYNC_AFTER_RESTART", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub sync_after_restart: bool,

    /// Also reload Argo Rollouts (`argoproj.io/v1alpha1`); their API is looked up at start and
    /// then every `--api-discovery-interval` until it exists.
    #[arg(long = "is-Argo-Rollouts", env = "RELOADER_IS_ARGO_ROLLOUTS", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub is_argo_rollouts: bool,

    /// Also reload on SecretProviderClass rotations reported by the Secrets Store CSI driver
    /// (`secrets-store.csi.x-k8s.io/v1` SecretProviderClassPodStatuses; looked up like Rollouts).
    #[arg(long, env = "RELOADER_ENABLE_CSI_INTEGRATION", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_csi_integration: bool,

    /// How often to look for APIs that may appear later (Argo Rollouts, OpenShift
    /// DeploymentConfigs).
    #[arg(long, env = "RELOADER_API_DISCOVERY_INTERVAL", value_parser = parse_period, default_value = "30s")]
    pub api_discovery_interval: Duration,

    /// Do not watch this kind of source: `configmaps` or `secrets`.
    #[arg(long, env = "RELOADER_RESOURCES_TO_IGNORE", value_parser = ["configmaps", "secrets"])]
    pub resources_to_ignore: Option<String>,

    /// Workload kinds never reloaded, comma separated (`jobs,cronjobs`).
    #[arg(long, env = "RELOADER_IGNORED_WORKLOAD_TYPES", value_delimiter = ',')]
    pub ignored_workload_types: Vec<String>,

    /// Watch only these namespaces (comma separated); empty means the whole cluster.
    #[arg(long, env = "RELOADER_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// Watch a single namespace (set from the pod's namespace for namespaced installs).
    #[arg(long = "watch-namespace", env = "KUBERNETES_NAMESPACE")]
    pub kubernetes_namespace: Option<String>,

    /// Namespaces whose sources and workloads are ignored (comma separated).
    #[arg(long, env = "RELOADER_NAMESPACES_TO_IGNORE", value_delimiter = ',')]
    pub namespaces_to_ignore: Vec<String>,

    /// Only namespaces whose labels match are served: a label selector (comma = AND), where the
    /// legacy forms `key:value` and `key:*` (key exists) are accepted too. Repeatable, and
    /// quotes around terms are dropped, as stakater/Reloader reads it (a CSV string list). An
    /// invalid selector stops the operator at start.
    #[arg(long, env = "RELOADER_NAMESPACE_SELECTOR", action = ArgAction::Append)]
    pub namespace_selector: Vec<String>,

    /// Only ConfigMaps/Secrets matching this label selector are watched (server-side).
    #[arg(long, env = "RELOADER_RESOURCE_LABEL_SELECTOR")]
    pub resource_label_selector: Option<String>,

    /// Instead of reloading, POST each reload's details (workload, sources, hashes) as JSON to
    /// this URL; the workload is not changed.
    #[arg(long, env = "RELOADER_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Changes arriving within this window are coalesced into one rollout per workload
    /// (`0s` turns debouncing off).
    #[arg(long, env = "RELOADER_DEBOUNCE", value_parser = parse_duration, default_value = "1s")]
    pub debounce: Duration,

    /// A workload whose sources keep changing is reloaded at least this often.
    #[arg(long, env = "RELOADER_DEBOUNCE_MAX_WAIT", value_parser = parse_duration, default_value = "10s")]
    pub debounce_max_wait: Duration,

    /// A workload is rolled at most once per this interval; a later change waits for it and is
    /// then applied with the sources' state of that moment. `0s` turns it off.
    #[arg(long, env = "RELOADER_MIN_ROLLOUT_INTERVAL", value_parser = parse_duration, default_value = "5s")]
    pub min_rollout_interval: Duration,

    /// Roll every change now, whatever the reload windows of policies (`spec.windows`) and
    /// workloads (`reloader.rs/reload-windows`) say: an emergency switch.
    #[arg(long, env = "RELOADER_IGNORE_WINDOWS", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub ignore_windows: bool,

    /// How long a StatefulSet or DaemonSet rollout started by a reload may take before it is
    /// reported failed (Deployments and Argo Rollouts have their own `progressDeadlineSeconds`).
    #[arg(long, env = "RELOADER_ROLLOUT_TIMEOUT", value_parser = parse_duration, default_value = "10m")]
    pub rollout_timeout: Duration,

    /// Pods the targets of kind `Pod` of one ReloadPolicy may select; past it none is rolled.
    /// Hidden: the bound is `model::limits::MAX_POD_TARGET_PODS`; tests lower it.
    #[arg(long, hide = true, default_value_t = crate::model::limits::MAX_POD_TARGET_PODS,
          value_parser = clap::value_parser!(u64).range(1..=crate::model::limits::MAX_POD_TARGET_PODS as u64).map(|n| usize::try_from(n).unwrap_or(1)))]
    pub pod_target_max_pods: usize,

    /// Rollouts a second across all workloads, after `--rollout-burst`; more wait their turn.
    /// 0 turns the budget off.
    #[arg(long, env = "RELOADER_MAX_ROLLOUTS_PER_SECOND", default_value_t = 20.0, value_parser = parse_rate)]
    pub max_rollouts_per_second: f64,

    /// Rollouts that may go at once before `--max-rollouts-per-second` paces them.
    #[arg(long, env = "RELOADER_ROLLOUT_BURST", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub rollout_burst: u32,

    /// Every workload is re-checked against its sources this often (level-triggered resync);
    /// `0` turns the periodic resync off.
    #[arg(long, env = "RELOADER_RESYNC_PERIOD", value_parser = parse_duration, default_value = "10m")]
    pub resync_period: Duration,

    /// Also count reloads per namespace (`reloader_reload_executed_total_by_namespace`);
    /// stakater/Reloader's `METRICS_COUNT_BY_NAMESPACE=enabled`.
    #[arg(long, env = "METRICS_COUNT_BY_NAMESPACE", value_parser = parse_enabled,
          num_args = 0..=1, require_equals = true, default_missing_value = "enabled",
          default_value = "disabled", action = ArgAction::Set)]
    pub metrics_count_by_namespace: bool,

    /// Key-precise references: when a workload consumes only some keys of a ConfigMap/Secret
    /// (`valueFrom.configMapKeyRef`/`secretKeyRef`, volume or projected `items`) and never the
    /// whole object, changes to its other keys roll nothing. Off by default: the variable then
    /// holds the full hash, exactly as stakater/Reloader writes it.
    #[arg(long, env = "RELOADER_KEY_PRECISE_REFERENCES", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub key_precise_references: bool,

    /// How annotation mode writes hashes: `sha1` (default) writes the SHA-1 of the data, as
    /// stakater/Reloader does, so migrating rolls nothing; `hmac-sha256` writes HMAC-SHA-256 of
    /// that SHA-1 under the operator's key, so nobody who can read a workload can test guesses
    /// of a Secret's value offline (switching rolls every selected workload once).
    #[arg(long, env = "RELOADER_HASH_MODE", value_parser = one_of::<HashMode>(HashMode::ALL.map(HashMode::as_str)), default_value_t = HashMode::Sha1)]
    pub hash_mode: HashMode,

    /// The Secret holding the key of keyed hashes (created with 32 random bytes when absent).
    #[arg(long, env = "RELOADER_HASH_KEY_SECRET", default_value = "reloader-hash-key")]
    pub hash_key_secret: String,

    /// The namespace of that Secret (default: POD_NAMESPACE, else `default`).
    #[arg(long, env = "RELOADER_HASH_KEY_NAMESPACE")]
    pub hash_key_namespace: Option<String>,

    /// Workloads reconciled in parallel.
    #[arg(long, env = "RELOADER_WORKERS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,

    /// Annotation that enables reloading on any referenced source.
    #[arg(long, default_value = "reloader.stakater.com/auto")]
    pub auto_annotation: String,
    /// Annotation that enables reloading on referenced ConfigMaps.
    #[arg(long, default_value = "configmap.reloader.stakater.com/auto")]
    pub configmap_auto_annotation: String,
    /// Annotation that enables reloading on referenced Secrets.
    #[arg(long, default_value = "secret.reloader.stakater.com/auto")]
    pub secret_auto_annotation: String,
    /// Annotation that lists ConfigMaps (anchored regexes) that reload the workload.
    #[arg(long, default_value = "configmap.reloader.stakater.com/reload")]
    pub configmap_annotation: String,
    /// Annotation that lists Secrets (anchored regexes) that reload the workload.
    #[arg(long, default_value = "secret.reloader.stakater.com/reload")]
    pub secret_annotation: String,
    /// Workload annotation that enables search mode (`"true"`).
    #[arg(long, default_value = "reloader.stakater.com/search")]
    pub auto_search_annotation: String,
    /// Source annotation that matches search-mode workloads (`"true"`).
    #[arg(long, default_value = "reloader.stakater.com/match")]
    pub search_match_annotation: String,
    /// Source annotation that excludes it from every reload (`"true"`).
    #[arg(long, default_value = "reloader.stakater.com/ignore")]
    pub ignore_annotation: String,
    /// Deployment annotation with the pause period after a reload.
    #[arg(long, default_value = "deployment.reloader.stakater.com/pause-period")]
    pub pause_deployment_annotation: String,
    /// Deployment annotation recording when the operator paused it.
    #[arg(long, default_value = "deployment.reloader.stakater.com/paused-at")]
    pub pause_deployment_time_annotation: String,
}

/// High availability: several replicas, one leader on a Lease, warm standbys.
#[derive(Debug, Clone, clap::Args)]
pub struct HaArgs {
    /// Run as one of several replicas: only the holder of the Lease changes anything; the
    /// others keep their caches warm and take over when it goes. Needs `POD_NAME` and
    /// `POD_NAMESPACE`.
    #[arg(long, env = "RELOADER_ENABLE_HA", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_ha: bool,

    /// Name of the Lease (in `POD_NAMESPACE`).
    #[arg(long, env = "RELOADER_HA_LEASE_NAME", default_value = "stakater-reloader-lock")]
    pub ha_lease_name: String,

    /// How long the Lease holds after its last renewal; a standby takes over at most this long
    /// after the leader goes silent. Whole seconds. (`--leader-election-lease-duration` is
    /// stakater/Reloader's name for it.)
    #[arg(long, alias = "leader-election-lease-duration", env = "RELOADER_HA_LEASE_DURATION",
          value_parser = parse_period, default_value = "15s")]
    pub ha_lease_duration: Duration,

    /// The leader renews the Lease this long after its last renewal. Whole seconds, shorter
    /// than the lease duration. (`--leader-election-renew-deadline` is stakater/Reloader's name
    /// for it.)
    #[arg(long, alias = "leader-election-renew-deadline", env = "RELOADER_HA_RENEW_DEADLINE",
          value_parser = parse_period, default_value = "10s")]
    pub ha_renew_deadline: Duration,

    /// How often the Lease is read when the identity may only get and update it
    /// (stakater/Reloader's RBAC; default 2s, at most half the time between the renew deadline
    /// and the lease's end). Where it may watch the Lease, standbys try the moment it runs out
    /// and this is not used.
    #[arg(long = "leader-election-retry-period", value_parser = parse_period)]
    pub leader_election_retry_period: Option<Duration>,

    /// This replica's identity in the Lease (the pod name, from the downward API).
    #[arg(long, env = "POD_NAME", hide_env_values = true)]
    pub pod_name: Option<String>,

    /// Namespace of the Lease (the pod's namespace, from the downward API).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
}

impl HaArgs {
    /// The election settings, `None` without `--enable-ha`.
    pub fn leader_config(&self) -> crate::Result<Option<crate::kube::leader::LeaderConfig>> {
        if !self.enable_ha {
            return Ok(None);
        }
        let required = |v: &Option<String>, name: &str| {
            v.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                crate::kube::leader::LeaderError(format!(
                    "--enable-ha needs {name} (set it from the downward API)"
                ))
            })
        };
        let config = crate::kube::leader::LeaderConfig {
            lease_name: self.ha_lease_name.clone(),
            namespace: required(&self.pod_namespace, "POD_NAMESPACE")?,
            identity: required(&self.pod_name, "POD_NAME")?,
            lease_duration: self.ha_lease_duration,
            renew_deadline: self.ha_renew_deadline,
        };
        config.validate()?;
        Ok(Some(config))
    }
}

/// The mutating admission webhook that stamps current source hashes into workloads as they are
/// written (GitOps-safe mode).
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the admission webhook: Deployments, StatefulSets, DaemonSets (and Rollouts) are
    /// created and updated with the current hashes of their sources, so nothing rolls after.
    #[arg(long, env = "RELOADER_ENABLE_WEBHOOK", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub enable_webhook: bool,

    /// Address of the webhook's HTTPS endpoint (`:9443` = every interface).
    #[arg(long, env = "RELOADER_WEBHOOK_ADDR", value_parser = parse_listen_addr, default_value = ":9443")]
    pub webhook_addr: std::net::SocketAddr,

    /// Read the serving certificate from `tls.crt`/`tls.key` here (e.g. a cert-manager Secret);
    /// the operator then writes neither the certificate Secret nor the webhook configuration.
    #[arg(long, env = "RELOADER_WEBHOOK_CERT_DIR", value_name = "PATH")]
    pub webhook_cert_dir: Option<std::path::PathBuf>,

    /// The Secret (in `POD_NAMESPACE`) where the operator keeps its CA and serving certificate.
    #[arg(long, env = "RELOADER_WEBHOOK_SECRET_NAME", default_value = "reloader-webhook-tls")]
    pub webhook_secret_name: String,

    /// The MutatingWebhookConfiguration the operator applies (server-side apply, field manager
    /// `reloader.rs/webhook`).
    #[arg(long, env = "RELOADER_WEBHOOK_CONFIGURATION_NAME", default_value = "reloader-rs")]
    pub webhook_configuration_name: String,

    /// The Service (in `POD_NAMESPACE`) the API server calls the webhook through.
    #[arg(long, env = "RELOADER_WEBHOOK_SERVICE", conflicts_with = "webhook_client_url")]
    pub webhook_service: Option<String>,

    /// The Service's port.
    #[arg(long, env = "RELOADER_WEBHOOK_SERVICE_PORT", default_value_t = 9443)]
    pub webhook_service_port: u16,

    /// Call the webhook at this URL instead of a Service (`https://host:port/mutate`).
    #[arg(long, env = "RELOADER_WEBHOOK_CLIENT_URL")]
    pub webhook_client_url: Option<String>,

    /// Only workloads with these labels are sent to the webhook (`key=value`, comma = AND;
    /// empty: every workload in the served namespaces).
    #[arg(
        long,
        env = "RELOADER_WEBHOOK_OBJECT_SELECTOR",
        default_value = "reloader.rs/webhook=enabled"
    )]
    pub webhook_object_selector: String,

    /// Authenticate the webhook's callers: the TLS handshake asks for a client certificate and
    /// accepts only one signed by this CA (PEM), the API server's webhook client certificate
    /// (its AdmissionConfiguration's kubeconfig). Without it no caller is authenticated, and
    /// answers carry no patch (see `--webhook-allow-unauthenticated`).
    #[arg(long, env = "RELOADER_WEBHOOK_CLIENT_CA", value_name = "PATH")]
    pub webhook_client_ca: Option<std::path::PathBuf>,

    /// Stamp workloads for callers without a verified client certificate too. Each answer
    /// carries the hashes of the sources the sent object references, so any pod that reaches
    /// the port can then learn the hash of any Secret it can name: only with a NetworkPolicy
    /// that admits nothing but the API server, or with `--hash-mode hmac-sha256`.
    #[arg(long, env = "RELOADER_WEBHOOK_ALLOW_UNAUTHENTICATED", num_args = 0..=1,
          value_parser = parse_go_bool, default_missing_value = "true", default_value_t = false,
          action = ArgAction::Set)]
    pub webhook_allow_unauthenticated: bool,
}

/// Alerts on reload: a chat message per reloaded source (stakater/Reloader's `ALERT_*`
/// settings, same variable names).
#[derive(Debug, Clone, clap::Args)]
pub struct AlertArgs {
    /// Send an alert to `--alert-webhook-url` for every reload.
    #[arg(long, env = "ALERT_ON_RELOAD", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub alert_on_reload: bool,

    /// Where alerts are POSTed. Usually embeds a token: prefer `--alert-webhook-url-file` or an
    /// env var from a Secret.
    #[arg(long, env = "ALERT_WEBHOOK_URL", conflicts_with = "alert_webhook_url_file")]
    pub alert_webhook_url: Option<String>,

    /// Allow `http://` for `--alert-webhook-url` and `--webhook-url`. Refused by default: alert
    /// URLs carry tokens and `--webhook-url` payloads carry hashes, neither meant for the wire
    /// in clear. Redirects are never followed either way.
    #[arg(long, env = "RELOADER_ALLOW_PLAIN_HTTP", num_args = 0..=1, value_parser = parse_go_bool,
          default_missing_value = "true", default_value_t = false, action = ArgAction::Set)]
    pub allow_plain_http: bool,

    /// Read the alert webhook URL from this file (a mounted Secret key), trimmed.
    #[arg(long, env = "ALERT_WEBHOOK_URL_FILE", value_name = "PATH")]
    pub alert_webhook_url_file: Option<std::path::PathBuf>,

    /// Message format: `slack`, `teams`, `gchat`; anything else sends plain text.
    #[arg(long, env = "ALERT_SINK", default_value = "raw")]
    pub alert_sink: String,

    /// HTTP proxy for the alert requests (e.g. `http://proxy:3128`).
    #[arg(long, env = "ALERT_WEBHOOK_PROXY")]
    pub alert_webhook_proxy: Option<String>,

    /// Text put before every alert (`<info> : <message>`), e.g. the cluster's name.
    #[arg(long, env = "ALERT_ADDITIONAL_INFO")]
    pub alert_additional_info: Option<String>,
}

impl ReloadArgs {
    /// The workload kinds to reload: all but `--ignored-workload-types`, Argo Rollouts with
    /// `--is-argo-rollouts`.
    pub fn kinds(&self) -> Vec<WorkloadKind> {
        let ignored: std::collections::HashSet<WorkloadKind> = self
            .ignored_workload_types
            .iter()
            .filter_map(|t| WorkloadKind::from_plural(t))
            .collect();
        [
            WorkloadKind::Deployment,
            WorkloadKind::DaemonSet,
            WorkloadKind::StatefulSet,
            WorkloadKind::CronJob,
            WorkloadKind::Job,
            WorkloadKind::DeploymentConfig,
        ]
        .into_iter()
        .chain(self.is_argo_rollouts.then_some(WorkloadKind::Rollout))
        .filter(|k| !ignored.contains(k))
        .collect()
    }

    /// The namespaces to watch (`--namespaces`, else `KUBERNETES_NAMESPACE`); empty: the whole
    /// cluster.
    pub fn namespaces(&self) -> Vec<String> {
        let mut namespaces: Vec<String> = self
            .namespaces
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if let Some(ns) = self.kubernetes_namespace.as_ref().filter(|s| !s.is_empty())
            && namespaces.is_empty()
        {
            namespaces.push(ns.clone());
        }
        namespaces
    }
}

/// The webhook's certificate source and scope from the command line; `None` without
/// `--enable-webhook`.
impl Cli {
    pub fn webhook_settings(&self) -> Result<Option<(CertSource, Scope)>, WebhookError> {
        let cli = self;
        let args = &cli.webhook;
        if !args.enable_webhook {
            return Ok(None);
        }
        let own_namespace = cli.ha.pod_namespace.clone().filter(|s| !s.is_empty());
        let source = match &args.webhook_cert_dir {
            Some(dir) => CertSource::Files(dir.clone()),
            None => {
                let namespace = own_namespace.clone().ok_or_else(|| {
                WebhookError::Settings(
                    "--enable-webhook needs POD_NAMESPACE for its certificate Secret (or --webhook-cert-dir)".into(),
                )
            })?;
                let endpoint = match (&args.webhook_client_url, &args.webhook_service) {
                    (Some(url), _) if url_host(url).is_some() => Endpoint::Url(url.clone()),
                    (Some(url), _) => {
                        return Err(WebhookError::Settings(format!(
                            "--webhook-client-url must be an https:// URL with a host, got {url:?}"
                        )));
                    }
                    (None, Some(name)) => Endpoint::Service {
                        name: name.clone(),
                        namespace: namespace.clone(),
                        port: args.webhook_service_port,
                    },
                    (None, None) => {
                        return Err(WebhookError::Settings(
                        "--enable-webhook needs --webhook-service or --webhook-client-url (or --webhook-cert-dir with a configuration of your own)".into(),
                    ));
                    }
                };
                CertSource::Managed {
                    namespace,
                    secret: args.webhook_secret_name.clone(),
                    configuration: args.webhook_configuration_name.clone(),
                    endpoint,
                }
            }
        };
        let mut excluded: Vec<String> =
            ["kube-system".to_string()].into_iter().chain(own_namespace).collect();
        excluded.extend(self.reload.namespaces_to_ignore.iter().cloned());
        excluded.sort();
        excluded.dedup();
        let scope = Scope {
            kinds: self.reload.kinds().into_iter().filter(|k| k.admitted()).collect(),
            namespaces: self.reload.namespaces(),
            excluded_namespaces: excluded,
            object_labels: parse_labels(&args.webhook_object_selector)?,
        };
        Ok(Some((source, scope)))
    }
}

impl AlertArgs {
    /// The alert settings, for `report::alerts` to check.
    pub fn settings(&self) -> crate::report::alerts::AlertSettings {
        crate::report::alerts::AlertSettings {
            alert_on_reload: self.alert_on_reload,
            alert_webhook_url: self.alert_webhook_url.clone(),
            allow_plain_http: self.allow_plain_http,
            alert_webhook_url_file: self.alert_webhook_url_file.clone(),
            alert_sink: self.alert_sink.clone(),
            alert_webhook_proxy: self.alert_webhook_proxy.clone(),
            alert_additional_info: self.alert_additional_info.clone(),
        }
    }
}

impl ReloadArgs {
    /// The annotation keys after renaming flags.
    pub fn annotation_keys(&self) -> AnnotationKeys {
        AnnotationKeys {
            auto: self.auto_annotation.clone(),
            configmap_auto: self.configmap_auto_annotation.clone(),
            secret_auto: self.secret_auto_annotation.clone(),
            configmap_reload: self.configmap_annotation.clone(),
            secret_reload: self.secret_annotation.clone(),
            search: self.auto_search_annotation.clone(),
            search_match: self.search_match_annotation.clone(),
            ignore: self.ignore_annotation.clone(),
            pause_period: self.pause_deployment_annotation.clone(),
            paused_at: self.pause_deployment_time_annotation.clone(),
            ..AnnotationKeys::default()
        }
    }
}

/// A value parser accepting exactly `names` (listed in `--help`) and turning the one given into
/// `T` through its `FromStr`: the enumerations of the decision layer stay free of clap.
fn one_of<T>(names: impl IntoIterator<Item = &'static str>) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|name| name.parse::<T>())
}

/// A boolean as Go's `strconv.ParseBool` reads it (`1`, `t`, `T`, `TRUE`, `true`, `True`, and
/// the same for false), since stakater/Reloader's flags and env vars take those.
pub fn parse_go_bool(text: &str) -> Result<bool, String> {
    crate::model::annotations::parse_bool(text.trim())
        .ok_or_else(|| format!("expected a boolean (true, false, 1, 0, t, f, ...), got {text:?}"))
}

/// The namespace selector from every `--namespace-selector` given: quotes around terms dropped,
/// terms joined with commas (AND), legacy forms translated; `None` when empty.
pub fn namespace_selector(values: &[String]) -> Option<String> {
    let joined = values
        .iter()
        .map(|v| namespace_label_selector(v))
        .filter(|v| !v.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    (!joined.is_empty()).then_some(joined)
}

/// `enabled`/`true` or `disabled`/`false` (stakater/Reloader's `METRICS_COUNT_BY_NAMESPACE`).
pub fn parse_enabled(text: &str) -> Result<bool, String> {
    match text.trim() {
        "enabled" | "true" => Ok(true),
        "disabled" | "false" | "" => Ok(false),
        other => Err(format!("expected enabled or disabled, got {other:?}")),
    }
}

/// Turns the namespace selector into a Kubernetes label selector: `key:value` becomes
/// `key=value` and `key:*` becomes `key`; other terms pass through. Commas inside
/// parentheses (`env in (a,b)`) do not split terms.
pub fn namespace_label_selector(text: &str) -> String {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
        .into_iter()
        .map(|t| t.trim().trim_matches(['"', '\'']).trim())
        .filter(|t| !t.is_empty())
        .map(|t| match t.split_once(':') {
            Some((k, "*")) => k.trim().to_string(),
            Some((k, v)) if !t.contains(['=', '!', '(']) => format!("{}={}", k.trim(), v.trim()),
            _ => t.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses `host:port` or the Go-style `:port` (every interface).
pub fn parse_listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    let full = if text.starts_with(':') { format!("0.0.0.0{text}") } else { text.to_string() };
    full.parse().map_err(|e| format!("invalid listen address {text:?}: {e}"))
}

/// A Go duration (`1500ms`, `1.5m`, `1h30m`, `0`), as stakater/Reloader's flags take them.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::model::duration::parse(text.trim()).map_err(|e| e.to_string())
}

/// A Go duration that must be longer than zero (periods a timer runs at).
pub fn parse_period(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("{text:?} must be longer than zero")),
        d => Ok(d),
    }
}

/// A rate a second: 0 (off) or a finite number from 0.01 up (a smaller rate would mean a wait
/// of days per token).
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.trim().parse().map_err(|e| format!("invalid rate {text:?}: {e}"))?;
    if rate == 0.0 || (rate.is_finite() && (MIN_RATE..=1e6).contains(&rate)) {
        Ok(rate)
    } else {
        Err(format!("rate {text:?} must be 0 (off) or between {MIN_RATE} and 1000000"))
    }
}

/// The smallest rate [`parse_rate`] accepts.
pub const MIN_RATE: f64 = 0.01;

/// The flags reference, `docs/flags.md`, made from this definition so it cannot drift: a unit
/// test fails when the file differs (`make docs` rewrites it).
pub fn flags_reference() -> String {
    use clap::CommandFactory;
    let command = Cli::command();
    let cell =
        |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|");
    let mut out = String::from(
        "# Flags\n\n\
         <!-- Generated from src/cli.rs by `make docs`; a unit test keeps it current. -->\n\n\
         Every flag can also be set by the environment variable shown. Booleans take `--flag`,\n\
         `--flag=true`, `--flag true` or `--flag=false`, in Go's forms (`1`, `t`, `T`, `TRUE`,\n\
         `True` and the same for false), in environment variables too. Durations are Go\n\
         durations: `500ms`, `30s`, `1.5m`, `1h`, `1m30s`, `500us`. A second name after a flag\n\
         is stakater/Reloader's name for the same setting.\n\n\
         | flag | env | default | meaning |\n|---|---|---|---|\n",
    );
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || ["help", "version"].contains(&long) {
            continue;
        }
        let mut flag = format!("`--{long}`");
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_string())
            .collect();
        if !values.is_empty() && !values.iter().all(|v| v == "true" || v == "false") {
            flag = format!("`--{long} {}`", values.join("\\|"));
        }
        for alias in arg.get_all_aliases().unwrap_or_default() {
            flag.push_str(&format!(", `--{alias}`"));
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_else(|| "–".into());
        let default = match arg.get_default_values() {
            [] => "–".to_string(),
            values => format!(
                "`{}`",
                values.iter().map(|v| v.to_string_lossy()).collect::<Vec<_>>().join(",")
            ),
        };
        let help =
            arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
        out.push_str(&format!("| {flag} | {env} | {default} | {} |\n", cell(&help)));
    }
    out.push_str("\n## Subcommands\n\n");
    for sub in command.get_subcommands() {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!("- `reloader {}`: {}\n", sub.get_name(), cell(&about)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_flags_reference_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
        let generated = flags_reference();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, &generated).expect("write docs/flags.md");
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(committed == generated, "docs/flags.md is not current: run `make docs`");
    }

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
    fn hash_mode_defaults_to_the_compatible_sha1() {
        let cli = Cli::try_parse_from(["reloader"]).unwrap();
        assert_eq!(cli.reload.hash_mode, crate::model::workload::HashMode::Sha1);
        assert_eq!(cli.reload.hash_key_secret, "reloader-hash-key");
        let keyed = Cli::try_parse_from([
            "reloader",
            "--hash-mode",
            "hmac-sha256",
            "--hash-key-secret",
            "k",
            "--hash-key-namespace",
            "ops",
        ])
        .unwrap();
        assert_eq!(keyed.reload.hash_mode, crate::model::workload::HashMode::HmacSha256);
        let config = crate::runtime::operator::engine_config(&keyed.reload);
        assert_eq!(
            (config.hash_key_namespace.as_str(), config.hash_key_secret.as_str()),
            ("ops", "k")
        );
        assert!(Cli::try_parse_from(["reloader", "--hash-mode", "md5"]).is_err());
    }

    #[test]
    fn ha_needs_the_pod_identity_and_has_the_reference_defaults() {
        let off = Cli::try_parse_from(["reloader"]).unwrap();
        assert!(off.ha.leader_config().unwrap().is_none());
        let missing =
            Cli::try_parse_from(["reloader", "--enable-ha", "--pod-name", "r-0"]).unwrap();
        assert!(missing.ha.leader_config().unwrap_err().to_string().contains("POD_NAMESPACE"));
        let on = Cli::try_parse_from([
            "reloader",
            "--enable-ha=true",
            "--pod-name",
            "r-0",
            "--pod-namespace",
            "ops",
        ])
        .unwrap();
        let config = on.ha.leader_config().unwrap().unwrap();
        assert_eq!(
            (config.lease_name.as_str(), config.namespace.as_str(), config.identity.as_str()),
            ("stakater-reloader-lock", "ops", "r-0")
        );
        assert_eq!(config.lease_duration, Duration::from_secs(15));
        assert_eq!(config.renew_deadline, Duration::from_secs(10));
    }

    #[test]
    fn the_other_programs_leader_election_flags_are_read() {
        let cli = Cli::try_parse_from([
            "reloader",
            "--enable-ha",
            "--leader-election-lease-duration=20s",
            "--leader-election-renew-deadline",
            "15s",
            "--leader-election-retry-period=3s",
        ])
        .unwrap();
        assert_eq!(cli.ha.ha_lease_duration, Duration::from_secs(20));
        assert_eq!(cli.ha.ha_renew_deadline, Duration::from_secs(15));
        assert_eq!(cli.ha.leader_election_retry_period, Some(Duration::from_secs(3)));
        assert!(
            Cli::try_parse_from(["reloader", "--leader-election-retry-period=0s"]).is_err(),
            "a retry period is still a period"
        );
    }

    #[test]
    fn boolean_flags_take_go_forms() {
        let cli = Cli::try_parse_from([
            "reloader",
            "--auto-reload-all",
            "--reload-on-create=true",
            "--reload-on-delete=false",
        ])
        .unwrap();
        assert!(cli.reload.auto_reload_all);
        assert!(cli.reload.reload_on_create);
        assert!(!cli.reload.reload_on_delete);
        assert!(!cli.reload.sync_after_restart);
    }

    #[test]
    fn list_flags_and_strategy() {
        let cli = Cli::try_parse_from([
            "reloader",
            "--namespaces",
            "a,b",
            "--ignored-workload-types=jobs,cronjobs",
            "--reload-strategy",
            "annotations",
            "--resources-to-ignore",
            "secrets",
        ])
        .unwrap();
        assert_eq!(cli.reload.namespaces, ["a", "b"]);
        assert_eq!(cli.reload.ignored_workload_types, ["jobs", "cronjobs"]);
        assert_eq!(cli.reload.reload_strategy, Strategy::Annotations);
        assert_eq!(cli.reload.resources_to_ignore.as_deref(), Some("secrets"));
        assert!(Cli::try_parse_from(["reloader", "--resources-to-ignore", "pods"]).is_err());
        assert!(Cli::try_parse_from(["reloader", "--reload-strategy", "bogus"]).is_err());
    }

    #[test]
    fn renaming_flags_rename_keys() {
        let cli =
            Cli::try_parse_from(["reloader", "--auto-annotation", "example.com/auto"]).unwrap();
        let keys = cli.reload.annotation_keys();
        assert_eq!(keys.auto, "example.com/auto");
        assert_eq!(keys.secret_auto, "secret.reloader.stakater.com/auto");
    }

    #[test]
    fn namespace_selectors_accept_legacy_forms() {
        assert_eq!(namespace_label_selector("env:prod"), "env=prod");
        assert_eq!(namespace_label_selector("team:*"), "team");
        assert_eq!(namespace_label_selector("env=prod, team:*,tier!=db"), "env=prod,team,tier!=db");
        assert_eq!(namespace_label_selector("env in (a,b),x:y"), "env in (a,b),x=y");
        assert_eq!(namespace_label_selector(""), "");
        // stakater/Reloader's chart renders `--namespace-selector="env=test"`.
        assert_eq!(namespace_label_selector("\"env=test\""), "env=test");
        assert_eq!(namespace_label_selector("\"env=test\",'team:*'"), "env=test,team");
    }

    #[test]
    fn namespace_selectors_repeat_and_join() {
        let cli = Cli::try_parse_from([
            "reloader",
            "--namespace-selector=\"env=test\"",
            "--namespace-selector",
            "team:a",
        ])
        .unwrap();
        assert_eq!(
            namespace_selector(&cli.reload.namespace_selector).as_deref(),
            Some("env=test,team=a")
        );
        assert_eq!(namespace_selector(&[]), None);
    }

    #[test]
    fn booleans_take_go_forms_with_or_without_equals() {
        for (args, want) in [
            (&["--reload-on-create"][..], true),
            (&["--reload-on-create=true"][..], true),
            (&["--reload-on-create", "true"][..], true),
            (&["--reload-on-create", "False"][..], false),
            (&["--reload-on-create=T"][..], true),
            (&["--reload-on-create", "0"][..], false),
            (&["--reload-on-create", "--auto-reload-all"][..], true),
        ] {
            let cli = Cli::try_parse_from(std::iter::once("reloader").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(cli.reload.reload_on_create, want, "{args:?}");
        }
        assert!(Cli::try_parse_from(["reloader", "--reload-on-create=maybe"]).is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_addr(":9090").unwrap().to_string(), "0.0.0.0:9090");
        assert_eq!(parse_listen_addr("127.0.0.1:9091").unwrap().to_string(), "127.0.0.1:9091");
        assert!(parse_listen_addr("nowhere").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("18446744073709551615s1s").is_err());
    }

    #[test]
    fn flags_that_would_stall_or_panic_are_refused_at_start() {
        for args in [
            ["--api-discovery-interval", "0s"],
            ["--ha-lease-duration", "0"],
            ["--kube-api-qps", "1e-300"],
            ["--kube-api-qps", "NaN"],
            ["--max-rollouts-per-second", "-1"],
            ["--max-rollouts-per-second", "inf"],
        ] {
            let err = Cli::try_parse_from(["reloader", args[0], args[1]]).unwrap_err();
            assert!(err.to_string().contains(args[1]), "{args:?}: {err}");
        }
        let cli = Cli::try_parse_from(["reloader", "--resync-period", "0"]).unwrap();
        assert_eq!(cli.reload.resync_period, Duration::ZERO, "0 turns the resync off");
    }

    #[test]
    fn the_pod_target_bound_can_be_lowered_never_raised() {
        let max = crate::model::limits::MAX_POD_TARGET_PODS;
        let cli = Cli::try_parse_from(["reloader", "--pod-target-max-pods", "3"]).unwrap();
        assert_eq!(cli.reload.pod_target_max_pods, 3);
        assert_eq!(Cli::try_parse_from(["reloader"]).unwrap().reload.pod_target_max_pods, max);
        for bad in ["0".to_string(), (max + 1).to_string(), "-1".into(), "1e9".into()] {
            assert!(
                Cli::try_parse_from(["reloader", "--pod-target-max-pods", &bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn churn_limit_flags() {
        let cli = Cli::try_parse_from(["reloader"]).unwrap();
        assert_eq!(cli.reload.min_rollout_interval, Duration::from_secs(5));
        assert_eq!((cli.reload.max_rollouts_per_second, cli.reload.rollout_burst), (20.0, 500));
        let cli = Cli::try_parse_from([
            "reloader",
            "--min-rollout-interval",
            "0s",
            "--max-rollouts-per-second",
            "0",
            "--rollout-burst",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.reload.min_rollout_interval, Duration::ZERO);
        assert_eq!((cli.reload.max_rollouts_per_second, cli.reload.rollout_burst), (0.0, 3));
    }

    #[test]
    fn client_rate_limit_flags() {
        let cli = Cli::try_parse_from(["reloader"]).unwrap();
        assert_eq!((cli.kube_api_qps, cli.kube_api_burst), (100.0, 200));
        let cli =
            Cli::try_parse_from(["reloader", "--kube-api-qps", "20.5", "--kube-api-burst", "40"])
                .unwrap();
        assert_eq!((cli.kube_api_qps, cli.kube_api_burst), (20.5, 40));
        assert!(Cli::try_parse_from(["reloader", "--kube-api-burst", "0"]).is_err());
    }

    #[test]
    fn alert_flags() {
        let cli = Cli::try_parse_from(["reloader"]).unwrap();
        assert!(!cli.alerts.alert_on_reload);
        assert_eq!(cli.alerts.alert_sink, "raw");
        let cli = Cli::try_parse_from([
            "reloader",
            "--alert-on-reload",
            "--alert-sink",
            "slack",
            "--alert-webhook-url",
            "https://hooks.example/T/B/x",
            "--alert-additional-info=cluster prod",
            "--alert-webhook-proxy",
            "http://proxy:3128",
        ])
        .unwrap();
        assert!(cli.alerts.alert_on_reload);
        assert_eq!(cli.alerts.alert_sink, "slack");
        assert_eq!(cli.alerts.alert_webhook_url.as_deref(), Some("https://hooks.example/T/B/x"));
        assert_eq!(cli.alerts.alert_additional_info.as_deref(), Some("cluster prod"));
        assert_eq!(cli.alerts.alert_webhook_proxy.as_deref(), Some("http://proxy:3128"));
        let cli = Cli::try_parse_from(["reloader", "--alert-on-reload=false"]).unwrap();
        assert!(!cli.alerts.alert_on_reload);
        let both = Cli::try_parse_from([
            "reloader",
            "--alert-webhook-url",
            "http://a/",
            "--alert-webhook-url-file",
            "/etc/alert/url",
        ]);
        assert!(both.is_err(), "a URL and a URL file are one too many");
    }

    #[test]
    fn log_format_json_is_accepted_and_unknown_rejected() {
        let cli = Cli::try_parse_from(["reloader", "--log-format", "json"]).unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        let err = Cli::try_parse_from(["reloader", "--log-format", "xml"]).unwrap_err();
        assert!(err.to_string().contains("xml"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn any_flag_text_parses_or_is_refused(text in ".{0,40}") {
            let _ = parse_duration(&text);
            let _ = parse_period(&text);
            if let Ok(rate) = parse_rate(&text) {
                proptest::prop_assert!(rate == 0.0 || (rate.is_finite() && rate >= MIN_RATE));
            }
            let _ = namespace_label_selector(&text);
            let _ = parse_listen_addr(&text);
        }
    }
}
