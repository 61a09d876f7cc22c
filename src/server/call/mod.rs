//! The pipeline of one call (docs/architecture.md §3–§5): [`execute`] queues it, finds or
//! makes its worker, installs what it needs, runs it under its deadline and caps, and keeps
//! the sandbox's files; [`startup_deps`] plans `--deps` once for every worker.

pub mod execute;
pub mod startup_deps;
