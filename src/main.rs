use clap::Parser;

/// Opt-in only: the system allocator is the measured choice (see `reloader::runtime::memory`).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reloader::cli::Cli::parse();
    if let Some(reloader::cli::Command::Crd) = cli.command {
        print!("{}", reloader::model::policy::crd_yaml());
        return Ok(());
    }
    reloader::telemetry::init(cli.log_format, &cli.log_level)?;
    reloader::runtime::operator::run(cli).await?;
    Ok(())
}
