//! `mcp-run-python`: an MCP server that runs Python in Pyodide inside JavaScriptCore.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod assets;
mod atomic_file;
mod cli;
mod code_mode;
mod engine;
mod interpreter;
mod metrics;
mod modes;
mod packages;
mod protocol;
mod sandbox;
mod server;
mod worker;

use anyhow::Result;
use clap::Parser;

/// Log filter by default, and with `--verbose` (unless `RUST_LOG` says otherwise).
const DEFAULT_LOG_FILTER: &str = "warn,mcp_run_python=info";
const VERBOSE_LOG_FILTER: &str = "info,mcp_run_python=debug";

fn init_logging(verbose: bool) {
    let default = if verbose {
        VERBOSE_LOG_FILTER
    } else {
        DEFAULT_LOG_FILTER
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .init();
}

fn main() -> Result<()> {
    // The sandbox worker is the same binary behind a hidden first argument.
    if std::env::args().nth(1).as_deref() == Some(protocol::launch::WORKER_COMMAND) {
        init_logging(false);
        return interpreter::entry::main();
    }
    if std::env::args().nth(1).as_deref() == Some("packages") {
        let cli = cli::PackagesCli::parse_from(std::env::args().skip(1));
        let verbose = matches!(
            &cli.command,
            cli::PackagesCommand::Download { verbose: true, .. }
        );
        init_logging(verbose);
        let runtime = tokio::runtime::Runtime::new()?;
        let code = runtime.block_on(modes::packages(cli))?;
        std::process::exit(code);
    }
    if std::env::args().nth(1).as_deref() == Some("zygote") {
        let cli = cli::ZygoteCli::parse_from(std::env::args().skip(1));
        init_logging(false);
        std::process::exit(modes::zygote::operate(cli));
    }
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    let runtime = tokio::runtime::Runtime::new()?;
    let code = runtime.block_on(modes::run(cli))?;
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}
