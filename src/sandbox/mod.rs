//! The sandbox: worker processes that each own one Pyodide, and the front's pool of them
//! (docs/architecture.md §3).

pub mod confine;
pub mod fork_memory;
pub mod fork_server;
pub mod mount;
pub mod net;
pub mod pool;
pub mod process;
pub mod protocol;
pub mod snapshot;
pub mod spares;
pub mod worker;
pub mod worker_main;
pub mod zygote;
