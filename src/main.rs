use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    capkr::manager::run(capkr::manager::Args::parse()).await
}
