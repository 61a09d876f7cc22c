//! Operating a server: [`auth`] (bearer tokens, RFC 9728 metadata), [`drain`] (SIGTERM),
//! [`health`] (`/healthz`, `/readyz`), [`scrape`] (`/metrics`) and [`idle`] (session expiry).

pub mod auth;
pub mod drain;
pub mod health;
pub mod idle;
pub mod scrape;
