//! The framed messages between the front and a sandbox worker (over the worker's stdin/stdout).
//!
//! A frame is: `u32` little-endian length of a JSON header, the header (a [`Request`] or
//! [`Reply`]), a `u32` count of binary attachments, then each attachment as a `u64` length and
//! its bytes. Attachments carry package files so that bytes are never base64-inflated.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest header accepted (bytes); code itself is capped well below this by the front.
pub const MAX_HEADER: u32 = 256 << 20;
/// Largest single attachment accepted (bytes).
pub const MAX_ATTACHMENT: u64 = 1 << 30;

/// A request from the front to a worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The first frame a worker reads: how to boot. With `snapshot` `load`, attachment 0 is
    /// a Pyodide memory snapshot to restore; with `make`, the worker boots normally and sends
    /// a snapshot with [`Reply::Ready`].
    Boot { snapshot: SnapshotMode },
    /// Top-level imports of `code`, minus the standard library (Pyodide's `find_imports`).
    FindImports { code: String },
    /// Makes `files` (attachment `i` at virtual path `files[i]`) available, then loads `items`
    /// with `pyodide.loadPackage` (lock-file package names or wheel paths).
    Install {
        files: Vec<String>,
        items: Vec<String>,
    },
    /// Answer to [`Reply::Fetch`]: `{status, statusText, headers, url, redirected}` or
    /// `{error}`; the body is attachment 0.
    FetchResult { response: serde_json::Value },
    /// Runs `code` with fresh globals plus `globals`; output beyond `output_cap` bytes is cut.
    Run {
        code: String,
        globals: serde_json::Map<String, serde_json::Value>,
        output_cap: usize,
    },
}

/// A message from a worker to the front.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// Pyodide booted (`boot_ms` milliseconds, `restored` from a snapshot); sent once, after
    /// [`Request::Boot`]. When a snapshot was made it is attachment 0.
    Ready {
        pyodide_version: String,
        boot_ms: u64,
        #[serde(default)]
        restored: bool,
    },
    /// Answer to [`Request::FindImports`].
    Imports { names: Vec<String> },
    /// Answer to [`Request::Install`]: `error` is `None` on success.
    Installed { error: Option<String> },
    /// Lines written by user code (in order), sent while the code runs.
    Output { lines: Vec<(Stream, String)> },
    /// Answer to [`Request::Run`].
    Ran(RunOutcome),
    /// User code asks for an HTTP request `{method, url, headers}` (body: attachment 0); the
    /// worker waits for [`Request::FetchResult`].
    Fetch { request: serde_json::Value },
    /// The worker cannot go on (boot failed, engine error); it exits after sending this.
    Fatal { error: String },
}

/// How a worker boots Pyodide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Plain boot.
    None,
    /// Plain boot, then hand a memory snapshot to the front.
    Make,
    /// Restore the attached memory snapshot (much faster than a plain boot).
    Load,
}

/// Which stream a line of output was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a run ended, as reported by the Python helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunOutcome {
    /// `success` or `run-error`.
    pub status: String,
    /// The last expression's value as text (JSON, or a `str` as is); absent for `None`.
    #[serde(default)]
    pub return_value: Option<String>,
    /// How `return_value` was made: `str` (as is), `json`, or `repr` (fallback).
    #[serde(default)]
    pub return_kind: Option<String>,
    /// Traceback and message when `status` is `run-error`.
    #[serde(default)]
    pub error: Option<String>,
    /// Whether output was cut at the cap.
    #[serde(default)]
    pub truncated: bool,
    /// The interpreter cannot be used again (it exited or aborted); the worker is ending.
    #[serde(default)]
    pub fatal: bool,
}

/// A decoded frame: its JSON header and attachments.
pub struct Frame<T> {
    pub header: T,
    pub attachments: Vec<Vec<u8>>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The frame's beginning: header length, header JSON and attachment count.
fn encode_head<T: Serialize>(header: &T, attachments: usize) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(header).map_err(|e| invalid(e.to_string()))?;
    let mut head = Vec::with_capacity(json.len() + 8);
    head.extend_from_slice(&(json.len() as u32).to_le_bytes());
    head.extend_from_slice(&json);
    head.extend_from_slice(&(attachments as u32).to_le_bytes());
    Ok(head)
}

/// Checks a header length read from the stream.
fn header_len(raw: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(raw);
    if len > MAX_HEADER {
        return Err(invalid(format!("frame header of {len} bytes is too large")));
    }
    Ok(len as usize)
}

/// Checks an attachment length read from the stream.
fn attachment_len(raw: [u8; 8]) -> io::Result<usize> {
    let n = u64::from_le_bytes(raw);
    if n > MAX_ATTACHMENT {
        return Err(invalid(format!("attachment of {n} bytes is too large")));
    }
    Ok(n as usize)
}

fn decode_header<T: for<'de> Deserialize<'de>>(json: &[u8]) -> io::Result<T> {
    serde_json::from_slice(json).map_err(|e| invalid(format!("bad frame header: {e}")))
}

/// `Ok(None)` for an end of stream before a frame starts.
fn at_frame_start(r: io::Result<()>) -> io::Result<Option<()>> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes one frame (blocking; used by the worker).
pub fn write_frame<T: Serialize>(
    w: &mut impl Write,
    header: &T,
    attachments: &[Vec<u8>],
) -> io::Result<()> {
    w.write_all(&encode_head(header, attachments.len())?)?;
    for a in attachments {
        w.write_all(&(a.len() as u64).to_le_bytes())?;
        w.write_all(a)?;
    }
    w.flush()
}

/// Reads one frame (blocking). `Ok(None)` at a clean end of stream.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<Option<Frame<T>>> {
    let mut len = [0u8; 4];
    if at_frame_start(r.read_exact(&mut len))?.is_none() {
        return Ok(None);
    }
    let mut json = vec![0u8; header_len(len)?];
    r.read_exact(&mut json)?;
    let mut count = [0u8; 4];
    r.read_exact(&mut count)?;
    let mut attachments = Vec::new();
    for _ in 0..u32::from_le_bytes(count) {
        let mut n = [0u8; 8];
        r.read_exact(&mut n)?;
        let mut buf = vec![0u8; attachment_len(n)?];
        r.read_exact(&mut buf)?;
        attachments.push(buf);
    }
    Ok(Some(Frame {
        header: decode_header(&json)?,
        attachments,
    }))
}

/// Writes one frame (async; used by the front).
pub async fn write_frame_async<T: Serialize>(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    header: &T,
    attachments: &[Vec<u8>],
) -> io::Result<()> {
    w.write_all(&encode_head(header, attachments.len())?)
        .await?;
    for a in attachments {
        w.write_all(&(a.len() as u64).to_le_bytes()).await?;
        w.write_all(a).await?;
    }
    w.flush().await
}

/// Reads one frame (async). `Ok(None)` at a clean end of stream.
pub async fn read_frame_async<T: for<'de> Deserialize<'de>>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> io::Result<Option<Frame<T>>> {
    let mut len = [0u8; 4];
    if at_frame_start(r.read_exact(&mut len).await.map(|_| ()))?.is_none() {
        return Ok(None);
    }
    let mut json = vec![0u8; header_len(len)?];
    r.read_exact(&mut json).await?;
    let mut count = [0u8; 4];
    r.read_exact(&mut count).await?;
    let mut attachments = Vec::new();
    for _ in 0..u32::from_le_bytes(count) {
        let mut n = [0u8; 8];
        r.read_exact(&mut n).await?;
        let mut buf = vec![0u8; attachment_len(n)?];
        r.read_exact(&mut buf).await?;
        attachments.push(buf);
    }
    Ok(Some(Frame {
        header: decode_header(&json)?,
        attachments,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_attachments() {
        let mut buf = Vec::new();
        let request = Request::Install {
            files: vec!["/packages/a.whl".into()],
            items: vec!["a".into()],
        };
        write_frame(&mut buf, &request, &[b"wheel bytes".to_vec()]).unwrap();
        let frame: Frame<Request> = read_frame(&mut buf.as_slice()).unwrap().unwrap();
        assert!(
            matches!(frame.header, Request::Install { ref items, .. } if items == &["a".to_string()])
        );
        assert_eq!(frame.attachments, vec![b"wheel bytes".to_vec()]);
        assert!(read_frame::<Request>(&mut &buf[buf.len()..])
            .unwrap()
            .is_none());
    }

    #[test]
    fn oversized_headers_are_rejected() {
        let mut buf = (MAX_HEADER + 1).to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        assert!(read_frame::<Request>(&mut buf.as_slice()).is_err());
    }
}
