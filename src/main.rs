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
mod traces;
mod wasi;
mod worker;

use anyhow::Result;
use clap::Parser;

/// Log filter by default, and with `--verbose` (unless `RUST_LOG` says otherwise).
const DEFAULT_LOG_FILTER: &str = "warn,mcp_run_python=info";
const VERBOSE_LOG_FILTER: &str = "info,mcp_run_python=debug";

/// Logs to stderr, filtered by `RUST_LOG` (else [`DEFAULT_LOG_FILTER`], or
/// [`VERBOSE_LOG_FILTER`] with `verbose`); with `exporting`, this crate's trace spans also go to
/// OpenTelemetry ([`traces`]). The spans never reach the log lines.
fn init_logging(verbose: bool, exporting: Option<&traces::Exporting>) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let default = if verbose {
        VERBOSE_LOG_FILTER
    } else {
        DEFAULT_LOG_FILTER
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let spans_off = format!("{}=off", traces::TARGET)
        .parse()
        .expect("a fixed, valid directive");
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter.add_directive(spans_off));
    let spans = exporting.map(|e| {
        e.layer().with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(traces::TARGET, tracing::Level::INFO),
        )
    });
    tracing_subscriber::registry().with(logs).with(spans).init();
}

/// The trace export of a serving front, when the environment asks for it ([`traces::wanted`]);
/// a misconfigured exporter is reported and the front serves without traces.
fn start_traces(server: &cli::Serve) -> Option<traces::Exporting> {
    if server.mode == cli::Mode::ZygoteService || !traces::wanted() {
        return None;
    }
    match traces::start() {
        Ok(exporting) => Some(exporting),
        Err(e) => {
            eprintln!("traces are off: {e}");
            None
        }
    }
}

fn main() -> Result<()> {
    let run = match cli::Cli::parse().resolve() {
        Ok(run) => run,
        Err(usage) => usage.exit(),
    };
    match run {
        cli::Run::Worker(args) => {
            init_logging(false, None);
            interpreter::entry::main(args)
        }
        cli::Run::Packages(command) => {
            let verbose = matches!(
                &command,
                cli::PackagesCommand::Download { verbose: true, .. }
            );
            init_logging(verbose, None);
            let runtime = tokio::runtime::Runtime::new()?;
            let code = runtime.block_on(modes::packages(command))?;
            std::process::exit(code);
        }
        cli::Run::Zygote(command) => {
            init_logging(false, None);
            std::process::exit(modes::zygote::operate(command));
        }
        cli::Run::Serve(server) => {
            // Read, and removed from the environment, while no other thread runs (the trace
            // exporter's thread starts after).
            let secrets = modes::take_secrets(&server)?;
            let exporting = start_traces(&server);
            init_logging(server.verbose, exporting.as_ref());
            let runtime = tokio::runtime::Runtime::new()?;
            let code = runtime.block_on(modes::run(*server, secrets))?;
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            if let Some(exporting) = exporting {
                exporting.shutdown();
            }
            std::process::exit(code);
        }
    }
}
