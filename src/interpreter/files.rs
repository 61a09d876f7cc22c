//! Files of a run's working directory, read and written for the front through the runner: the
//! images a run made, the file tools' reads (`Request::ReadFile`), and uploads.

use super::runner::{call, parse_answer, Empty, OperationError, Runner};
use crate::engine::{Arg, Engine, EngineError};
use crate::protocol::{CallId, RunOutcome};
use anyhow::Result;
use std::cell::RefCell;

/// Reads the images `outcome` names (files the run made in its working directory), each of at
/// most `cap` bytes, with `read` (the runtime's file read: the bytes, or `None` when it could
/// not); keeps in `outcome.images` only those read, in the order of the returned bytes. None
/// when `cap` is 0 (no `--stateful`).
pub(super) fn read_images(
    outcome: &mut RunOutcome,
    cap: usize,
    mut read: impl FnMut(&str, usize) -> Option<Vec<u8>>,
) -> Vec<Vec<u8>> {
    let mut read_bytes = Vec::new();
    let mut kept = Vec::new();
    if cap > 0 {
        for path in outcome.images.iter().take(crate::protocol::MAX_IMAGES) {
            if let Some(bytes) = read(path, cap) {
                kept.push(path.clone());
                read_bytes.push(bytes);
            }
        }
    }
    outcome.images = kept;
    read_bytes
}

/// Why the runner could not read a file; its text goes to the front as the worker's own words
/// ([`crate::protocol::messages::Reply::File`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadFileError {
    /// The runner said why (no such file, too large, a directory).
    #[error(transparent)]
    Runner(#[from] OperationError),
    /// The engine failed while the runner read it.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The runner answered, but handed no bytes to the host.
    #[error("the runner read no bytes")]
    NoBytes,
}

/// The bytes of file `path` under the working directory, read through the runner's
/// `readFile` (which hands them to the host into `file_in`) if it has at most `cap` bytes.
///
/// Errors: [`ReadFileError`], saying why not.
pub(super) fn read_file(
    engine: &mut Engine,
    runner: &Runner,
    file_in: &RefCell<Option<Vec<u8>>>,
    id: CallId,
    path: &str,
    cap: usize,
) -> Result<Vec<u8>, ReadFileError> {
    let args = [Arg::Str(path), Arg::Num(cap as f64)];
    let answered = call(engine, &runner.read_file, id, &args, None);
    let bytes = file_in.borrow_mut().take();
    match (answered.map(|text| parse_answer::<Empty>(&text)), bytes) {
        (Ok(Ok(_)), Some(bytes)) => Ok(bytes),
        (Ok(Err(e)), _) => Err(e.into()),
        (Err(e), _) => Err(e.into()),
        (Ok(Ok(_)), None) => Err(ReadFileError::NoBytes),
    }
}
