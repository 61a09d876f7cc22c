//! The MCP front: tool schema, result formatting, the call pipeline and the transports.

pub mod errors;
pub mod execute;
pub mod format;
pub mod handler;
pub mod http;
pub mod idle;
pub mod resources;
pub mod session_files;
pub mod sse;
pub mod startup_deps;
pub mod stdio;
pub mod tool;
pub mod unread_body;
