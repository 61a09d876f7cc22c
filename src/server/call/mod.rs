//! The pipeline of one call (docs/architecture.md §3–§5): [`execute`] queues it, finds or
//! makes its worker, installs what it needs, runs it under its deadline and caps, and keeps
//! the sandbox's files; [`run_host`] is the server's side of a run (fetches, code mode's tool
//! calls); [`startup_deps`] plans `--deps` once for every worker.

pub mod execute;
pub mod run_host;
pub mod startup_deps;
