//! `mcp-run-python`: an MCP server that runs Python in Pyodide inside JavaScriptCore.

mod cli;
mod engine;
mod modes;
mod packages;
mod sandbox;
mod server;

use anyhow::Result;
use clap::Parser;

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,mcp_run_python=info")),
        )
        .init();
    // The sandbox worker is the same binary behind a hidden first argument.
    if std::env::args().nth(1).as_deref() == Some("__worker") {
        return sandbox::worker_main::main();
    }
    let cli = cli::Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    let code = runtime.block_on(modes::run(cli))?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}
