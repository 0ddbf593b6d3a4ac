use clap::Parser;

/// Opt-in only: the system allocator is the measured choice (see `reloader::runtime::memory`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reloader::cli::Cli::parse();
    match cli.command {
        Some(reloader::cli::Command::Crd) => {
            print!("{}", reloader::model::policy::crd_yaml());
            return Ok(());
        }
        Some(reloader::cli::Command::Explain(args)) => std::process::exit(explain(*args).await),
        None if invoked_as_kubectl_plugin() => {
            eprintln!(
                "kubectl reloader: a subcommand is needed (`kubectl reloader explain deploy/NAME`)"
            );
            std::process::exit(1);
        }
        None => {}
    }
    reloader::telemetry::init(cli.log_format, &cli.log_level)?;
    reloader::runtime::operator::run(cli).await?;
    Ok(())
}

/// `kubectl reloader ...` runs this binary as `kubectl-reloader`: never the operator then.
fn invoked_as_kubectl_plugin() -> bool {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let base =
        std::path::Path::new(&argv0).file_name().unwrap_or_default().to_string_lossy().into_owned();
    base.trim_end_matches(".exe") == "kubectl-reloader"
}

/// `reloader explain`: prints the explanation and returns its exit code (1 on an error).
async fn explain(args: reloader::cli::ExplainArgs) -> i32 {
    use reloader::runtime::explain::{Target, parse_any};
    let json = args.output == "json";
    let answer = async {
        let target = parse_any(&args.target)?;
        let (client, config, namespace, account) = explain_setup(&args).await?;
        // Only the form asked for is rendered.
        let (out, code) = match target {
            Target::Workload(kind, name) => {
                let e = reloader::runtime::explain::run(
                    &client, &config, kind, &namespace, &name, account,
                )
                .await?;
                let out = if json {
                    serde_json::to_string_pretty(&e)? + "\n"
                } else {
                    reloader::decide::explain::render(&e)
                };
                (out, e.exit_code)
            }
            Target::Policy(name) => {
                let e = reloader::runtime::explain_policy::run_policy(
                    &client, &config, &namespace, &name, account,
                )
                .await?;
                let out = if json {
                    serde_json::to_string_pretty(&e)? + "\n"
                } else {
                    reloader::decide::explain_policy::render_policy(&e)
                };
                (out, e.exit_code)
            }
        };
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((out, code))
    };
    match answer.await {
        Ok((out, code)) => {
            print!("{out}");
            code
        }
        Err(e) => {
            eprintln!("reloader explain: {e}");
            1
        }
    }
}

type Setup =
    (kube::Client, reloader::runtime::engine::EngineConfig, String, Option<(String, String)>);

/// The client, the operator's settings (from this command line or its Deployment), the
/// namespace explain reads and the operator's ServiceAccount (`--operator-account`, or its
/// Deployment's).
async fn explain_setup(
    args: &reloader::cli::ExplainArgs,
) -> Result<Setup, Box<dyn std::error::Error + Send + Sync>> {
    use reloader::runtime::explain;
    let client = kube::Client::try_default().await?;
    let mut account = match &args.operator_account {
        Some(at) => {
            let (ns, name) =
                at.split_once('/').ok_or("--operator-account: expected namespace/name")?;
            Some((ns.to_string(), name.to_string()))
        }
        None => None,
    };
    let reload = match &args.operator_deployment {
        Some(at) => {
            let (ns, deployment) =
                at.split_once('/').ok_or("--operator-deployment: expected namespace/name")?;
            let (operator, sa) = explain::operator_args(&client, ns, deployment).await?;
            if let Some(sa) = sa {
                account.get_or_insert((ns.to_string(), sa));
            }
            let mut reload = reloader::cli::reload_args_of(&operator)?;
            // The operator's POD_NAMESPACE: where its hash key Secret is by default.
            if reload.hash_key_namespace.as_deref().is_none_or(str::is_empty) {
                reload.hash_key_namespace = Some(ns.to_string());
            }
            reload
        }
        None => args.reload.clone(),
    };
    let config = reloader::runtime::operator::engine_config(&reload);
    let namespace =
        args.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    Ok((client, config, namespace, account))
}
