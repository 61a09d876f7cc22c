//! Packages (docs/architecture.md §5): PEP 723 metadata, the Pyodide lock file, the PyPI JSON API, the
//! download cache and the resolver policy. Runs in the front only; workers never download.

pub mod bounds;
pub mod cache;
pub mod download;
pub mod index;
pub mod install;
pub mod lock;
pub mod metadata;
pub mod pep723;
pub mod provider;
pub mod requirement;
pub mod resolver;
pub mod scientific;
pub mod sources;
pub mod wheel;
