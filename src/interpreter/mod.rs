//! The interpreter: the confined process that owns one JavaScriptCore and one Pyodide, where
//! user code runs (docs/architecture.md §3). Everything in this folder runs inside that process
//! (or its zygote) and nowhere else; most of it after the second wall is up, under seccomp
//! (docs/architecture.md §3.2). It speaks to the front only through [`crate::protocol`], and
//! imports nothing of the front (`tests/layering.rs`).
//!
//! - [`serve`]: the entry (`__worker`): boot, confinement, and the request loop;
//! - [`checkpoint`]: a checkpoint taken between runs, and one restored into a fresh interpreter;
//! - [`fork_server`]: the zygote's side of the fork server; [`fork_memory`]: the zygote's memory
//!   laid out for cheap forks;
//! - [`linear_memory`]: the zygote's pristine memory and a child's shadow of its last
//!   checkpoint; [`dirty_pages`]: which pages a child wrote, told by the kernel;
//! - [`confine`]: the second wall (namespaces, capabilities, Landlock, limits, seccomp);
//!   [`descriptors`]: the descriptors an interpreter inherits by argument.

mod boot;
pub mod checkpoint;
pub mod confine;
pub mod descriptors;
pub mod dirty_pages;
pub mod entry;
mod files;
pub mod fork_memory;
pub mod fork_server;
mod host_calls;
mod install;
pub mod linear_memory;
mod outcome;
mod output;
mod reply;
mod runner;
mod scavenger;
mod scientific;
mod serve;
mod zygote;
