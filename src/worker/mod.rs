//! Workers, as the front holds them: the handle on each interpreter process (`src/interpreter/`,
//! where user code runs), and everything the front does to make, start and talk to one
//! (docs/architecture.md §3). Nothing here runs confined; the wire between the two sides is
//! [`crate::protocol`].
//!
//! - [`client`]: the front's side of one worker ([`client::Worker`]): every request and its one
//!   reply, under deadlines and caps;
//! - where workers come from: [`launcher`] (boot or restore; `Launcher`), [`zygote_client`] (the
//!   front's side of a zygote), [`spares`] (made ahead) and [`pool`] (`--isolation shared`);
//!   [`zygote_service`]: one warm zygote per host and user, shared by every front;
//! - [`process`]: a spawned or forked process; [`spawn`]: what the front does between `fork`
//!   and `exec`; [`mount`]: `--mount` data, read once; [`net`]: the front's `fetch` policy for
//!   user code; [`scientific`]: the scientific runtime's artifacts and compiled module, made
//!   ready in the cache.
//!
//! A worker is not a sandbox: a sandbox (`src/sandbox/`, a layer above) is what a user holds
//! by handle, and takes a worker at its first call. Nothing here imports the layers above (the
//! front, code mode's upstream servers, the sandboxes): the host side of a run (fetches, code
//! mode's tool calls and catalog) comes in as [`client::RunHost`], which the front implements.

pub mod client;
pub mod launcher;
pub mod mount;
pub mod net;
pub mod pool;
pub mod process;
pub mod scientific;
pub mod spares;
pub mod spawn;
pub mod zygote_client;
pub mod zygote_service;
