//! The stdio transport: one MCP session over the process's stdin and stdout.

use super::handler::RunPythonServer;
use anyhow::{Context, Result};
use rmcp::ServiceExt;

/// Serves one session on stdin/stdout until the client closes stdin.
///
/// Errors: the transport failed to start or broke down.
pub async fn serve(server: RunPythonServer) -> Result<()> {
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .context("starting the MCP session on stdio")?;
    running.waiting().await.context("serving MCP on stdio")?;
    Ok(())
}
