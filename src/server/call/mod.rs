//! The pipeline of one call (docs/architecture.md §3–§5): [`execute`] finds or makes its
//! worker, installs what it needs, runs it under its deadline and caps, and keeps the
//! sandbox's files through [`files`]; [`queue`] admits calls and decides who shares a worker;
//! [`run_host`] is the server's side of a run (fetches, code mode's tool calls); [`outcome`]
//! reads how a run ended into its result; [`result`] is what a call produced, before it is
//! rendered; [`state_note`] words what a `--stateful` result says of lost state;
//! [`startup_deps`] plans `--deps` once for every worker; [`checkpoints`] keeps a sandbox's
//! interpreter state across its workers (docs/architecture.md §3.4), and [`adopt`] hands it,
//! with the sandbox's files, to a new worker; [`fork`] copies a sandbox into a new one;
//! [`runtimes`] holds each runtime's workers, and makes the second one when first asked for.

pub mod adopt;
pub mod checkpoints;
pub mod execute;
pub mod files;
pub mod fork;
pub mod outcome;
pub mod queue;
pub mod result;
pub mod run_host;
pub mod runtimes;
pub mod startup_deps;
pub mod state_note;
