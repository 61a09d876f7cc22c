//! A run's output, forwarded to the front as it is written: tagged with the run's call id,
//! batched, and cut past the output cap plus [`OUTPUT_SLACK`].

use super::reply::send;
use crate::protocol::{CallId, OutputLine, Reply, OUTPUT_SLACK};

/// Output of the run in progress: its call id and cap, and what was forwarded so far.
#[derive(Default)]
pub(super) struct Running {
    pub id: Option<CallId>,
    pub output_cap: usize,
}

impl Running {
    /// Largest line forwarded (bytes): one past the front's limit, enough to trip it.
    fn line_max(&self) -> usize {
        self.output_cap.saturating_add(OUTPUT_SLACK + 1)
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
pub(super) fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// Forwards output lines of the run in progress, in frames of at most about one line cap.
pub(super) fn forward_output(running: &Running, text: &str) {
    let Some(id) = running.id else {
        // No run in progress (booting, scanning, installing): nothing is the call's output.
        return;
    };
    let Ok(lines) = serde_json::from_str::<Vec<OutputLine>>(text) else {
        return;
    };
    let max = running.line_max();
    let mut batch = Vec::new();
    let mut size = 0usize;
    for (stream, mut line) in lines {
        cut(&mut line, max);
        size += line.len() + 1;
        batch.push((stream, line));
        if size > max {
            let _ = send(&Reply::Output {
                id,
                lines: std::mem::take(&mut batch),
            });
            size = 0;
        }
    }
    if !batch.is_empty() {
        let _ = send(&Reply::Output { id, lines: batch });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_characters_whole() {
        let mut s = "aé".to_owned();
        cut(&mut s, 2);
        assert_eq!(s, "a");
    }
}
