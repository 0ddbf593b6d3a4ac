//! The one place that wires the operator together.
//!
//! It reads the parsed command line (`cli`, plain values: this module needs no clap) and builds
//! each part's settings; the engine's, [`EngineConfig`], here in [`engine_config`], so that `cli`
//! imports nothing of the runtime and the two import each other in no cycle.
//!
//! The tasks it starts (hash key, metrics endpoint, webhook, election) each stop on a
//! `tokio_util` `CancellationToken`, in the order `run` ends with: a cancel is kept, so a task
//! that only starts waiting after it still stops.

use crate::cli::{Cli, ReloadArgs};
use crate::kube::leader::{Election, Elector, PollingElection, sole_leader};
use crate::kube::ratelimit::{Lane, RateLimitLayer};
use crate::model::workload::HashMode;
use crate::runtime::engine::{Engine, EngineConfig};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::{Api, Client};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The engine's settings from the reload flags (the operator's own namespace and the hash
/// key's default namespace are `default` here; `run` puts `POD_NAMESPACE` there when it is set).
pub fn engine_config(args: &ReloadArgs) -> EngineConfig {
    EngineConfig {
        keys: args.annotation_keys(),
        strategy: args.reload_strategy,
        auto_reload_all: args.auto_reload_all,
        reload_on_create: args.reload_on_create,
        reload_on_delete: args.reload_on_delete,
        sync_after_restart: args.sync_after_restart,
        watch_configmaps: args.resources_to_ignore.as_deref() != Some("configmaps"),
        watch_secrets: args.resources_to_ignore.as_deref() != Some("secrets"),
        kinds: args.kinds(),
        namespaces: args.namespaces(),
        namespaces_to_ignore: args.namespaces_to_ignore.iter().cloned().collect(),
        resource_label_selector: args.resource_label_selector.clone().filter(|s| !s.is_empty()),
        namespace_selector: crate::cli::namespace_selector(&args.namespace_selector),
        webhook_url: args.webhook_url.clone().filter(|s| !s.is_empty()),
        debounce: args.debounce,
        debounce_max_wait: args.debounce_max_wait,
        min_rollout_interval: args.min_rollout_interval,
        rollout_timeout: args.rollout_timeout,
        pod_target_max_pods: args.pod_target_max_pods,
        ignore_windows: args.ignore_windows,
        max_rollouts_per_second: args.max_rollouts_per_second,
        rollout_burst: args.rollout_burst,
        resync_period: args.resync_period,
        workers: args.workers.into(),
        api_discovery_interval: args.api_discovery_interval,
        metrics_count_by_namespace: args.metrics_count_by_namespace,
        csi_integration: args.enable_csi_integration,
        key_precise_references: args.key_precise_references,
        hash_mode: args.hash_mode,
        // `default` for local runs; `run` puts POD_NAMESPACE here when it is set.
        own_namespace: "default".into(),
        hash_key_namespace: args
            .hash_key_namespace
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
        hash_key_secret: args.hash_key_secret.clone(),
    }
}

/// Connects to the API server and runs the engine until SIGTERM or SIGINT.
pub async fn run(cli: Cli) -> Result<()> {
    // Handlers first: a signal that arrives while connecting must stop us cleanly, not kill us.
    let shutdown = shutdown_signal()?;
    refuse_plain_http(&cli)?;
    let config = kube::Config::infer().await.map_err(|e| Error::Config(Box::new(e)))?;
    let election = lease_settings(&cli, &config)?;
    let clients = connect(&config, &cli).await?;
    if cli.enable_pprof || cli.pprof_addr.is_some() {
        warn!(
            "--enable-pprof and --pprof-addr are accepted for compatibility and ignored: profiling is never served"
        );
    }
    check_namespace_selector(&cli, &clients.work).await?;
    let (leadership, election, lease_missing) = elect(&cli, election, &clients.work).await?;
    let engine_config = engine_config_with_namespace(&cli);
    let webhook = cli.webhook_settings()?;
    let ha = election.is_some();
    let client = clients.work.clone();
    let engine = Engine::new(clients.work, clients.events, engine_config, leadership.clone());
    engine.metrics().register_requests(&clients.requests);
    engine.report_lease_rights(&lease_missing);
    let key = start_the_key(&cli, &engine, &client, leadership.clone(), ha).await?;
    let alerts = start_alerts(&cli, &engine);
    let http = start_http(&cli, &engine).await?;
    // Every replica serves the webhook from its warm memory; only the leader writes its
    // certificate Secret and configuration.
    let webhook = match webhook {
        Some((source, scope)) => {
            Some(start_webhook(&cli, &engine, (source, scope), client, leadership).await?)
        }
        None => None,
    };
    let mut ready = engine.ready();
    tokio::spawn(async move {
        if ready.wait_for(|r| *r == crate::serve::http::Readiness::Ready).await.is_ok() {
            info!("ready");
        }
    });
    // The signal stops the engine first (in-flight writes finish), then the election, which
    // releases the Lease so a standby takes over at once.
    let election = election.map(|e| Stoppable::spawn(|stop| e.run(stop.cancelled_owned())));
    engine
        .run(async {
            shutdown.await;
            info!("shutdown signal received, exiting");
        })
        .await;
    if let Some(election) = election {
        election.stop().await;
    }
    // After the Lease is released: queued alerts must not delay the standby's takeover.
    if let Some(delivery) = alerts {
        delivery.finish(Duration::from_secs(5)).await;
    }
    if let Some(webhook) = webhook {
        webhook.stop().await;
    }
    key.stop().await;
    http.stop().await;
    Ok(())
}

/// A task `run` started, with the token that stops it: a cancel is kept, so a task that only
/// starts waiting after it still stops.
struct Stoppable {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Stoppable {
    fn spawn<F>(task: impl FnOnce(CancellationToken) -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        Stoppable { tasks: vec![tokio::spawn(task(stop.clone()))], stop }
    }

    /// Cancels the token and waits for every task.
    async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// `--webhook-url` over plain http is refused unless `--allow-plain-http` says otherwise.
fn refuse_plain_http(cli: &Cli) -> Result<()> {
    let plain_http = cli.reload.webhook_url.as_deref().is_some_and(|u| u.starts_with("http://"));
    if plain_http && !cli.alerts.allow_plain_http {
        return Err(Error::Settings(
            "--webhook-url is http://: reload payloads would cross the network in clear; use \
             https:// or allow it with --allow-plain-http (RELOADER_ALLOW_PLAIN_HTTP)"
                .into(),
        ));
    }
    Ok(())
}

/// With `--enable-ha`: the election's settings, and the client configuration of its Lease
/// requests, bounded so a renewal that hangs fails before the Lease ends.
fn lease_settings(
    cli: &Cli,
    config: &kube::Config,
) -> Result<Option<(crate::kube::leader::LeaderConfig, kube::Config)>> {
    let Some(leader) = cli.ha.leader_config()? else { return Ok(None) };
    let mut lease_config = config.clone();
    let timeout = Some(leader.request_timeout());
    (lease_config.connect_timeout, lease_config.read_timeout, lease_config.write_timeout) =
        (timeout, timeout, timeout);
    Ok(Some((leader, lease_config)))
}

/// The operator's API clients: one for its work, one for Events, and the metrics of their
/// requests.
struct Clients {
    work: Client,
    events: Client,
    requests: crate::report::metrics::RequestMetrics,
}

/// Builds the clients (rate limited with `--kube-api-qps`) and asks the server's version.
async fn connect(config: &kube::Config, cli: &Cli) -> Result<Clients> {
    let cluster_url = config.cluster_url.to_string();
    let host = config.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let requests = crate::report::metrics::RequestMetrics::new(&host);
    // A request is timed from its call, which the rate limiter lets through only once it has
    // a token: the time is the API server's, not the bucket's.
    let limit = RateLimitLayer::new(cli.kube_api_qps, cli.kube_api_burst);
    let build = |lane: Lane| -> Result<Client, Error> {
        let client = kube::client::ClientBuilder::try_from(config.clone())?
            .with_layer(&crate::report::metrics::RequestMetricsLayer(requests.clone()));
        Ok(match &limit {
            Some(limit) => client.with_layer(&limit.lane(lane)).build(),
            None => client.build(),
        })
    };
    let work = build(Lane::Work)?;
    // Events share the budget but never make a workload write wait (see `kube::ratelimit`).
    let events = build(Lane::Background)?;
    let version = work
        .apiserver_version()
        .await
        .map_err(|source| Error::Connect { url: cluster_url.clone(), source })?;
    info!(
        cluster = %cluster_url,
        server_version = %version.git_version,
        "connected to the Kubernetes API server"
    );
    Ok(Clients { work, events, requests })
}

/// An invalid namespace selector would fail every Namespace watch forever: ask the API
/// server's own parser now, and stop with its message.
async fn check_namespace_selector(cli: &Cli, client: &Client) -> Result<()> {
    let Some(selector) = crate::cli::namespace_selector(&cli.reload.namespace_selector) else {
        return Ok(());
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let probe = ListParams::default().labels(&selector).limit(1);
    if let Err(kube::Error::Api(status)) = namespaces.list_metadata(&probe).await
        && status.code == 400
    {
        return Err(Error::Settings(format!(
            "--namespace-selector {selector:?} is not a valid label selector: {}",
            status.message
        )));
    }
    Ok(())
}

/// When this replica may write, its election (with `--enable-ha`), and the Lease rights the
/// identity lacks. With Reloader's Lease rights (get and update, no watch or patch) the Lease
/// is polled.
async fn elect(
    cli: &Cli,
    election: Option<(crate::kube::leader::LeaderConfig, kube::Config)>,
    client: &Client,
) -> Result<(tokio::sync::watch::Receiver<bool>, Option<Elector>, Vec<crate::kube::access::Right>)>
{
    let Some((leader, lease_config)) = election else {
        return Ok((sole_leader(), None, Vec::new()));
    };
    let rights =
        crate::kube::access::lease_rights(client, &leader.namespace, &leader.lease_name).await;
    let election = if rights.poll {
        let retry = cli.ha.leader_election_retry_period.unwrap_or(Duration::from_secs(2));
        Elector::Polling(PollingElection::new(Client::try_from(lease_config)?, leader, retry)?)
    } else {
        Elector::Watching(
            Election::new(Client::try_from(lease_config)?, client.clone(), leader).await?,
        )
    };
    Ok((election.leadership(), Some(election), rights.missing))
}

/// The engine's settings, with `POD_NAMESPACE` as the operator's own namespace (and the hash
/// key's, unless given) when it is set.
fn engine_config_with_namespace(cli: &Cli) -> EngineConfig {
    let mut engine_config = engine_config(&cli.reload);
    if let Some(ns) = cli.ha.pod_namespace.as_ref().filter(|s| !s.is_empty()) {
        engine_config.own_namespace = ns.clone();
        if cli.reload.hash_key_namespace.as_deref().is_none_or(str::is_empty) {
            engine_config.hash_key_namespace = ns.clone();
        }
    }
    engine_config
}

/// Annotation mode's keyed hashes need the key before anything is planned: a replica that
/// may create it (no HA) does so now, and any error is fatal; a standby only checks that it
/// may read it, and waits for the leader to create it. In sha1 mode, only keyed policies
/// need it: loaded in the background, never holding up readiness.
async fn start_the_key(
    cli: &Cli,
    engine: &Engine,
    client: &Client,
    leadership: tokio::sync::watch::Receiver<bool>,
    ha: bool,
) -> Result<Stoppable> {
    let key_slot = engine.hash_key();
    let keyed_annotations = cli.reload.hash_mode == HashMode::HmacSha256;
    if keyed_annotations {
        key_slot.load_once(client, !ha).await?;
    }
    let (client, policy_mode) = (client.clone(), engine.policy_mode());
    Ok(Stoppable::spawn(|stop| {
        keep_the_key(client, key_slot, leadership, stop, keyed_annotations, policy_mode)
    }))
}

/// Alerts (`--alert-*`): the engine sends them, the delivery is finished at the end.
fn start_alerts(cli: &Cli, engine: &Engine) -> Option<crate::report::alerts::AlertDelivery> {
    let webhook_mode = cli.reload.webhook_url.as_deref().is_some_and(|u| !u.is_empty());
    let alerts = crate::report::alerts::start_from_settings(
        &cli.alerts.settings(),
        webhook_mode,
        engine.metrics(),
    );
    alerts.map(|(alerter, delivery)| {
        engine.send_alerts(alerter);
        delivery
    })
}

/// Serves `/metrics`, `/live` and `/readyz`.
async fn start_http(cli: &Cli, engine: &Engine) -> Result<Stoppable> {
    let stop_http = CancellationToken::new();
    let (bound, http) = {
        let stop = stop_http.clone().cancelled_owned();
        let health = crate::serve::http::Health { ready: engine.ready(), live: engine.live() };
        crate::serve::http::serve(cli.metrics_addr, engine.metrics(), health, stop)
            .await
            .map_err(|source| Error::Listen { addr: cli.metrics_addr, source })?
    };
    info!(address = %bound, "serving /metrics, /live and /readyz");
    Ok(Stoppable { stop: stop_http, tasks: vec![tokio::spawn(http)] })
}

/// Serves the admission webhook (`--enable-webhook`) and keeps its certificate.
async fn start_webhook(
    cli: &Cli,
    engine: &Arc<Engine>,
    (source, scope): (crate::serve::admission::CertSource, crate::serve::admission::Scope),
    client: Client,
    leadership: tokio::sync::watch::Receiver<bool>,
) -> Result<Stoppable> {
    let stop_webhook = CancellationToken::new();
    let slot = Arc::new(crate::serve::admission::CertSlot::default());
    let stop = stop_webhook.clone().cancelled_owned();
    // The configuration's own rule: exclusions apply when no namespaces are listed
    // (listed ones are checked by the engine either way).
    let excluded =
        if scope.namespaces.is_empty() { scope.excluded_namespaces.clone() } else { Vec::new() };
    let guard = crate::serve::admission::Guard {
        excluded_namespaces: excluded,
        client_ca: cli.webhook.webhook_client_ca.clone(),
        allow_unauthenticated: cli.webhook.webhook_allow_unauthenticated,
    };
    if guard.client_ca.is_none() && !guard.allow_unauthenticated {
        warn!(
            "the admission webhook has no --webhook-client-ca: no caller is \
             authenticated, so every review is admitted without a patch"
        );
    }
    let addr = cli.webhook.webhook_addr;
    let (bound, server) =
        crate::serve::admission::serve(addr, engine.admission(), slot.clone(), guard, stop)
            .await
            .map_err(|source| crate::serve::admission::WebhookError::Listen { addr, source })?;
    info!(address = %bound, path = crate::serve::admission::MUTATE_PATH, "serving the admission webhook");
    let stop = stop_webhook.clone().cancelled_owned();
    let upkeep = crate::serve::admission::maintain_certificates(
        client, source, scope, slot, leadership, stop,
    );
    Ok(Stoppable { stop: stop_webhook, tasks: vec![tokio::spawn(server), tokio::spawn(upkeep)] })
}

/// Installs SIGTERM and SIGINT handlers now; the future resolves on the first of them.
pub fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    })
}

/// Keeps the hash key loaded (and, on the leader, created) while it is used: always for keyed
/// annotations; in sha1 mode only for keyed ReloadPolicies, so not looked for while policy mode
/// is off (an identity that may not read policies, such as Reloader's). Off at start, the slot
/// says no key is looked for, until policy mode turns on.
async fn keep_the_key(
    client: Client,
    slot: Arc<crate::kube::hash_key::KeySlot>,
    leadership: tokio::sync::watch::Receiver<bool>,
    stop: CancellationToken,
    keyed_annotations: bool,
    mut policy_mode: tokio::sync::watch::Receiver<Option<bool>>,
) {
    let off = policy_mode.wait_for(Option::is_some).await.is_ok_and(|m| *m == Some(false));
    if !keyed_annotations && off {
        slot.not_used();
    }
    let needed = keyed_annotations || policy_mode.wait_for(|on| *on == Some(true)).await.is_ok();
    if needed {
        crate::kube::hash_key::maintain(client, slot, leadership, stop.cancelled_owned()).await;
    }
}
