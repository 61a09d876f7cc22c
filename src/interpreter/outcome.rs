//! How a run that did not end in Python reads as a [`RunOutcome`]: the runner failed, the
//! interpreter ended (`os._exit`, `os.abort`), or the engine itself failed.

use super::runner::{Ended, OperationError};
use crate::engine::EngineError;
use crate::protocol::{RunOutcome, RunStatus};

/// A run that failed with `error` (and nothing else to report); `fatal`: its interpreter
/// cannot be used again.
pub(super) fn error_outcome(error: String, fatal: bool) -> RunOutcome {
    RunOutcome {
        status: RunStatus::RunError,
        return_value: None,
        error: Some(error),
        truncated: false,
        fatal,
        images: Vec::new(),
        files: Vec::new(),
        written: Vec::new(),
        refresh: Vec::new(),
        image_bytes: Vec::new(),
        code_us: 0,
        worker_us: 0,
        uncapturable: None,
    }
}

/// The result of a run whose interpreter ended (the next call runs in a new worker).
pub(super) fn ended_outcome(ended: Ended) -> RunOutcome {
    let error = match ended {
        Ended::Exit(code) => format!("SystemExit: the code ended the interpreter with exit({code}) (os._exit); the next call runs in a new interpreter"),
        Ended::Abort => "RuntimeError: the interpreter aborted (os.abort() or a fatal error in the runtime); the next call runs in a new interpreter".to_owned(),
    };
    error_outcome(error, true)
}

/// The result of a run that failed below Python (the runner did not answer with a result).
pub(super) fn failed_outcome(e: OperationError) -> RunOutcome {
    match e {
        OperationError::Ended(ended) => ended_outcome(ended),
        // An ordinary JavaScript error from the runner: the interpreter is still usable.
        OperationError::Failed(text) => error_outcome(text, false),
        e @ OperationError::Shape(_) => error_outcome(format!("RuntimeError: {e}"), false),
    }
}

/// The result of a run during which the engine itself failed: the interpreter is ended.
pub(super) fn engine_outcome(e: &EngineError) -> RunOutcome {
    if let EngineError::UnhandledRejection(r) = e {
        if r.fatal {
            return ended_outcome(r.exit_status.map_or(Ended::Abort, Ended::Exit));
        }
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    error_outcome(
        format!("RuntimeError: the JavaScript runtime failed: {first}; the next call runs in a new interpreter"),
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpreter::runner::parse_answer;

    #[test]
    fn runner_failures_are_typed() {
        let o = parse_answer::<RunOutcome>(r#"{"failed":{"ended":{"exit":3}}}"#).unwrap_err();
        let o = failed_outcome(o);
        assert!(o.fatal);
        assert!(o.error.unwrap().contains("exit(3)"));
        let o =
            parse_answer::<RunOutcome>(r#"{"failed":{"ended":"abort","error":"x"}}"#).unwrap_err();
        assert!(failed_outcome(o).fatal);
        let o = parse_answer::<RunOutcome>(r#"{"failed":{"error":"TypeError: x"}}"#).unwrap_err();
        assert!(!failed_outcome(o).fatal);
        // A result of the wrong shape is not read as a failure, nor the other way round.
        assert!(matches!(
            parse_answer::<RunOutcome>(r#"{"ok":{"error":"x"}}"#),
            Err(OperationError::Shape(_))
        ));
        assert!(matches!(
            parse_answer::<RunOutcome>(r#"{"error":"x"}"#),
            Err(OperationError::Shape(_))
        ));
    }
}
