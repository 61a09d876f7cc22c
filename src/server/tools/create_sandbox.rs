//! `create_sandbox` (`--stateful`; SEP-2567's pattern): makes a sandbox of the `runtime` asked
//! for (the server's own, `--runtime`, when none is), installs its `dependencies`, narrows its
//! network to `allow_net` (within `--allow-net`; issue 47), and names its handle in text and
//! in `structuredContent` (`{"sandbox_id": …}`).

use super::reach::{InUse, NewSandbox, Reached};
use super::schema::{object_schema, open_ended, sandbox_tool, Effect};
use super::{parse, structured_answer, tool_error, McpTool, Refusal, ToolArguments};
use crate::protocol::launch::Runtime;
use crate::sandbox::live::Makeup;
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, JsonObject, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Most requirements `create_sandbox` takes.
pub use crate::sandbox::MAX_DEPENDENCIES;

/// Most hosts `create_sandbox`'s `allow_net` takes: a sandbox's list is kept with it, in the
/// state directory too.
pub const MAX_ALLOW_NET: usize = 64;

/// What `allow_net` is, for the model.
const ALLOW_NET_DESCRIPTION: &str = "The hosts this sandbox's code may reach over HTTP(S), narrowing the server's: each a host (`api.example.org`), `*.domain`, an address or a CIDR range, with an optional `:port`, and within the hosts run_python_code's description names. Leave it out for all of those; `[]` for none.";

/// `create_sandbox`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateArguments {
    /// PEP 508 requirements to install before the sandbox is handed out.
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// The runtime of its workers; `None`: the server's own.
    #[serde(default)]
    pub runtime: Option<Runtime>,
    /// The hosts its code may reach, each within the server's `--allow-net`; `None`: all of
    /// those.
    #[serde(default)]
    pub allow_net: Option<Vec<String>>,
}

impl ToolArguments for CreateArguments {
    /// Errors: also `invalid_params` for more than [`MAX_DEPENDENCIES`] requirements.
    fn parse(
        tool: &str,
        _server: &RunPythonServer,
        raw: Option<JsonObject>,
    ) -> Result<CreateArguments, Refusal> {
        let arguments: CreateArguments = parse(tool, raw)?;
        if arguments
            .allow_net
            .as_ref()
            .is_some_and(|a| a.len() > MAX_ALLOW_NET)
        {
            return Err(Refusal::Invalid(McpError::invalid_params(
                format!("`allow_net` lists more than the limit of {MAX_ALLOW_NET} hosts"),
                None,
            )));
        }
        if arguments.dependencies.len() > MAX_DEPENDENCIES {
            return Err(Refusal::Invalid(McpError::invalid_params(
                format!(
                    "`dependencies` lists {} requirements, more than the limit of {MAX_DEPENDENCIES}",
                    arguments.dependencies.len()
                ),
                None,
            )));
        }
        Ok(arguments)
    }

    fn sandbox_id(&self) -> Option<&str> {
        None
    }
}

/// The tool (see the module's documentation).
pub struct CreateSandbox;

#[async_trait::async_trait]
impl McpTool for CreateSandbox {
    const NAME: &'static str = "create_sandbox";
    const STATEFUL_ONLY: bool = true;
    type Arguments = CreateArguments;
    type Sandbox = NewSandbox;

    fn definition(_stateful: bool) -> Tool {
        let schema = object_schema(
            json!({
                "dependencies": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Packages to install before the sandbox is handed out (PEP 508 requirements, e.g. `pandas` or `rich<13`)",
                },
                "runtime": {
                    "type": "string",
                    "enum": Runtime::ALL.map(Runtime::name),
                    "description": RUNTIME_DESCRIPTION,
                },
                "allow_net": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": MAX_ALLOW_NET,
                    "description": ALLOW_NET_DESCRIPTION,
                },
            }),
            &[],
        );
        let output = object_schema(
            json!({"sandbox_id": {"type": "string", "description": "Pass it as `sandbox_id` to the other tools"}}),
            &["sandbox_id"],
        );
        sandbox_tool(
            Self::NAME,
            "Create a Python sandbox",
            "Create a new, empty Python sandbox (its own interpreter and files) and return its id. Pass the id as `sandbox_id` to run_python_code and the file tools to work in it; its variables and files persist between those calls. A sandbox ends when destroyed or after a while without calls; using it then says so.",
            schema,
            Effect::Additive,
        )
        .with_raw_output_schema(Arc::new(open_ended(output)))
    }

    async fn call(
        server: &RunPythonServer,
        arguments: CreateArguments,
        _sandbox: NewSandbox,
        _request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // A runtime that cannot be had makes no sandbox (the other runtime is made ready here,
        // when this is the first sandbox to ask for it).
        if let Err(unavailable) = server.executor.runtime_ready(arguments.runtime).await {
            return Ok(tool_error(format!(
                "the sandbox was not made: {unavailable}"
            )));
        }
        if let Some(entries) = &arguments.allow_net {
            if let Err(wider) = server.executor.settings.net.narrowed(entries) {
                return Ok(tool_error(format!("the sandbox was not made: {wider}")));
            }
        }
        let makeup = Makeup {
            dependencies: arguments.dependencies,
            runtime: arguments.runtime,
            allow_net: arguments.allow_net,
        };
        let sandbox = match server.create_for(context, makeup).await {
            Ok(sandbox) => sandbox,
            Err(full) => return Ok(tool_error(full)),
        };
        let in_use = InUse::new(sandbox.clone(), Reached::Named);
        if let Err(why) = server.executor.prepare(&sandbox).await {
            server.registry.end(&sandbox.id);
            return Ok(tool_error(format!(
                "the sandbox could not be made ready: Error installing dependencies: {why}"
            )));
        }
        if let Some(note) = server.save(&in_use).await {
            tracing::warn!("sandbox {}: {note}", sandbox.id.short());
        }
        let id = &sandbox.id;
        let runtime = match sandbox.runtime {
            Some(runtime) => format!(" ({runtime} runtime)"),
            None => String::new(),
        };
        let text = format!(
            "Created sandbox {id}{runtime}. Pass \"sandbox_id\": \"{id}\" to run_python_code and the file tools to work in it: its variables, imports and files last from call to call until destroy_sandbox ends it, or until it has had no call for {}.",
            idle_words(server.registry.idle())
        );
        Ok(structured_answer(text, json!({"sandbox_id": id.as_str()})))
    }
}

/// What the `runtime` argument offers.
const RUNTIME_DESCRIPTION: &str = "The Python the sandbox runs: `pyodide` (CPython 3.14; installs PyPI's pure-Python wheels and Pyodide's packages as the code needs them, and reaches the hosts the server allows) or `scientific` (CPython 3.15 with numpy, pandas, scipy, scikit-learn, statsmodels, matplotlib, seaborn, sympy and about 50 more built in; installs nothing; reaches the hosts the server allows with urllib.request, and so pandas.read_csv(url)). Leave it out for the server's own runtime, the one run_python_code's description names.";

/// How long a sandbox may go without a call, in words, for the answer that hands one out.
pub(super) fn idle_words(idle: Option<std::time::Duration>) -> String {
    match idle {
        Some(idle) if idle.as_secs() >= 120 => format!("{} minutes", idle.as_secs() / 60),
        Some(idle) => format!("{} seconds", idle.as_secs_f64()),
        None => "ever".to_owned(),
    }
}
