//! The worker's side of its guest's one door (`_host.call`, `src/wasi/door.rs`): what a turn
//! asks of the worker and hands back, as `runtime/python/scientific.py` speaks it. Each message
//! starts with one tag byte ([`Tag`]); everything after it comes from the guest, where user code
//! runs, so it is hostile: parsed typed, bound to the request in progress, and each answer taken
//! once.

use super::super::host_calls::{ask_fetch, ask_tool, running_call, FrontInput, HostCallError};
use super::super::output::{forward_output, Running};
use crate::assets::SCIENTIFIC_PY;
use crate::protocol::fetch::FetchRequest;
use crate::protocol::{CallId, FunctionCall, Reply, ToolCall};
use crate::wasi::door::Door;
use std::cell::{RefCell, RefMut};
use std::rc::Rc;

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
    /// `c` + JSON ([`GuestCall`]): code mode's call of a tool or host function, made by the
    /// front while the run waits.
    Call,
    /// `h` + a `u32` little-endian length + a [`FetchRequest`]'s JSON of that length + the
    /// request's body: user code's HTTP request (`runtime/python/http_bridge.py`), made by the
    /// front under `--allow-net` while the run waits.
    Fetch,
}

/// A call of code mode the guest asks the front to make (`runtime/python/scientific.py`
/// `_ask`), as Pyodide's runner asks it (`src/interpreter/host_calls.rs` `HostRequest`).
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum GuestCall {
    /// An upstream MCP tool's (`--tools-config`).
    Tool { call: ToolCall },
    /// A host function's (`--functions-socket`).
    Function { call: FunctionCall },
}

/// The first byte of the door's answer to a [`Tag::Call`]: what follows is the answer (a
/// `u32` little-endian length, the [`crate::protocol::ToolAnswer`]'s JSON of that length, then
/// its images' bytes one after another).
const CALL_ANSWERED: u8 = b'+';

/// The first byte of the door's answer to a [`Tag::Call`] that could not be made: the rest is
/// why, as text (the guest raises it).
const CALL_FAILED: u8 = b'!';

impl Tag {
    fn of(byte: u8) -> Option<Tag> {
        Some(match byte {
            b's' => Tag::Source,
            b'q' => Tag::Request,
            b'b' => Tag::Attachment,
            b'o' => Tag::Output,
            b'f' => Tag::File,
            b'a' => Tag::Answer,
            b'c' => Tag::Call,
            b'h' => Tag::Fetch,
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
/// store; both live on the worker's one thread).
#[derive(Clone, Default)]
pub(super) struct Shared(Rc<RefCell<Exchange>>);

impl Shared {
    /// The exchange (borrowed by one side at a time: the worker between turns, the door
    /// during one of the guest's calls).
    pub(super) fn lock(&self) -> RefMut<'_, Exchange> {
        self.0.borrow_mut()
    }

    /// The door the guest calls, over this exchange; code mode's calls go to the front over
    /// `front`.
    pub(super) fn door(&self, front: Rc<RefCell<FrontInput>>) -> Box<dyn Door> {
        Box::new(WorkerDoor {
            exchange: self.clone(),
            front,
        })
    }
}

/// The guest's door into this worker.
struct WorkerDoor {
    exchange: Shared,
    /// The front's requests, where a code mode call's answer is read.
    front: Rc<RefCell<FrontInput>>,
}

// SAFETY: wasmtime asks a store's data to be `Send` (a store may move between threads). The
// worker's store, and with it this door and the `Rc`s it holds, is made, used and dropped on the
// worker's one thread and never sent to another (the epoch ticker's thread holds only the
// engine; a zygote forks with that one thread), so no `Rc` count is ever touched from two
// threads.
unsafe impl Send for WorkerDoor {}

impl WorkerDoor {
    /// Makes code mode's call `body` ([`GuestCall`]'s JSON) through the front, bound to the
    /// run in progress: the door's answer ([`CALL_ANSWERED`] or [`CALL_FAILED`]).
    fn host_call(&self, body: &[u8], running: Option<CallId>) -> Vec<u8> {
        answered(self.ask(body, running))
    }

    /// Makes user code's HTTP request `body` ([`Tag::Fetch`]'s layout) through the front,
    /// bound to the run in progress: the door's answer, [`CALL_ANSWERED`] with the response's
    /// JSON and body, or [`CALL_FAILED`].
    fn fetch(&self, body: &[u8], running: Option<CallId>) -> Vec<u8> {
        let Some((json, request_body)) = split_sized(body) else {
            return failed("the request is not a length, its JSON and its body");
        };
        match serde_json::from_slice::<FetchRequest>(json) {
            Ok(request) => answered(ask_fetch(&self.front, running, request, request_body)),
            Err(e) => failed(&HostCallError::Malformed(e).to_string()),
        }
    }

    fn ask(
        &self,
        body: &[u8],
        running: Option<CallId>,
    ) -> Result<(String, Vec<u8>), HostCallError> {
        let call: GuestCall = serde_json::from_slice(body).map_err(HostCallError::Malformed)?;
        let (id, reply) = match call {
            GuestCall::Tool { call } => {
                let id = running_call(running, "MCP tool calls")?;
                (id, Reply::ToolCall { id, call })
            }
            GuestCall::Function { call } => {
                let id = running_call(running, "host functions")?;
                (id, Reply::FunctionCall { id, call })
            }
        };
        ask_tool(&self.front, reply, id)
    }
}

/// `bytes` as a `u32` little-endian length, that many bytes, and the rest; `None` when it is
/// shorter than its length says.
fn split_sized(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    const LEN: usize = std::mem::size_of::<u32>();
    let (head, rest) = bytes.split_first_chunk::<LEN>()?;
    let len = usize::try_from(u32::from_le_bytes(*head)).ok()?;
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// The door's answer to a call the front made: [`CALL_ANSWERED`], the answer's JSON with its
/// length, then its bytes; or [`CALL_FAILED`] with why.
fn answered(made: Result<(String, Vec<u8>), HostCallError>) -> Vec<u8> {
    match made {
        Ok((json, bytes)) => {
            let Ok(len) = u32::try_from(json.len()) else {
                return failed("the answer is longer than the guest can take");
            };
            let head = 1 + std::mem::size_of::<u32>();
            let mut out = Vec::with_capacity(head + json.len() + bytes.len());
            out.push(CALL_ANSWERED);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(json.as_bytes());
            out.extend_from_slice(&bytes);
            out
        }
        Err(e) => failed(&e.to_string()),
    }
}

/// A [`CALL_FAILED`] answer saying `why`.
fn failed(why: &str) -> Vec<u8> {
    let mut out = vec![CALL_FAILED];
    out.extend_from_slice(why.as_bytes());
    out
}

impl Door for WorkerDoor {
    /// `None` (the guest's call raises) for an unknown tag, output that is not text, or a
    /// request or source asked for when there is none.
    fn call(&mut self, message: &[u8]) -> Option<Vec<u8>> {
        let (&tag, body) = message.split_first()?;
        let tag = Tag::of(tag)?;
        if matches!(tag, Tag::Call | Tag::Fetch) {
            // The exchange is not held while the front makes the call.
            let running = self.exchange.lock().running.id;
            return Some(match tag {
                Tag::Fetch => self.fetch(body, running),
                _ => self.host_call(body, running),
            });
        }
        let mut exchange = self.exchange.lock();
        match tag {
            Tag::Call | Tag::Fetch => None,
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
        let front = Rc::new(RefCell::new(std::io::BufReader::new(
            std::io::stdin().lock(),
        )));
        let mut door = shared.door(front);
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
        // A code mode call outside a run, or that is not one, is refused with why.
        let call = br#"c{"op":"function","call":{"function":"f"}}"#;
        let refused = door.call(call).expect("answered");
        assert_eq!(refused[0], CALL_FAILED);
        assert!(String::from_utf8_lossy(&refused).contains("only available while code runs"));
        let malformed = door.call(b"c{\"op\":\"fetch\"}").expect("answered");
        assert_eq!(malformed[0], CALL_FAILED);
        // The guest side's source only until it booted.
        assert!(door.call(b"s").is_some());
        shared.lock().booted = true;
        assert_eq!(door.call(b"s"), None);
    }
}
