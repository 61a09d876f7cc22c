//! Tenancy: sandboxes and the registry that owns them for every transport
//! (docs/architecture.md §3).
//!
//! A sandbox is one interpreter with its files and, with `--stateful`, its globals, addressed
//! by a handle the server mints ([`handle`]). MCP revision 2026-07-28 removed protocol sessions
//! (SEP-2567, SEP-2575), so state that spans calls travels in that handle, passed back by the
//! model as the `sandbox_id` tool argument; where a transport still has a session (a stdio
//! connection, a 2025-11-25 streamable-HTTP session, an SSE stream) the session owns a default
//! sandbox. The registry ([`registry`]) bounds how many live and ends the idle and the old.

pub mod activity;
pub mod files;
pub mod handle;
pub mod registry;
pub mod sandbox;
pub mod state_dir;
