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

    fn fetches_at_once(&self) -> usize {
        self.net.at_once()
    }

    /// The requests within `--max-fetches-per-call` are made (at once); those past it refused.
    async fn fetch(
        &mut self,
        requests: Vec<(FetchRequest, Vec<u8>)>,
    ) -> Vec<(FetchResponse, Vec<u8>)> {
        let left = self.net.per_call().saturating_sub(self.fetches);
        let allowed = requests
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        let mut requests = requests;
        let past = requests.split_off(allowed);
        // `allowed` is at most `left`, a u32.
        self.fetches += u32::try_from(allowed).unwrap_or(u32::MAX);
        let mut answers = self.net.fetch_all(requests, self.within.as_ref()).await;
        let refused = past.iter().map(|(r, _)| (self.net.too_many(r), Vec::new()));
        answers.extend(refused);
        answers
    }

    fn network(&self) -> Option<crate::protocol::RunNetwork> {
        self.net.run_network()
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
