//! What the HTTP front does for tasks (the MCP tasks extension, SEP-2663) before rmcp sees a
//! request: it names a call's task before the call runs, so that a load balancer can learn
//! where the task's `tasks/*` must go; and it fills in the `Mcp-Name` header that some clients
//! leave out of `tasks/*`.
//!
//! **The `Task-Id` response header.** A `tools/call` that may become a task
//! ([`may_become_task`], by its request `_meta`) gets its task id minted here,
//! put in the request for the handler ([`MintedTask`]) and named in the response's `Task-Id`
//! header, as `Sandbox-Id` names a sandbox. The header is there whether or not the call
//! becomes a task (it is decided a second into the run, after the headers of a streamed
//! response are sent); `deploy/haproxy.cfg` stores it and sends `tasks/*` whose `Mcp-Name` is
//! that id to the same replica.
//!
//! **A missing `Mcp-Name` on `tasks/*`.** The extension says a client MUST set `Mcp-Name` to
//! `params.taskId` on `tasks/get`, `tasks/update` and `tasks/cancel` over streamable HTTP
//! (`specification/draft/tasks.md`, "Streamable HTTP: Routing Headers"), and rmcp refuses
//! such a request without it (-32020, SEP-2243). `fastmcp-tasks` 4.1.4 sends `Mcp-Method` but
//! not `Mcp-Name`, so its polls would all fail. The header exists for intermediaries; the
//! server itself reads the id from the body. So a missing `Mcp-Name` is filled in from the
//! body here; a present one that differs from the body is still refused by rmcp.
//! `deploy/haproxy.cfg` routes such a request by the body's `taskId`.

use crate::server::tasks::{may_become_task, MintedTask, TaskId};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, RequestMetaObject};

/// The response header that names the task a `tools/call` would become.
pub const TASK_RESPONSE_HEADER: &str = "task-id";

/// The SEP-2243 header that names a request's target.
const MCP_NAME_HEADER: &str = "mcp-name";

/// Mints the task id of `message` when it is a `tools/call` that may become a task, and puts
/// it in `parts`' extensions; the id, for the `Task-Id` response header.
pub fn task_of_call(parts: &mut Parts, message: &ClientJsonRpcMessage) -> Option<TaskId> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return None;
    };
    // rmcp moves a request's `_meta` into its extensions as it parses it.
    let capabilities = call
        .extensions
        .get::<RequestMetaObject>()
        .or(call.params.meta.as_ref())
        .and_then(|m| m.client_capabilities());
    if !may_become_task(&call.params.name, capabilities) {
        return None;
    }
    // Without an id here the handler mints its own; the header is then left out.
    let id = TaskId::mint().ok()?;
    parts.extensions.insert(MintedTask(id.clone()));
    Some(id)
}

/// Fills in `Mcp-Name` from the body's `taskId` for a `tasks/*` request that has none (see
/// the module's documentation).
pub fn name_task_request(parts: &mut Parts, message: &ClientJsonRpcMessage) {
    let ClientJsonRpcMessage::Request(request) = message else {
        return;
    };
    let task_id = match &request.request {
        ClientRequest::GetTaskRequest(r) => &r.params.task_id,
        ClientRequest::UpdateTaskRequest(r) => &r.params.task_id,
        ClientRequest::CancelTaskRequest(r) => &r.params.task_id,
        _ => return,
    };
    if parts.headers.contains_key(MCP_NAME_HEADER) {
        return;
    }
    // An id that cannot be a header value is left to rmcp to refuse.
    if let Ok(value) = HeaderValue::from_str(task_id) {
        tracing::debug!("a tasks request without Mcp-Name: named from its body");
        parts.headers.insert(MCP_NAME_HEADER, value);
    }
}
