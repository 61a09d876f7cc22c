//! One upstream MCP server: the front's rmcp client connection to it, kept by a supervisor task
//! (connect, list the allowed tools, list again on `list_changed`, reconnect after a loss).

use super::config::{ServerConfig, Transport};
use super::{ToolCallError, Upstreams};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    Implementation, ServerNotification, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, Subscription};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::{oneshot, Notify};

/// How long connecting (and the MCP handshake) or one tool listing may take (seconds).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The first pause before reconnecting to a lost server, doubled after each failure up to
/// [`RECONNECT_MAX`] (seconds).
const RECONNECT_MIN: Duration = Duration::from_secs(1);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// Longest line of a stdio server's stderr that reaches the log (bytes).
const STDERR_LINE_MAX: u64 = 1 << 10;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("could not start {command:?}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("header {0:?} is not a valid HTTP header")]
    Header(String),
    #[error("the MCP handshake failed")]
    Handshake(#[source] Box<rmcp::service::ClientInitializeError>),
    #[error("listing its tools failed")]
    List(#[source] rmcp::ServiceError),
    #[error("it did not answer within {} s", CONNECT_TIMEOUT.as_secs())]
    Timeout,
}

/// Receives the upstream's notifications: a changed tool list wakes the supervisor.
struct Watcher {
    changed: Arc<Notify>,
}

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("mcp-run-python", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// One upstream server and what is known of it now.
pub(super) struct Connection {
    pub config: ServerConfig,
    upstreams: Weak<Upstreams>,
    /// The live connection's peer; `None` while (re)connecting.
    peer: Mutex<Option<Peer<RoleClient>>>,
    /// Its allowed tools, as last listed; empty while it is not connected.
    tools: Mutex<Vec<Tool>>,
}

impl Connection {
    pub fn new(config: ServerConfig, upstreams: Weak<Upstreams>) -> Connection {
        Connection {
            config,
            upstreams,
            peer: Mutex::new(None),
            tools: Mutex::new(Vec::new()),
        }
    }

    /// Its allowed tools now.
    pub fn tools(&self) -> Vec<Tool> {
        self.tools.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its allowed tool `name` now, if it has one.
    pub fn tool(&self, name: &str) -> Option<Tool> {
        self.tools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|t| t.name == name)
            .cloned()
    }

    /// Calls a tool. Dropping the future cancels the upstream request.
    ///
    /// Errors: [`ToolCallError::NotConnected`], [`ToolCallError::Unanswerable`] (a request for
    /// input code mode cannot give), [`ToolCallError::Upstream`] (the upstream's error).
    pub async fn call(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ToolCallError> {
        let server = || self.config.name.clone();
        let peer = self
            .peer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ToolCallError::NotConnected { server: server() })?;
        match peer.call_tool_once(params).await {
            Ok(CallToolResponse::Complete(result)) => Ok(result),
            Ok(_) => Err(ToolCallError::Unanswerable { server: server() }),
            Err(source) => Err(ToolCallError::Upstream {
                server: server(),
                source,
            }),
        }
    }

    /// Starts the supervisor; returns once its first attempt connected and listed the tools,
    /// or failed.
    pub async fn supervise(self: Arc<Self>) {
        let (first, attempted) = oneshot::channel();
        tokio::spawn(self.run(first));
        let _ = attempted.await;
    }

    /// Connects, serves, and reconnects after a loss, until the server set is gone.
    async fn run(self: Arc<Self>, first: oneshot::Sender<()>) {
        let mut first = Some(first);
        let mut pause = RECONNECT_MIN;
        let name = self.config.name.clone();
        loop {
            let changed = Arc::new(Notify::new());
            match self.connect(changed.clone()).await {
                Ok(service) => {
                    pause = RECONNECT_MIN;
                    tracing::info!(
                        "upstream MCP server {name:?}: connected, {} tools allowed",
                        self.tools().len()
                    );
                    self.publish();
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                    self.serve(service, &changed).await;
                    *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    self.tools.lock().unwrap_or_else(|p| p.into_inner()).clear();
                    self.publish();
                    tracing::warn!("upstream MCP server {name:?}: connection lost; reconnecting");
                }
                Err(e) => {
                    tracing::warn!(
                        "upstream MCP server {name:?}: {:#}; trying again in {} s",
                        anyhow::Error::from(e),
                        pause.as_secs()
                    );
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                }
            }
            if self.upstreams.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECONNECT_MAX);
        }
    }

    /// Waits until the connection ends, listing the tools again whenever they change.
    async fn serve(
        &self,
        service: rmcp::service::RunningService<RoleClient, Watcher>,
        changed: &Notify,
    ) {
        let peer = service.peer().clone();
        let ended = service.waiting();
        tokio::pin!(ended);
        let mut listening = self.listen(&peer).await;
        loop {
            let heard = async {
                match listening.as_mut() {
                    Some(subscription) => subscription.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut ended => return,
                _ = changed.notified() => self.relist(&peer).await,
                notification = heard => match notification {
                    Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                        self.relist(&peer).await
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => listening = None,
                },
            }
        }
    }

    /// Asks a 2026-07-28 server for its `tools/list_changed` notifications (a listen stream);
    /// `None` from a server on an earlier version, which sends them unasked (the handler's
    /// `on_tool_list_changed`).
    async fn listen(&self, peer: &Peer<RoleClient>) -> Option<Subscription> {
        let filter = SubscriptionFilter::builder().tools_list_changed().build();
        match tokio::time::timeout(CONNECT_TIMEOUT, peer.listen(filter)).await {
            Ok(Ok(subscription)) => Some(subscription),
            Ok(Err(e)) => {
                tracing::debug!(
                    "upstream MCP server {:?}: no listen stream ({e}); list changes come unasked",
                    self.config.name
                );
                None
            }
            Err(_) => None,
        }
    }

    /// Lists the tools again after a change, and publishes them.
    async fn relist(&self, peer: &Peer<RoleClient>) {
        match self.list(peer).await {
            Ok(()) => self.publish(),
            Err(e) => tracing::warn!(
                "upstream MCP server {:?}: {:#}",
                self.config.name,
                anyhow::Error::from(e)
            ),
        }
    }

    /// Rebuilds the catalog (this server's tools changed).
    fn publish(&self) {
        if let Some(upstreams) = self.upstreams.upgrade() {
            upstreams.republish();
        }
    }

    /// Connects, shakes hands and lists the tools.
    async fn connect(
        &self,
        changed: Arc<Notify>,
    ) -> Result<rmcp::service::RunningService<RoleClient, Watcher>, ConnectError> {
        let watcher = Watcher { changed };
        let service = match &self.config.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).envs(env);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|source| ConnectError::Spawn {
                        command: command.clone(),
                        source,
                    })?;
                if let Some(stderr) = stderr {
                    log_stderr(self.config.name.clone(), stderr);
                }
                handshake(watcher.serve(transport)).await?
            }
            Transport::Http { url, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let header = http::HeaderName::try_from(name.as_str())
                        .map_err(|_| ConnectError::Header(name.clone()))?;
                    let value = http::HeaderValue::try_from(value.as_str())
                        .map_err(|_| ConnectError::Header(name.clone()))?;
                    custom.insert(header, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(config);
                handshake(watcher.serve(transport)).await?
            }
        };
        let peer = service.peer().clone();
        self.list(&peer).await?;
        *self.peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(peer);
        Ok(service)
    }

    /// Lists the server's tools and keeps those its allowlist allows.
    async fn list(&self, peer: &Peer<RoleClient>) -> Result<(), ConnectError> {
        let tools = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
            .await
            .map_err(|_| ConnectError::Timeout)?
            .map_err(ConnectError::List)?;
        let allowed: Vec<Tool> = tools
            .into_iter()
            .filter(|t| self.config.allows(&t.name))
            .collect();
        *self.tools.lock().unwrap_or_else(|p| p.into_inner()) = allowed;
        Ok(())
    }
}

/// The MCP handshake, bounded by [`CONNECT_TIMEOUT`].
async fn handshake<T>(
    serving: impl std::future::Future<Output = Result<T, rmcp::service::ClientInitializeError>>,
) -> Result<T, ConnectError> {
    tokio::time::timeout(CONNECT_TIMEOUT, serving)
        .await
        .map_err(|_| ConnectError::Timeout)?
        .map_err(|e| ConnectError::Handshake(Box::new(e)))
}

/// Logs a stdio server's stderr at debug level, a bounded line at a time.
fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader)
                .take(STDERR_LINE_MAX)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => return,
                Ok(_) => tracing::debug!(
                    target: "mcp_run_python::upstream_log",
                    "{server}: {:?}",
                    String::from_utf8_lossy(&line).trim_end()
                ),
            }
        }
    });
}
