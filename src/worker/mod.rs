//! Workers: the processes that each own one JavaScriptCore and one Pyodide, where user code
//! runs (docs/architecture.md §3), and everything that makes, confines and talks to them.
//!
//! - [`client`]: the front's side of one worker ([`client::Worker`]): every request and its one
//!   reply, under deadlines and caps; [`protocol`]: the frames both sides speak (§10);
//! - [`worker_main`]: the worker's side (`__worker`): boot, confinement, the request loop;
//! - where workers come from: [`snapshot`] (boot or restore; `Launcher`), [`zygote`] (the
//!   front's side of the fork server) and [`fork_server`] (the zygote's side), [`fork_memory`],
//!   [`spares`] (made ahead) and [`pool`] (`--isolation shared`); [`zygote_service`]: one warm
//!   zygote per host and user, shared by every front;
//! - [`confine`]: the second wall (namespaces, Landlock, seccomp); [`process`]: a spawned or
//!   forked process; [`descriptors`]: the descriptors a worker inherits by argument (its
//!   snapshot, a zygote's control socket); [`mount`]: `--mount` data; [`net`]: the front's
//!   `fetch` policy for user code.
//!
//! A worker is not a sandbox: a sandbox (`src/sandbox/`, a layer above) is what a user holds
//! by handle, and takes a worker at its first call. Nothing here imports the layers above (the
//! front, code mode's upstream servers, the sandboxes): the host side of a run (fetches, code
//! mode's tool calls and catalog) comes in as [`client::RunHost`], which the front implements.

pub mod client;
pub mod confine;
pub mod descriptors;
pub mod dirty_pages;
pub mod fork_memory;
pub mod fork_server;
pub mod linear_memory;
pub mod mount;
pub mod net;
pub mod pool;
pub mod process;
pub mod protocol;
pub mod snapshot;
pub mod spares;
pub mod worker_main;
pub mod zygote;
pub mod zygote_service;
