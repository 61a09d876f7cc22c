//! The worker's side of its guest's one door (`_host.call`, `src/wasi/door.rs`): what a turn
//! asks of the worker and hands back, as `runtime/python/scientific.py` speaks it. Each message
//! starts with one tag byte ([`Tag`]); everything after it comes from the guest, where user code
//! runs, so it is hostile: parsed typed, bound to the request in progress, and each answer taken
//! once.

use super::super::output::{forward_output, Running};
use crate::assets::SCIENTIFIC_PY;
use crate::wasi::door::Door;
use std::sync::{Arc, Mutex, MutexGuard};

/// A door message's first byte, as `runtime/python/scientific.py` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    /// `s`: the guest side's source (the boot's first turn only).
    Source,
    /// `q`: the request to serve (JSON), taken once.
    Request,
    /// `b`: the request's attachment (an upload's bytes), taken once.
    Attachment,
    /// `o` + JSON: output lines of the run in progress.
    Output,
    /// `f` + bytes: a file's bytes, read for the front.
    File,
    /// `a` + JSON: the request's answer; only the first counts.
    Answer,
}

impl Tag {
    fn of(byte: u8) -> Option<Tag> {
        Some(match byte {
            b's' => Tag::Source,
            b'q' => Tag::Request,
            b'b' => Tag::Attachment,
            b'o' => Tag::Output,
            b'f' => Tag::File,
            b'a' => Tag::Answer,
            _ => return None,
        })
    }
}

/// What one turn exchanges through the door: set by the worker before the turn, filled by the
/// guest during it.
#[derive(Default)]
pub(super) struct Exchange {
    /// Whether the guest side was loaded: then its source is not handed out again.
    pub booted: bool,
    /// The request to serve (JSON).
    pub request: Option<Vec<u8>>,
    /// The request's attachment.
    pub attachment: Option<Vec<u8>>,
    /// The output of the run in progress: its call id and cap (no id: no run, no output).
    pub running: Running,
    /// The bytes of the file the request read.
    pub file: Option<Vec<u8>>,
    /// The request's answer (JSON).
    pub answer: Option<Vec<u8>>,
}

/// The exchange, shared by the worker and its guest's door (wasmtime keeps the door in the
/// store, which must be `Send`).
#[derive(Clone, Default)]
pub(super) struct Shared(Arc<Mutex<Exchange>>);

impl Shared {
    /// The exchange; a poisoned lock still holds a usable one (a panic cannot leave it half
    /// written: every field is replaced whole).
    pub(super) fn lock(&self) -> MutexGuard<'_, Exchange> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The door the guest calls, over this exchange.
    pub(super) fn door(&self) -> Box<dyn Door> {
        Box::new(WorkerDoor(self.clone()))
    }
}

/// The guest's door into this worker.
struct WorkerDoor(Shared);

impl Door for WorkerDoor {
    /// `None` (the guest's call raises) for an unknown tag, output that is not text, or a
    /// request or source asked for when there is none.
    fn call(&mut self, message: &[u8]) -> Option<Vec<u8>> {
        let (&tag, body) = message.split_first()?;
        let mut exchange = self.0.lock();
        match Tag::of(tag)? {
            Tag::Source if !exchange.booted => Some(SCIENTIFIC_PY.as_bytes().to_vec()),
            Tag::Source => None,
            Tag::Request => exchange.request.take(),
            Tag::Attachment => Some(exchange.attachment.take().unwrap_or_default()),
            Tag::Output => {
                forward_output(&exchange.running, std::str::from_utf8(body).ok()?);
                Some(Vec::new())
            }
            Tag::File => {
                exchange.file.get_or_insert_with(|| body.to_vec());
                Some(Vec::new())
            }
            Tag::Answer => {
                exchange.answer.get_or_insert_with(|| body.to_vec());
                Some(Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_is_taken_once_and_the_first_counts() {
        let shared = Shared::default();
        let mut door = shared.door();
        shared.lock().request = Some(b"{}".to_vec());
        assert_eq!(door.call(b"q").as_deref(), Some(b"{}".as_slice()));
        assert_eq!(door.call(b"q"), None);
        door.call(b"a{\"x\":1}");
        door.call(b"a{\"x\":2}");
        assert_eq!(
            shared.lock().answer.as_deref(),
            Some(b"{\"x\":1}".as_slice())
        );
        // No tag, an unknown one, output that is not text: the guest's call raises.
        assert_eq!(door.call(b""), None);
        assert_eq!(door.call(b"z"), None);
        assert_eq!(door.call(b"o\xff"), None);
        // The guest side's source only until it booted.
        assert!(door.call(b"s").is_some());
        shared.lock().booted = true;
        assert_eq!(door.call(b"s"), None);
    }
}
