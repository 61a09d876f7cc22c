//! The host side of a booted interpreter: what its JavaScript asks of the process with
//! `__mcpHostCall(json, bytes)` ([`HostRequest`]), answered here or by asking the front (user
//! code's fetches, code mode's tool and function calls), each bound to the run in progress.

use super::output::{forward_output, Running};
use super::reply::{send_with, SendError};
use crate::assets::FETCH_JS;
use crate::engine::{CallError, Engine};
use crate::protocol::error_words;
use crate::protocol::fetch::{FetchRequest, FetchResponse};
use crate::protocol::{
    read_frame, CallId, Frame, FrameError, FrameLimits, FunctionCall, Reply, Request, ToolCall,
};
use anyhow::Result;
use serde::Deserialize;
use std::cell::RefCell;
use std::io::{self, BufReader};
use std::rc::Rc;

/// Why the worker's host could not answer a host call of its JavaScript (`__host.call`). The
/// text becomes the message of the JavaScript `Error` thrown (for a fetch or a tool call, what
/// user code sees), each worded as it always was.
#[derive(Debug, thiserror::Error)]
pub(super) enum HostCallError {
    /// The message is not one the host knows: the parser's words.
    #[error("{0}")]
    Malformed(#[source] serde_json::Error),
    /// Anything but the memory snapshot, while booting.
    #[error("only the snapshot is taken while booting")]
    WhileBooting,
    /// A memory snapshot, once booted.
    #[error("a snapshot is only made while booting")]
    SnapshotAfterBoot,
    /// A request of user code (`what`, plural) while no run is in progress.
    #[error("{what} are only available while code runs")]
    NotRunning { what: &'static str },
    /// The front's next frame is not the answer to the request of kind `kind` (a
    /// [`Reply::kind`]) of the run.
    #[error("the front did not answer the {kind}")]
    Unanswered { kind: &'static str },
    /// The front's answer cannot be handed to JavaScript as JSON: the encoder's words.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// The request could not be sent. The text is the whole chain, as the worker has always
    /// worded it (`writing to the front: the pipe failed: …`).
    #[error("{}", error_words(.0))]
    Send(#[source] SendError),
    /// The front closed the worker's input instead of answering.
    #[error("the front closed the worker's input")]
    InputClosed,
    /// The front's answer could not be read.
    #[error("the front's answer could not be read: {0}")]
    Read(#[source] FrameError),
    /// Requests made at once whose body sizes are not one per request, or do not add up to
    /// the bytes given.
    #[error("the requests' body sizes do not match their bodies")]
    BadBatch,
}

/// What the worker's JavaScript asks of its host with `__mcpHostCall(json, bytes)`: one typed
/// message per kind (`runtime/js/runner.js`, `runtime/js/fetch.js`), parsed here once.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum HostRequest {
    /// The memory snapshot Pyodide just made (the bytes); only while booting.
    Snapshot,
    /// The bytes of a file the runner read for the front (an image of a run, or a resource).
    File,
    /// User code's HTTP request (the body is the bytes): the front performs or refuses it.
    Fetch { request: FetchRequest },
    /// User code's HTTP requests made at once (asyncio's): the bytes are their bodies one
    /// after another, `sizes` long each; answered by [`FetchBatch`]'s layout.
    FetchMany(ManyRequests),
    /// User code's call of an upstream MCP tool (code mode): the front makes it.
    Tool { call: ToolCall },
    /// User code's call of a host function (code mode): the front forwards it to the launcher.
    Function { call: FunctionCall },
}

/// The worker's standard input, where the front's requests arrive.
pub(super) type FrontInput = BufReader<io::StdinLock<'static>>;

/// The host side of the worker once booted: the state its host calls reach.
pub(super) struct Host {
    /// The front's requests (a host call that asks the front reads its answer here).
    pub input: Rc<RefCell<FrontInput>>,
    /// The run in progress, if any.
    pub running: Rc<RefCell<Running>>,
    /// The bytes of a file the runner just read.
    pub file_in: Rc<RefCell<Option<Vec<u8>>>>,
}

impl Host {
    /// Answers one host call: `(json, bytes)` back to JavaScript, or the error it throws.
    fn answer(&self, json: &str, bytes: Vec<u8>) -> Result<(String, Vec<u8>), HostCallError> {
        match serde_json::from_str::<HostRequest>(json).map_err(HostCallError::Malformed)? {
            HostRequest::File => {
                // Only the runner's closure holds the host call (fetch.js took it off the global).
                *self.file_in.borrow_mut() = Some(bytes);
                Ok(("{}".to_owned(), Vec::new()))
            }
            HostRequest::Snapshot => Err(HostCallError::SnapshotAfterBoot),
            HostRequest::Fetch { request } => self.fetch(request, &bytes),
            HostRequest::FetchMany(ManyRequests { requests, sizes }) => {
                let batch = FetchBatch::split(requests, &sizes, bytes)?;
                let answers = ask_fetches(&self.input, self.running.borrow().id, batch)?;
                FetchBatch::joined(answers)
            }
            HostRequest::Tool { call } => {
                let id = running_call(self.running.borrow().id, "MCP tool calls")?;
                ask_tool(&self.input, Reply::ToolCall { id, call }, id)
            }
            HostRequest::Function { call } => {
                let id = running_call(self.running.borrow().id, "host functions")?;
                ask_tool(&self.input, Reply::FunctionCall { id, call }, id)
            }
        }
    }

    /// Hands user code's HTTP request (`request`, its body `bytes`) to the front, which
    /// performs or refuses it: the response's JSON and its body (none for a refusal).
    fn fetch(
        &self,
        request: FetchRequest,
        bytes: &[u8],
    ) -> Result<(String, Vec<u8>), HostCallError> {
        ask_fetch(&self.input, self.running.borrow().id, request, bytes)
    }
}

/// Hands user code's HTTP request (`request`, its body `bytes`), of the run in progress
/// (`running`), to the front, which performs or refuses it, and reads the answer from `input`:
/// the response's JSON and its body (none for a refusal). Both runtimes' bridges use it.
///
/// Errors: [`HostCallError`]: no run in progress, the request cannot be sent, or the front's
/// next frame is not its answer.
pub(super) fn ask_fetch(
    input: &RefCell<FrontInput>,
    running: Option<CallId>,
    request: FetchRequest,
    bytes: &[u8],
) -> Result<(String, Vec<u8>), HostCallError> {
    let mut answers = ask_fetches(input, running, vec![(request, bytes.to_vec())])?;
    let (response, body) = answers
        .pop()
        .ok_or(HostCallError::Unanswered { kind: "fetch" })?;
    let json = serde_json::to_string(&response).map_err(HostCallError::Encode)?;
    Ok((json, body))
}

/// [`ask_fetch`] for requests made at once (each with its body): a response and its body
/// (none for a refusal) per request, in order.
///
/// Errors: as [`ask_fetch`]'s, and the front's answer not having one response per request.
pub(super) fn ask_fetches(
    input: &RefCell<FrontInput>,
    running: Option<CallId>,
    requests: Vec<(FetchRequest, Vec<u8>)>,
) -> Result<Vec<(FetchResponse, Vec<u8>)>, HostCallError> {
    let id = running_call(running, "network requests")?;
    let count = requests.len();
    let (requests, bodies): (Vec<FetchRequest>, Vec<Vec<u8>>) = requests.into_iter().unzip();
    let reply = Reply::Fetch { id, requests };
    let attachments: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    match ask_front(input, &reply, &attachments)? {
        Frame {
            header: Request::FetchResult { id: got, responses },
            mut attachments,
        } if got == id && responses.len() == count => {
            attachments.resize_with(count, Vec::new);
            let answers = responses.into_iter().zip(attachments);
            Ok(answers
                .map(|(response, body)| match response {
                    FetchResponse::Error { .. } => (response, Vec::new()),
                    _ => (response, body),
                })
                .collect())
        }
        _ => Err(HostCallError::Unanswered { kind: reply.kind() }),
    }
}

/// The JSON of requests made at once (their bodies travel beside it, `sizes` long each).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ManyRequests {
    pub requests: Vec<FetchRequest>,
    pub sizes: Vec<usize>,
}

/// Requests made at once, or their answers, as a host call carries them: one JSON text
/// (`{"requests"|"responses": [...], "sizes": [...]}`) and the bodies one after another, each
/// as long as `sizes` says (`runtime/python/http_bridge.py` `send_all`).
pub(super) struct FetchBatch;

impl FetchBatch {
    /// `requests` with their bodies cut from `bytes` by `sizes`.
    ///
    /// Errors: [`HostCallError::BadBatch`] when the sizes are not one per request or do not
    /// add up to the bytes.
    pub(super) fn split(
        requests: Vec<FetchRequest>,
        sizes: &[usize],
        bytes: Vec<u8>,
    ) -> Result<Vec<(FetchRequest, Vec<u8>)>, HostCallError> {
        let total = sizes.iter().try_fold(0usize, |sum, n| sum.checked_add(*n));
        if sizes.len() != requests.len() || total != Some(bytes.len()) {
            return Err(HostCallError::BadBatch);
        }
        let mut rest = bytes.as_slice();
        let mut out = Vec::with_capacity(requests.len());
        for (request, size) in requests.into_iter().zip(sizes) {
            let (body, after) = rest.split_at(*size);
            out.push((request, body.to_vec()));
            rest = after;
        }
        Ok(out)
    }

    /// `answers` as the host call hands them back: `{"responses", "sizes"}` and the bodies
    /// one after another.
    ///
    /// Errors: [`HostCallError::Encode`].
    pub(super) fn joined(
        answers: Vec<(FetchResponse, Vec<u8>)>,
    ) -> Result<(String, Vec<u8>), HostCallError> {
        let sizes: Vec<usize> = answers.iter().map(|(_, body)| body.len()).collect();
        let (responses, bodies): (Vec<FetchResponse>, Vec<Vec<u8>>) = answers.into_iter().unzip();
        let json = serde_json::json!({"responses": responses, "sizes": sizes});
        let json = serde_json::to_string(&json).map_err(HostCallError::Encode)?;
        Ok((json, bodies.concat()))
    }
}

/// Sends a tool or function call of run `id` to the front and reads its answer from `input`:
/// the answer's JSON and its images' bytes, one after another (both runtimes' code mode).
///
/// Errors: [`HostCallError`]: the call cannot be sent, or the front's next frame is not its
/// answer.
pub(super) fn ask_tool(
    input: &RefCell<FrontInput>,
    reply: Reply,
    id: CallId,
) -> Result<(String, Vec<u8>), HostCallError> {
    match ask_front(input, &reply, &[])? {
        Frame {
            header: Request::ToolResult { id: got, answer },
            attachments,
        } if got == id => {
            let json = serde_json::to_string(&answer).map_err(HostCallError::Encode)?;
            Ok((json, attachments.concat()))
        }
        _ => Err(HostCallError::Unanswered { kind: reply.kind() }),
    }
}

/// The call id of the run in progress (`running`, none between runs); `what` (plural) is only
/// available while code runs.
///
/// Errors: [`HostCallError::NotRunning`].
pub(super) fn running_call(
    running: Option<CallId>,
    what: &'static str,
) -> Result<CallId, HostCallError> {
    running.ok_or(HostCallError::NotRunning { what })
}

/// Sends `reply` to the front and reads its answer from `input` (the run waits meanwhile).
fn ask_front(
    input: &RefCell<FrontInput>,
    reply: &Reply,
    attachments: &[&[u8]],
) -> Result<Frame<Request>, HostCallError> {
    send_with(reply, attachments).map_err(HostCallError::Send)?;
    match read_frame::<Request>(&mut *input.borrow_mut(), FrameLimits::REQUEST) {
        Ok(Some(frame)) => Ok(frame),
        Ok(None) => Err(HostCallError::InputClosed),
        Err(e) => Err(HostCallError::Read(e)),
    }
}

/// Gives the booted engine its host: output lines of a run stream to the front as they are
/// written, `fetch.js` is installed, and host calls go to [`Host::answer`].
///
/// Errors: `runtime/js/fetch.js` fails.
pub(super) fn attach_host(engine: &mut Engine, input: Rc<RefCell<FrontInput>>) -> Result<Rc<Host>> {
    let host = Rc::new(Host {
        input,
        running: Rc::default(),
        file_in: Rc::default(),
    });
    let sink = host.clone();
    engine.set_emit_sink(Box::new(move |text: &str| {
        forward_output(&sink.running.borrow(), text)
    }));
    engine.eval(FETCH_JS, "mcp:fetch.js")?;
    let calls = host.clone();
    engine.set_call_handler(Box::new(move |json: &str, bytes: Vec<u8>| {
        calls.answer(json, bytes).map_err(CallError::from)
    }));
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_send_is_worded_as_its_whole_chain() {
        let failed = || FrameError::Io(io::Error::other("broken"));
        let typed = HostCallError::Send(SendError(failed())).to_string();
        let chained = format!(
            "{:#}",
            anyhow::Error::new(failed()).context("writing to the front")
        );
        assert_eq!(typed, chained);
        assert_eq!(typed, "writing to the front: the pipe failed: broken");
    }
}
