//! The MCP front: everything between a client's bytes and a sandbox, in four rooms and four
//! files (docs/architecture.md §8). Imports run one way: transports → handler → tools → call
//! pipeline → [`crate::sandbox`] → [`crate::worker`].
//!
//! - [`transport`]: the wire: stdio, streamable HTTP, SSE, and what they share (bounded bodies,
//!   the id of an oversized message, the SSE event store);
//! - [`handler`]: rmcp's `ServerHandler`: routes `tools/call` through the tool table, serves
//!   resources and logging, and decides which sandbox a request works in;
//! - [`tools`]: each tool declared once (name, schema, arguments, handler, how it reaches its
//!   sandbox), results rendered as text, sandbox files as resources;
//! - [`call`]: the pipeline of one `run_python_code` call (queue, isolation, dependencies,
//!   worker, deadlines) and the `--deps` plan;
//! - [`ops`]: operating a server: authentication, drain, health, `/metrics`, idle expiry;
//! - [`sessions`]: protocol sessions and their default sandboxes; [`errors`]: the wording of
//!   every JSON-RPC refusal; [`listen`]: telling clients that a list changed
//!   (`subscriptions/listen`, `notifications/*/list_changed`).

pub mod call;
pub mod errors;
pub mod handler;
pub mod listen;
pub mod ops;
pub mod sessions;
pub mod tasks;
pub mod tools;
pub mod transport;
