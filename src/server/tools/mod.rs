//! The tools: `run_python_code` and, with `--stateful`, the sandbox and file tools; how a
//! result is rendered ([`format`]); a sandbox's files as resources ([`resources`]).

pub mod arguments;
pub mod format;
pub mod resources;
pub mod sandbox_tools;
pub mod tool;
