//! The worker protocol: what the front and an interpreter say to each other, declared once and
//! shared by both sides (docs/architecture.md §10). Nothing here runs user code or holds a
//! process: both `src/worker/` (the front's side) and `src/interpreter/` (the confined side)
//! import it, and neither imports the other.
//!
//! - [`frame`]: how a message travels over a pipe, bounded before it is read;
//! - [`messages`]: each [`Request`] and [`Reply`] over the worker's stdin and stdout;
//! - [`control`]: the control socket of a zygote and of the zygote service;
//! - [`launch`]: the hidden command and arguments that start an interpreter;
//! - [`pages`]: linear-memory pages of a checkpoint, and the zygote they are relative to;
//! - [`fetch`]: an HTTP request of user code and its answer, made by the front.
//!
//! The front treats an interpreter as hostile (docs/architecture.md §3): it reads replies under a
//! [`FrameLimits`] chosen per phase (so a worker cannot make the front allocate more than the
//! phase's caps), and a reply for another call, a second answer, or any frame outside a call is
//! a protocol violation that ends the worker.

pub mod control;
pub mod fetch;
pub mod frame;
pub mod launch;
pub mod messages;
pub mod pages;

pub use frame::*;
pub use messages::*;

/// `error` and each of its sources, joined by `: ` (as `anyhow` shows a chain with `{:#}`):
/// how either side words an error that crosses the protocol (a failed host call, a wall that
/// could not be raised, a fetch that failed), so that user code and the front see its causes.
/// A cause whose words already end the text (an error that shows its source itself, as
/// `WorkerError::Died` does) is not repeated.
pub fn error_words(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !text.ends_with(&words) {
            text.push_str(": ");
            text.push_str(&words);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_words;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Shows);

    #[derive(Debug, thiserror::Error)]
    #[error("shows its cause: {0}")]
    struct Shows(#[source] std::io::Error);

    #[test]
    fn each_cause_is_worded_once() {
        let error = Outer(Shows(std::io::Error::other("disk gone")));
        assert_eq!(error_words(&error), "outer: shows its cause: disk gone");
    }
}
