use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reloader::cli::Cli::parse();
    reloader::telemetry::init(cli.log_format, &cli.log_level)?;
    reloader::operator::run(cli).await?;
    Ok(())
}
