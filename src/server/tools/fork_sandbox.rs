//! `fork_sandbox` (`--stateful`): once the calls that arrived before it are done,
//! makes a new sandbox that starts as a copy of the one named (else the session's) as its last
//! completed call left it: its interpreter state (the checkpoint the sandbox keeps: globals,
//! imported modules, installed packages), its files (the front's copies) and its
//! `dependencies`. From then on the two are independent. The copy takes the source's
//! interpreter, which holds that state, with `random` reseeded as `os.fork` does
//! (`crate::server::call::fork`), or, when the source holds none, its first call restores the
//! state into a new interpreter; either way that call says in its `state` note that it started
//! as a fork (never naming the source: a handle is a capability).
//!
//! The copy belongs to the caller's principal and counts against `--max-sandboxes` as
//! `create_sandbox`'s sandboxes do. A sandbox whose last call left a state that could not be
//! captured (Python holds a JavaScript object, its interpreter was not forked from the zygote
//! …) is not forked: the tool error says why, and nothing is made. A sandbox that never ran
//! code is copied as its files and dependencies.

use super::create_sandbox::idle_words;
use super::list_sandbox_files::SandboxArguments;
use super::reach::{InUse, Reached, SourceSandbox};
use super::schema::{object_schema, open_ended, sandbox_id_property, sandbox_tool, Effect};
use super::{structured_answer, tool_error, McpTool};
use crate::sandbox::arrival::Arrival;
use crate::sandbox::handle::SandboxId;
use crate::sandbox::registry::Missing;
use crate::server::call::fork::ForkCopy;
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The tool (see the module's documentation).
pub struct ForkSandbox;

#[async_trait::async_trait]
impl McpTool for ForkSandbox {
    const NAME: &'static str = "fork_sandbox";
    const STATEFUL_ONLY: bool = true;
    type Arguments = SandboxArguments;
    type Sandbox = SourceSandbox;

    /// An optional `sandbox_id` (the source); additive, closed world.
    fn definition(_stateful: bool) -> Tool {
        let output = object_schema(
            json!({"sandbox_id": {"type": "string", "description": "The copy: pass it as `sandbox_id` to the other tools"}}),
            &["sandbox_id"],
        );
        sandbox_tool(
            Self::NAME,
            "Fork a Python sandbox",
            "Copy a sandbox into a new one and return the new one's id: it starts with the variables, functions, imports, installed packages and files the sandbox had after its last completed call, and from then on the two are independent (try one approach in each). A sandbox with a call in flight is forked after that call. A sandbox whose state cannot be copied (for example Python holds a JavaScript object from `import js`) is not forked: the error says why, and nothing is made.",
            object_schema(
                json!({"sandbox_id": sandbox_id_property("The sandbox to copy, as a result or create_sandbox named it; may be left out by a client with a session, for the connection's own sandbox")}),
                &[],
            ),
            Effect::Additive,
        )
        .with_raw_output_schema(Arc::new(open_ended(output)))
    }

    /// After the source's earlier calls, copies it into a new sandbox (see the module's
    /// documentation; the copy is [`Executor::fork`](crate::server::call::execute::Executor)'s).
    async fn call(
        server: &RunPythonServer,
        _arguments: SandboxArguments,
        SourceSandbox(source): SourceSandbox,
        _request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arrival = context.extensions.get::<Arrival>();
        // Held while the copy is made: no later call of the source runs meanwhile.
        let mut turn = source.sandbox.queue(arrival).await;
        if source.sandbox.has_ended() {
            // Destroyed (or expired) by a request that arrived before this one.
            return Ok(tool_error(Missing::of(source.sandbox.id.as_str())));
        }
        let kept = match source.sandbox.state.for_fork(&source.sandbox.id) {
            Ok(kept) => kept,
            Err(why) => {
                return Ok(tool_error(format!(
                    "the sandbox was not forked and nothing was made: the interpreter state its last completed call left cannot be copied ({why})"
                )))
            }
        };
        let fork = match server.create_for(context, source.sandbox.makeup()).await {
            Ok(fork) => fork,
            Err(full) => return Ok(tool_error(full)),
        };
        let executor = &server.executor;
        let forked = executor.fork(&mut turn, &source.sandbox, &fork, kept).await;
        drop(turn);
        drop(source);
        let in_use = InUse::new(fork.clone(), Reached::Named);
        if let Some(note) = server.save(&in_use).await {
            tracing::warn!("sandbox {}: {note}", fork.id.short());
        }
        let text = answer_text(&fork.id, &forked, server.registry.idle());
        Ok(structured_answer(
            text,
            json!({"sandbox_id": fork.id.as_str()}),
        ))
    }
}

/// The answer's text: the copy's id, what it starts with, and how long it lasts (`idle`: the
/// registry's idle expiry).
fn answer_text(id: &SandboxId, forked: &ForkCopy, idle: Option<Duration>) -> String {
    let mut text = if forked.had_state {
        format!("Forked the sandbox into a new one, {id}: it starts as a copy of the sandbox as its last completed call left it (variables, functions, imports, installed packages and files), and from now on the two are independent.")
    } else {
        format!("Forked the sandbox into a new one, {id}: the sandbox held no interpreter state to copy (no completed call in its current interpreter, or an interpreter not forked from a zygote, as with `--no-zygote`), so the new one starts with its files and dependencies only, and from now on the two are independent.")
    };
    if let Some(words) = forked.not_copied_words() {
        text.push_str(&format!(" Note: {words}."));
    }
    text.push_str(&format!(
        " Pass \"sandbox_id\": \"{id}\" to run_python_code and the file tools to work in the new one; it lasts until destroy_sandbox ends it, or until it has had no call for {}.",
        idle_words(idle)
    ));
    text
}
