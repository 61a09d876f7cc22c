//! Which sandbox a tool call works in (docs/architecture.md §3.1): the one its `sandbox_id`
//! names; else, where the request has a session (a stdio connection, a 2025-11-25
//! streamable-HTTP request carrying `Mcp-Session-Id`, an SSE stream), the session's default
//! sandbox; else, for `run_python_code` with `--stateful`, a new sandbox whose handle the
//! answer names; without `--stateful`, a sandbox for that one call. A tool says which of these
//! it accepts by its [`McpTool::Sandbox`](super::McpTool::Sandbox) type, an [`Opening`].
//!
//! Also here: what happens to a sandbox after a call changed it (saved to the state directory,
//! the session's client told its resources changed).

use super::Reach;
use crate::sandbox::activity::InFlight;
use crate::sandbox::handle::SandboxId;
use crate::sandbox::live::{Makeup, Owner, Sandbox};
use crate::sandbox::registry::{self, Missing, OpenError, RegistryError};
use crate::sandbox::state_dir::StateError;
use crate::server::handler::{http_extension, RunPythonServer};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use std::sync::Arc;

/// How a request came to its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// By the `sandbox_id` it gave.
    Named,
    /// The session's default sandbox (no `sandbox_id`, a transport with a session).
    SessionDefault,
    /// Made for this call (`--stateful`, no `sandbox_id`, no session): the answer names it.
    Created,
    /// Made for this call and ended after it (the drop-in mode without a session).
    OneCall,
}

/// The sandbox a request works in, held in flight (neither evicted nor expired) while the
/// request runs; a [`Reached::OneCall`] sandbox ends when this is dropped.
pub struct InUse {
    pub sandbox: Arc<Sandbox>,
    pub reached: Reached,
    _in_flight: InFlight,
}

impl InUse {
    /// `sandbox`, reached as `reached`, held in flight.
    pub fn new(sandbox: Arc<Sandbox>, reached: Reached) -> InUse {
        let in_flight = sandbox.begin();
        InUse {
            sandbox,
            reached,
            _in_flight: in_flight,
        }
    }

    /// A sandbox the registry opened by its handle (already held in flight).
    fn entered(entered: registry::Entered) -> InUse {
        InUse {
            sandbox: entered.sandbox,
            reached: Reached::Named,
            _in_flight: entered.in_flight,
        }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if self.reached == Reached::OneCall {
            self.sandbox.end();
        }
    }
}

/// What a request without `sandbox_id` and without a session gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutHandle {
    /// A new sandbox (`run_python_code`, mcp-python-code-interpreter's empty `session_id`).
    Create,
    /// A refusal that asks for the handle (the file tools: nothing is made behind the caller's
    /// back).
    Refuse,
}

/// Why a request has no sandbox to work in; answered as a tool error (`isError`), so that the
/// model reads the words and can act on them.
#[derive(Debug, thiserror::Error)]
pub enum NoSandbox {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("this request has no session, so it must name its sandbox: pass `sandbox_id` as a result or create_sandbox named it")]
    NeedsHandle,
}

impl From<Missing> for NoSandbox {
    fn from(missing: Missing) -> NoSandbox {
        NoSandbox::Open(missing.into())
    }
}

/// What a tool's call is handed besides its arguments, found before its handler runs.
#[async_trait::async_trait]
pub trait Opening: Sized + Send {
    /// What transports learn of tools whose calls open this way.
    const REACH: Reach;

    /// Finds it for a call whose arguments name `named` (a `sandbox_id` as given).
    ///
    /// Errors: [`NoSandbox`], which the model reads as a tool error.
    async fn open(
        server: &RunPythonServer,
        named: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Self, NoSandbox>;
}

/// The sandbox named, else the session's, else a new one (`run_python_code`).
pub struct AnySandbox(pub InUse);

/// The sandbox named, else the session's; never one made behind the caller's back (the tools
/// that read, write or reset a sandbox).
pub struct ExistingSandbox(pub InUse);

/// Nothing opened before the call: the tool makes its sandbox (`create_sandbox`).
pub struct NewSandbox;

/// The sandbox a new one is copied from (`fork_sandbox`): the one named, else the session's;
/// never one made behind the caller's back. The tool makes the copy, under the handle the
/// HTTP front minted for it ([`MintedSandbox`]).
pub struct SourceSandbox(pub InUse);

/// The sandbox a required `sandbox_id` names, opened (so that one saved by another replica is
/// found too) and taken out of the registry: later uses of its handle get [`Missing`]. The
/// tool ends it (`destroy_sandbox`).
pub struct RemovedSandbox(pub Arc<Sandbox>);

/// The sandboxes a call works in rather than makes or ends: the one named, else the session's,
/// else what [`WorksIn::WITHOUT`] says.
pub trait WorksIn: Sized + Send {
    /// What a call without `sandbox_id` and without a session gets.
    const WITHOUT: WithoutHandle;
    /// The sandbox found, handed to the tool.
    fn wrap(in_use: InUse) -> Self;
}

impl WorksIn for AnySandbox {
    const WITHOUT: WithoutHandle = WithoutHandle::Create;
    fn wrap(in_use: InUse) -> Self {
        AnySandbox(in_use)
    }
}

impl WorksIn for ExistingSandbox {
    const WITHOUT: WithoutHandle = WithoutHandle::Refuse;
    fn wrap(in_use: InUse) -> Self {
        ExistingSandbox(in_use)
    }
}

#[async_trait::async_trait]
impl<T: WorksIn> Opening for T {
    const REACH: Reach = Reach::Uses(T::WITHOUT);

    async fn open(
        server: &RunPythonServer,
        named: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Self, NoSandbox> {
        let in_use = server.sandbox_for(named, context, T::WITHOUT).await?;
        Ok(T::wrap(in_use))
    }
}

#[async_trait::async_trait]
impl Opening for NewSandbox {
    const REACH: Reach = Reach::Makes;

    async fn open(
        _server: &RunPythonServer,
        _named: Option<&str>,
        _context: &RequestContext<RoleServer>,
    ) -> Result<Self, NoSandbox> {
        Ok(NewSandbox)
    }
}

#[async_trait::async_trait]
impl Opening for SourceSandbox {
    const REACH: Reach = Reach::Forks;

    async fn open(
        server: &RunPythonServer,
        named: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Self, NoSandbox> {
        let in_use = server
            .sandbox_for(named, context, WithoutHandle::Refuse)
            .await?;
        Ok(SourceSandbox(in_use))
    }
}

#[async_trait::async_trait]
impl Opening for RemovedSandbox {
    const REACH: Reach = Reach::Ends;

    async fn open(
        server: &RunPythonServer,
        named: Option<&str>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Self, NoSandbox> {
        let id = registry::named(named.ok_or(NoSandbox::NeedsHandle)?)?;
        let principal = server.principal_of(context);
        drop(server.registry.open(&id, principal.as_ref()).await?);
        Ok(RemovedSandbox(server.registry.remove_named(&id)?))
    }
}

/// The handle the HTTP front minted for the sandbox a request will make, if it makes one
/// (a sessionless `run_python_code` without `sandbox_id`, `create_sandbox`, `fork_sandbox`):
/// named in the
/// response's `Sandbox-Id` header before the call runs, so that a load balancer learns where
/// the sandbox lives from the first answer (README "Running many replicas"). Set in the HTTP request's extensions.
#[derive(Debug, Clone)]
pub struct MintedSandbox(pub SandboxId);

impl RunPythonServer {
    /// A new sandbox reached by its handle, belonging to `context`'s principal, of `makeup`
    /// (its dependencies and runtime): under the handle the HTTP front minted for the request (and named in its
    /// response header), else a fresh one.
    ///
    /// Errors: [`RegistryError`] when no handle could be minted or `--max-sandboxes` leaves no
    /// room.
    pub async fn create_for(
        &self,
        context: &RequestContext<RoleServer>,
        makeup: Makeup,
    ) -> Result<Arc<Sandbox>, RegistryError> {
        self.registry.settle_for_room().await;
        let id = match http_extension::<MintedSandbox>(context) {
            Some(minted) => minted.0.clone(),
            None => SandboxId::mint()?,
        };
        let principal = self.principal_of(context);
        self.registry
            .create_as(id, Owner::Handle, makeup, principal)
    }

    /// The sandbox a request works in: the one `named` names, else the session's default, else
    /// (`without`) a new one or a refusal. Without `--stateful` a sessionless call gets a
    /// sandbox of its own that ends with it.
    ///
    /// Errors: [`NoSandbox`]: a malformed, unknown, ended or expired handle; no room under
    /// `--max-sandboxes`; no handle where one is needed.
    async fn sandbox_for(
        &self,
        named: Option<&str>,
        context: &RequestContext<RoleServer>,
        without: WithoutHandle,
    ) -> Result<InUse, NoSandbox> {
        let principal = self.principal_of(context);
        if let Some(text) = named {
            let id = registry::named(text)?;
            let entered = self.registry.open(&id, principal.as_ref()).await?;
            return Ok(InUse::entered(entered));
        }
        let (sandbox, reached) = match (self.session_of(context), self.stateful(), without) {
            (Some(session), _, _) => {
                if session.current_default().is_none() {
                    self.registry.settle_for_room().await;
                }
                let sandbox = session.default_sandbox(principal.clone())?;
                if !sandbox.belongs_to(principal.as_ref()) {
                    return Err(Missing::of(sandbox.id.as_str()).into());
                }
                (sandbox, Reached::SessionDefault)
            }
            (None, true, WithoutHandle::Create) => (
                self.create_for(context, Makeup::default()).await?,
                Reached::Created,
            ),
            (None, true, WithoutHandle::Refuse) => return Err(NoSandbox::NeedsHandle),
            (None, false, _) => (
                Sandbox::for_one_call().map_err(RegistryError::from)?,
                Reached::OneCall,
            ),
        };
        Ok(InUse::new(sandbox, reached))
    }

    /// After a completed call or file operation in `in_use`: saves its sandbox to the state
    /// directory (`--state-dir`), before the answer goes out, so that another replica that
    /// gets its next call finds this call's files. A `state` note when the save failed.
    pub async fn save(&self, in_use: &InUse) -> Option<String> {
        if in_use.reached == Reached::OneCall {
            return None;
        }
        match self.registry.save(&in_use.sandbox).await {
            Ok(()) => None,
            Err(e @ StateError::Superseded { .. }) => Some(format!(
                "moved: {e} while this call ran, so this call's changes to its files are not kept there; its next call runs on that replica"
            )),
            Err(e) => {
                tracing::error!("sandbox {}: {e}", in_use.sandbox.id.short());
                Some(format!("unsaved: {e}; this call's files are kept on this replica only"))
            }
        }
    }

    /// Tells a session's client that its resources changed, when `in_use` is its default
    /// sandbox (the only one `resources/list` shows; MCP spec, resources: `list_changed`);
    /// and the `subscriptions/listen` streams that may see the sandbox (SEP-2575,
    /// [`crate::server::listen`]), for any sandbox that outlives the call.
    pub async fn files_changed(&self, in_use: &InUse, context: &RequestContext<RoleServer>) {
        if in_use.reached != Reached::OneCall {
            self.changes.files_changed(&in_use.sandbox);
        }
        if in_use.reached == Reached::SessionDefault {
            let _ = context.peer.notify_resource_list_changed().await;
        }
    }
}
