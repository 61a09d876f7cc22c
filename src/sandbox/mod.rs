//! Sandboxes: what users hold by handle, and the registry that owns them for every transport
//! (docs/architecture.md §3.1).
//!
//! A sandbox ([`live::Sandbox`]) is one worker slot with its files and, with `--stateful`, its
//! globals, addressed by a handle the server mints ([`handle::SandboxId`]). MCP revision
//! 2026-07-28 removed protocol sessions (SEP-2567, SEP-2575), so state that spans calls travels
//! in that handle, passed back by the model as the `sandbox_id` tool argument; where a
//! transport still has a session (a stdio connection, a 2025-11-25 streamable-HTTP session, an
//! SSE stream) the session owns a default sandbox. The registry ([`registry`]) bounds how many
//! live and ends the idle and the old; [`state_dir`] saves them for other replicas
//! (`--state-dir`); [`files`] keeps their files; [`activity`] tells in flight from idle;
//! [`checkpoint`] holds an interpreter's memory as the pages that differ from its zygote's,
//! and the sealed file that carries it through the state directory.
//!
//! Below the front, above the workers: this folder imports [`crate::worker`], never the
//! front (`src/server/`).

pub mod activity;
pub mod arrival;
pub mod checkpoint;
pub mod files;
pub mod handle;
pub mod hibernation;
pub mod kept;
pub mod live;
pub mod notes;
pub mod registry;
pub mod saves;
pub mod state_dir;

/// Most requirements a sandbox is made with (`create_sandbox`'s `dependencies`), and so the most
/// a saved sandbox may name.
pub const MAX_DEPENDENCIES: usize = 64;
