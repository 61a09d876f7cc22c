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
mod wasi;
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
    let run = match cli::Cli::parse().resolve() {
        Ok(run) => run,
        Err(usage) => usage.exit(),
    };
    match run {
        cli::Run::Worker(args) => {
            init_logging(false);
            interpreter::entry::main(args)
        }
        cli::Run::Packages(command) => {
            let verbose = matches!(
                &command,
                cli::PackagesCommand::Download { verbose: true, .. }
            );
            init_logging(verbose);
            let runtime = tokio::runtime::Runtime::new()?;
            let code = runtime.block_on(modes::packages(command))?;
            std::process::exit(code);
        }
        cli::Run::Zygote(command) => {
            init_logging(false);
            std::process::exit(modes::zygote::operate(command));
        }
        cli::Run::Serve(server) => {
            init_logging(server.verbose);
            // Read, and removed from the environment, while no other thread runs.
            let secrets = modes::take_secrets(&server)?;
            let runtime = tokio::runtime::Runtime::new()?;
            let code = runtime.block_on(modes::run(*server, secrets))?;
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            std::process::exit(code);
        }
    }
}
