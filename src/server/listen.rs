//! Telling clients that a list changed: `subscriptions/listen` streams for MCP 2026-07-28
//! clients (SEP-2575: the acknowledgement first, every notification tagged with its
//! `subscriptionId`, only the kinds the client asked for; rmcp's `SubscriptionContext` does
//! the wire side) and `notifications/tools/list_changed` on the session of a 2025-11-25
//! client (MCP spec 2025-11-25, tools: list changed notification).
//!
//! Two kinds of change are told:
//! - `toolsListChanged`: a code-mode upstream (`--tools-config`) changed the tools that
//!   `run_python_code`'s description lists ([`crate::code_mode::Upstreams::watch_tools`]);
//! - `resourcesListChanged`: a sandbox's files changed ([`Changes::files_changed`]), told to a
//!   listener of the sandbox's own principal only (the authenticated caller that made it;
//!   without authentication every caller is the same, unnamed principal). A 2025-11-25
//!   session's own default sandbox is told on its session as before (`tools::reach`).
//!
//! Changes are told on the replica they happened on: a listener behind a balancer hears of
//! its replica's changes.

use crate::sandbox::live::{Principal, Sandbox};
use rmcp::model::{ServerCapabilities, SubscriptionFilter};
use rmcp::service::{Peer, SubscriptionContext, SubscriptionSendError};
use rmcp::{ErrorData as McpError, RoleServer};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

/// File changes a listener may fall behind by before it is told once for all it missed.
const FILE_CHANGES_BUFFER: usize = 256;

/// A sandbox's files changed (a call, an upload, a delete, the sandbox destroyed).
#[derive(Debug, Clone)]
pub struct FilesChanged {
    /// The principal the sandbox belongs to (`None` without authentication).
    pub principal: Option<Principal>,
}

/// The server's file-change signal, shared by every session of the process.
#[derive(Debug)]
pub struct Changes {
    files: broadcast::Sender<FilesChanged>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            files: broadcast::Sender::new(FILE_CHANGES_BUFFER),
        }
    }
}

impl Changes {
    /// Tells every listener that may see `sandbox` that its files changed. Never fails: with
    /// nobody listening there is nobody to tell.
    pub fn files_changed(&self, sandbox: &Sandbox) {
        let _ = self.files.send(FilesChanged {
            principal: sandbox.principal.clone(),
        });
    }
}

/// What a server can tell a listener of: the tool list with code mode on (`upstreams`), the
/// sandboxes' files with `--stateful` (`stateful`).
pub struct Sources<'a> {
    pub changes: &'a Changes,
    /// The tool-list change signal, with code mode.
    pub tools: Option<watch::Receiver<u64>>,
    pub stateful: bool,
    /// The principal the listen request was authenticated as.
    pub principal: Option<Principal>,
    /// Cancelled when the server starts draining: the stream then ends with its final result
    /// (SEP-2575: graceful server teardown).
    pub draining: CancellationToken,
}

/// `capabilities` with `tools.listChanged` when the tool list can change (code mode): the
/// capability a client needs to see before it listens (MCP spec, tools: capabilities).
pub fn with_list_changed(
    mut capabilities: ServerCapabilities,
    tools_change: bool,
) -> ServerCapabilities {
    if tools_change {
        if let Some(tools) = capabilities.tools.as_mut() {
            tools.list_changed = Some(true);
        }
    }
    capabilities
}

/// The part of `requested` this server can tell of: tool-list changes with code mode
/// (`tools_change`), resource-list changes with `--stateful`; never prompts (it has none) nor
/// single-resource updates (`resources/subscribe` is not offered). rmcp also cuts it down to
/// the advertised capabilities before acknowledging it (SEP-2575).
pub fn accepted_filter(
    requested: &SubscriptionFilter,
    tools_change: bool,
    stateful: bool,
) -> SubscriptionFilter {
    let mut accepted = SubscriptionFilter::new();
    let asked = |flag: Option<bool>, offered: bool| (flag == Some(true) && offered).then_some(true);
    accepted.tools_list_changed = asked(requested.tools_list_changed, tools_change);
    accepted.resources_list_changed = asked(requested.resources_list_changed, stateful);
    accepted
}

/// Serves one acknowledged `subscriptions/listen` stream until the client cancels it (then
/// rmcp sends nothing more), its transport is gone, or the server drains (then it ends with
/// the final `SubscriptionsListenResult`).
///
/// Errors: none of its own; a notification that cannot be sent ends the stream.
pub async fn serve(
    subscription: SubscriptionContext,
    sources: Sources<'_>,
) -> Result<(), McpError> {
    let sink = subscription.sink().clone();
    let accepted = subscription.accepted().clone();
    let mut tools = sources
        .tools
        .filter(|_| accepted.tools_list_changed == Some(true));
    let mut files = (sources.stateful && accepted.resources_list_changed == Some(true))
        .then(|| sources.changes.files.subscribe());
    loop {
        let told = tokio::select! {
            () = subscription.cancelled() => return Ok(()),
            () = sources.draining.cancelled() => return Ok(()),
            changed = next_tools_change(tools.as_mut()) => match changed {
                true => sink.notify_tool_list_changed().await,
                false => { tools = None; Ok(()) }
            },
            change = next_file_change(files.as_mut(), sources.principal.as_ref()) => match change {
                FileChange::Seen => sink.notify_resource_list_changed().await,
                FileChange::Closed => { files = None; Ok(()) }
            },
        };
        if let Err(error) = told {
            if !matches!(error, SubscriptionSendError::SubscriptionClosed) {
                tracing::debug!("listen stream {:?} ends: {error}", sink.id());
            }
            return Ok(());
        }
    }
}

/// The next change of the tool list: `true` when it changed, `false` when the signal is gone
/// (it never changes again); never ready without `tools`.
async fn next_tools_change(tools: Option<&mut watch::Receiver<u64>>) -> bool {
    match tools {
        Some(tools) => tools.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

/// What a listener's file-change receiver gave.
enum FileChange {
    /// A change (or changes missed while the listener lagged) it may see.
    Seen,
    /// The signal is gone.
    Closed,
}

/// The next file change that a listener authenticated as `principal` may see (its own
/// principal's sandboxes, SEP-2575 listener scoping as this server decides it: never another
/// principal's); never ready without `files`.
async fn next_file_change(
    files: Option<&mut broadcast::Receiver<FilesChanged>>,
    principal: Option<&Principal>,
) -> FileChange {
    let Some(files) = files else {
        return std::future::pending().await;
    };
    loop {
        match files.recv().await {
            Ok(change) if change.principal.as_ref() == principal => return FileChange::Seen,
            Ok(_) => continue,
            // Missed some: they may have been its own, so it is told once for all.
            Err(broadcast::error::RecvError::Lagged(_)) => return FileChange::Seen,
            Err(broadcast::error::RecvError::Closed) => return FileChange::Closed,
        }
    }
}

/// For a 2025-11-25 session (stdio, SSE, a stateful streamable-HTTP session) that finished
/// its `initialize` handshake: sends `notifications/tools/list_changed` to its client at every
/// change of `tools` until `ended` (the session is over) or the client is gone.
pub fn tell_session(
    peer: Peer<RoleServer>,
    mut tools: watch::Receiver<u64>,
    ended: CancellationToken,
) {
    tools.mark_unchanged();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = ended.cancelled() => return,
                changed = tools.changed() => if changed.is_err() { return },
            }
            if peer.notify_tool_list_changed().await.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str) -> Option<Principal> {
        Some(Principal(name.to_owned()))
    }

    #[test]
    fn only_what_the_server_can_tell_of_is_accepted() {
        let everything = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .resource_subscription("sandbox://sbx_x/a.txt")
            .build();
        let accepted = accepted_filter(&everything, true, false);
        assert_eq!(accepted.tools_list_changed, Some(true));
        assert_eq!(accepted.resources_list_changed, None);
        assert_eq!(accepted.prompts_list_changed, None);
        assert_eq!(accepted.resource_subscriptions, None);
        let accepted = accepted_filter(&SubscriptionFilter::new(), true, true);
        assert_eq!(accepted, SubscriptionFilter::new());
    }

    #[test]
    fn tools_list_changed_is_advertised_only_when_the_list_can_change() {
        let plain = ServerCapabilities::builder().enable_tools().build();
        let tools = |c: ServerCapabilities| c.tools.and_then(|t| t.list_changed);
        assert_eq!(tools(with_list_changed(plain.clone(), false)), None);
        assert_eq!(tools(with_list_changed(plain, true)), Some(true));
    }

    #[tokio::test]
    async fn a_listener_hears_of_its_own_principals_files_only() {
        let changes = Changes::default();
        let mut receiver = changes.files.subscribe();
        for who in [principal("bob"), None, principal("alice")] {
            let _ = changes.files.send(FilesChanged { principal: who });
        }
        drop(changes);
        let alice = principal("alice");
        // Bob's and the unauthenticated change are skipped; alice's is heard; then the end.
        assert!(matches!(
            next_file_change(Some(&mut receiver), alice.as_ref()).await,
            FileChange::Seen
        ));
        assert!(matches!(
            next_file_change(Some(&mut receiver), alice.as_ref()).await,
            FileChange::Closed
        ));
    }
}
