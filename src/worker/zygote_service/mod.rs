//! One warm zygote per host and user, shared by every front (docs/architecture.md §3.3):
//! stdio processes, `code_sandbox`, FastMCP's `SandboxProvider` and HTTP replicas on the same
//! host fork their workers from it instead of each booting (and warming) its own interpreter.
//! Android's zygote is the model: one long-lived warm process forks every app, over a small,
//! explicit socket protocol that checks the peer's credentials.
//!
//! - [`place`]: where a service lives (a private directory, a socket named by the digest of
//!   what shapes its interpreters) and which service a front may use;
//! - [`service`]: the service's process: the lock, the socket, its own zygote, relaying fork
//!   requests, killing a departed front's workers, idle exit;
//! - [`front`]: a front's side: find the service, start it detached when there is none, and
//!   fork through it;
//! - [`operator`]: `mcp-run-python zygote status` and `zygote stop`.
//!
//! The messages are [`crate::protocol::control::Control`], the same the front and its own zygote speak,
//! so that a fork through the service is the same request, relayed.

pub mod front;
pub mod operator;
pub mod place;
pub mod service;
