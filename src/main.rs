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
    match explanation(&args).await {
        Ok(e) if args.output == "json" => {
            println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
            e.exit_code
        }
        Ok(e) => {
            print!("{}", reloader::decide::explain::render(&e));
            e.exit_code
        }
        Err(e) => {
            eprintln!("reloader explain: {e}");
            1
        }
    }
}

async fn explanation(
    args: &reloader::cli::ExplainArgs,
) -> Result<reloader::decide::explain::Explanation, Box<dyn std::error::Error + Send + Sync>> {
    use reloader::runtime::explain;
    let (kind, name) = explain::parse_target(&args.target)?;
    let client = kube::Client::try_default().await?;
    let reload = match &args.operator_deployment {
        Some(at) => {
            let (ns, deployment) =
                at.split_once('/').ok_or("--operator-deployment: expected namespace/name")?;
            let operator = explain::operator_args(&client, ns, deployment).await?;
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
    explain::run(&client, &config, kind, &namespace, &name).await
}
