//! The MCP front: tool schemas and arguments, result formatting, the call pipeline, sessions
//! and the transports.

pub mod arguments;
pub mod auth;
pub mod drain;
pub mod errors;
pub mod event_store;
pub mod execute;
pub mod format;
pub mod handler;
pub mod health;
pub mod http;
pub mod idle;
pub mod oversized;
pub mod resources;
pub mod sandbox_tools;
pub mod scrape;
pub mod sessions;
pub mod sse;
pub mod startup_deps;
pub mod stdio;
pub mod tool;
pub mod unread_body;
