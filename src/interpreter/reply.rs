//! Writing to the front: every reply of the interpreter goes through [`send_with`] on
//! standard output, framed as the worker protocol says (`src/protocol/frame.rs`).

use crate::protocol::{write_frame, FrameError, Reply};
use anyhow::Result;
use std::io::{self, BufWriter};

/// A frame to the front could not be written (to standard output): the worker cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("writing to the front")]
pub(super) struct SendError(#[source] pub(super) FrameError);

/// Writes one frame to the front (buffered; `write_frame` flushes at the end).
///
/// Errors: [`SendError`] when the frame cannot be encoded or the pipe fails.
pub(super) fn send_with(reply: &Reply, attachments: &[&[u8]]) -> Result<(), SendError> {
    let mut out = BufWriter::new(io::stdout().lock());
    write_frame(&mut out, reply, attachments).map_err(SendError)
}

/// Writes one frame without attachments to the front ([`send_with`]).
pub(super) fn send(reply: &Reply) -> Result<(), SendError> {
    send_with(reply, &[])
}
