//! The transports, one per file (rmcp's layout): [`stdio`], [`http`] (streamable HTTP, with
//! and without sessions) and [`sse`] (the legacy 2024-11-05 HTTP+SSE), and what they share:
//! [`unread_body`] (a request body bounded before it is read), [`oversized`] (the id of a
//! message over the cap), [`event_store`] (SSE events kept for `Last-Event-ID`),
//! [`request_streams`] (a request's notifications on its own stream) and [`task_routing`] (the
//! headers of the tasks extension over HTTP).
//!
//! A transport reads messages and hands them to [`crate::server::handler`]; it decides no
//! tool's behaviour. What a tool is to a transport (whether it makes a sandbox, which argument
//! names one) it asks the tool table ([`crate::server::tools`]).

pub mod event_store;
pub mod http;
pub mod oversized;
pub mod request_streams;
pub mod sse;
pub mod stdio;
pub mod task_routing;
pub mod unread_body;
