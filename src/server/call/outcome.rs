//! How a call's run ends up in its result: the worker's outcome read into the
//! [`CallResult`] (images typed from their bytes), a worker failure worded as the call's
//! error, the [`Verdict`] on the worker, and when a kept worker's checkpoint is due
//! ([`CheckpointWhen`]). Apart from the pipeline
//! ([`super::execute`]) so that the words a result may say are read in one place.

use crate::metrics::KillReason;
use crate::protocol::{ReturnKind, RunOutcome, RunStatus};
use crate::sandbox::files::Listing;
use crate::server::call::result::{CallResult, Image, Outcome, ReturnValue, RunErrorCause};
use crate::worker::client::{AskedCheckpoint, Deadline, Phase, WorkerError};

/// Whether the worker may serve another call after this one.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Verdict {
    /// It may: the call went well, or failed without harm to it.
    Keep,
    /// It is to be killed: it failed, passed a limit or its interpreter ended.
    Discard,
}

/// When a call whose worker is kept takes its checkpoint (`Executor::after_run`, `src/server/call/checkpoints.rs`).
pub(super) enum CheckpointWhen {
    /// None is due: the sandbox keeps no checkpoints, the run said its state cannot be
    /// captured, or one was taken before the answer.
    Done,
    /// Asked of the worker before the answer (which goes out while the worker takes it), and
    /// read after it (`Executor::checkpoint_after_answer`), before `deadline`: the sandbox's
    /// worker stays held until it is kept, so its next call waits for it.
    AfterAnswer(AskedCheckpoint, Deadline),
}

/// Turns a worker failure into the call's error (in `result`) and counts the kill; the
/// worker is to be discarded.
pub(super) fn failed(result: &mut CallResult, e: WorkerError) -> Verdict {
    crate::metrics::worker_killed(match &e {
        WorkerError::Deadline {
            phase: Phase::Installing,
            ..
        } => KillReason::InstallTimeout,
        WorkerError::Deadline { .. } => KillReason::Timeout,
        WorkerError::OutputFlood { .. } => KillReason::Output,
        WorkerError::Protocol(_) => KillReason::Protocol,
        _ => KillReason::Failed,
    });
    result.outcome = match e {
        WorkerError::Deadline {
            phase: Phase::Installing,
            seconds,
        } => Outcome::install_error(format!(
            "installing took longer than {} s (--install-timeout); the interpreter was stopped",
            seconds.as_secs_f64()
        )),
        WorkerError::Deadline { seconds, .. } => Outcome::run_error(
            RunErrorCause::Timeout,
            format!(
                "TimeoutError: the code timed out after {} s",
                seconds.as_secs_f64()
            ),
        ),
        e @ (WorkerError::OutputFlood { .. } | WorkerError::Protocol(_)) => {
            Outcome::run_error(RunErrorCause::Worker, e.to_string())
        }
        e => Outcome::run_error(
            RunErrorCause::Worker,
            format!("the sandbox worker failed while running the code: {e}"),
        ),
    };
    Verdict::Discard
}

/// Fills `result` from the worker's `outcome` of a run that ended (its written files, images,
/// status and return value or error), and `listing` with its working directory; returns
/// whether its interpreter ended (`fatal`).
pub(super) fn read_outcome(
    mut outcome: RunOutcome,
    result: &mut CallResult,
    listing: &mut Option<Listing>,
) -> bool {
    let files = std::mem::take(&mut outcome.files);
    let sizes: std::collections::HashMap<&String, u64> =
        files.iter().map(|(p, n)| (p, *n)).collect();
    result.written = outcome
        .written
        .iter()
        .filter_map(|p| sizes.get(p).map(|n| (p.clone(), *n)))
        .collect();
    *listing = Some(Listing {
        files,
        refresh: std::mem::take(&mut outcome.refresh),
    });
    for (name, bytes) in outcome.images.iter().zip(outcome.image_bytes.drain(..)) {
        // The type comes from the bytes, never from the worker's word (or a file name).
        if let Some(mime) = image_type(name, &bytes) {
            result.images.push(Image { mime, bytes });
        }
    }
    result.outcome = match outcome.status {
        RunStatus::Success => {
            Outcome::Success(outcome.return_value.map(|value| match value.kind {
                ReturnKind::Json => ReturnValue::Json(value.text),
                ReturnKind::Str | ReturnKind::Repr => ReturnValue::Text(value.text),
            }))
        }
        RunStatus::RunError => {
            Outcome::run_error(RunErrorCause::Raised, outcome.error.unwrap_or_default())
        }
    };
    outcome.fatal
}

/// The MIME type of an image file a call made, from its first bytes (PNG, JPEG, GIF and WebP
/// signatures; SVG: a `.svg` name and UTF-8 text with an `<svg` element); `None` for anything
/// else, which is then not returned as an image.
fn image_type(name: &str, bytes: &[u8]) -> Option<&'static str> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if bytes.starts_with(PNG) {
        return Some("image/png");
    }
    if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        return Some("image/jpeg");
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return Some("image/gif");
    }
    if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        return Some("image/webp");
    }
    let svg = name.to_ascii_lowercase().ends_with(".svg")
        && std::str::from_utf8(bytes).is_ok_and(|text| text.contains("<svg"));
    svg.then_some("image/svg+xml")
}

#[cfg(test)]
mod tests {
    use super::image_type;

    #[test]
    fn image_types_come_from_the_bytes() {
        assert_eq!(
            image_type("a.png", b"\x89PNG\r\n\x1a\nrest"),
            Some("image/png")
        );
        assert_eq!(image_type("a.txt", b"\xff\xd8\xff\xe0"), Some("image/jpeg"));
        assert_eq!(image_type("a.gif", b"GIF89a.."), Some("image/gif"));
        assert_eq!(
            image_type("a.webp", b"RIFF\0\0\0\0WEBPVP8 "),
            Some("image/webp")
        );
        assert_eq!(
            image_type("a.svg", b"<?xml?><svg xmlns='x'/>"),
            Some("image/svg+xml")
        );
        assert_eq!(image_type("a.png", b"not a png"), None);
        assert_eq!(image_type("a.html", b"<svg/>"), None);
    }
}
