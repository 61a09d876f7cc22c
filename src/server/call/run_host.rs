//! The front's side of one run ([`RunHost`]): what the code of one `run_python_code` call gets
//! from the server while it runs. Its fetches go through the operator's network policy
//! (`--allow-net`); in code mode (`--tools-config`) its tool and host function calls
//! go to the upstream servers and the launcher, under the call's [`ToolBudget`], named upstream
//! by the sandbox's tag.
//!
//! It lives here, above the workers, because it joins what the workers must not know of: the
//! upstream servers and the sandboxes (`src/worker/` imports neither).

use crate::code_mode::{sandbox_tag, ToolBudget, Upstreams};
use crate::protocol::fetch::{FetchRequest, FetchResponse};
use crate::protocol::{FunctionCall, ToolAnswer, ToolCall};
use crate::worker::client::{CatalogUpdate, RunHost};
use crate::worker::net::allow_list::AllowList;
use crate::worker::net::NetPolicy;

/// What the code of one call may reach while it runs.
pub struct CallRunHost<'a> {
    /// Which hosts the code's fetches may reach (`--allow-net`).
    net: &'a NetPolicy,
    /// The sandbox's own narrower list (`create_sandbox`'s `allow_net`); `None`: the server's.
    within: Option<AllowList>,
    /// Requests the code made so far (bounded by `--max-fetches-per-call`).
    fetches: u32,
    /// Code mode's upstream servers for this call; `None` without `--tools-config`.
    code_mode: Option<CodeMode<'a>>,
}

/// The upstream side of one call in code mode.
struct CodeMode<'a> {
    upstreams: &'a Upstreams,
    /// Names the sandbox in the upstream requests' `_meta` ([`sandbox_tag`]).
    sandbox: String,
    /// What the call may still spend on tool calls (`--max-tool-calls`, `--max-tool-bytes`).
    budget: ToolBudget,
}

impl<'a> CallRunHost<'a> {
    /// The host of one call of the sandbox whose handle is `handle`: fetches under `net`'s
    /// policy and, when it gives one, the sandbox's narrower list ([`NetPolicy::narrowed`]);
    /// with `upstreams` (code mode), tool calls within a fresh budget of their limits.
    pub fn new(
        (net, within): (&'a NetPolicy, Option<AllowList>),
        upstreams: Option<&'a Upstreams>,
        handle: &str,
    ) -> Self {
        CallRunHost {
            net,
            within,
            fetches: 0,
            code_mode: upstreams.map(|upstreams| CodeMode {
                upstreams,
                sandbox: sandbox_tag(handle),
                budget: ToolBudget::new(upstreams.limits),
            }),
        }
    }
}

/// The answer to a tool or function call on a server without code mode.
fn no_code_mode() -> ToolAnswer {
    ToolAnswer::Error {
        message: "this server has no MCP tools or host functions to call (no --tools-config)"
            .into(),
    }
}

#[async_trait::async_trait]
impl RunHost for CallRunHost<'_> {
    fn max_request_bytes(&self) -> usize {
        self.net.max_request_bytes()
    }

    async fn fetch(&mut self, request: &FetchRequest, body: Vec<u8>) -> (FetchResponse, Vec<u8>) {
        if self.fetches >= self.net.per_call() {
            return (self.net.too_many(request), Vec::new());
        }
        self.fetches += 1;
        self.net.fetch(request, body, self.within.as_ref()).await
    }

    fn environment(&self) -> Vec<(String, String)> {
        self.net.environment()
    }

    fn catalog(&self, known: u64) -> Option<CatalogUpdate> {
        let published = self.code_mode.as_ref()?.upstreams.published();
        let version = published.catalog.version;
        Some(CatalogUpdate {
            version,
            tools: (version != known).then(|| published.for_worker.clone()),
        })
    }

    async fn call_tool(&mut self, call: ToolCall) -> (ToolAnswer, Vec<Vec<u8>>) {
        match &mut self.code_mode {
            Some(mode) => {
                let calling = mode.upstreams.call(call, &mode.sandbox, &mut mode.budget);
                calling.await
            }
            None => (no_code_mode(), Vec::new()),
        }
    }

    async fn call_function(&mut self, call: FunctionCall) -> ToolAnswer {
        match &mut self.code_mode {
            Some(mode) => {
                let calling = mode
                    .upstreams
                    .call_function(call, &mode.sandbox, &mut mode.budget);
                calling.await
            }
            None => no_code_mode(),
        }
    }
}
