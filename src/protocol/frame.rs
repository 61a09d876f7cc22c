//! Frames: how every message of the worker protocol travels over a pipe, and the bounds a
//! reader checks before it allocates.
//!
//! A frame is: `u32` little-endian length of a JSON header, the header (a
//! [`Request`](super::Request) or [`Reply`](super::Reply)), a `u32` count of binary
//! attachments, then each attachment as a `u64` length and its bytes. Attachments carry package
//! files and snapshots so that bytes are never base64-inflated.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest header a worker accepts from the front (bytes); code is capped well below this.
pub const MAX_REQUEST_HEADER: usize = 256 << 20;
/// Largest single attachment a worker accepts from the front (bytes): a package file.
pub const MAX_REQUEST_ATTACHMENT: usize = 1 << 30;
/// Most attachments in one frame from the front (package files of one install).
pub const MAX_REQUEST_ATTACHMENTS: usize = 4096;

/// Bounds on one frame read: what the reader may allocate for it, checked before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest JSON header (bytes).
    pub header: usize,
    /// Most attachments.
    pub attachments: usize,
    /// Largest single attachment (bytes).
    pub attachment: usize,
}

impl FrameLimits {
    /// What a worker accepts from the (trusted) front.
    pub const REQUEST: FrameLimits = FrameLimits {
        header: MAX_REQUEST_HEADER,
        attachments: MAX_REQUEST_ATTACHMENTS,
        attachment: MAX_REQUEST_ATTACHMENT,
    };

    /// Small control replies (`pong`, `imports`, `installed`, `fatal`): 1 MiB, no attachment.
    pub const CONTROL: FrameLimits = FrameLimits {
        header: 1 << 20,
        attachments: 0,
        attachment: 0,
    };
}

/// A decoded frame: its header and attachments.
pub struct Frame<T> {
    pub header: T,
    pub attachments: Vec<Vec<u8>>,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the pipe failed")]
    Io(#[from] io::Error),
    #[error("the frame's {what} ({size} bytes or items) is over its limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: usize,
    },
    #[error("the frame header is not a valid message")]
    BadHeader(#[source] serde_json::Error),
    #[error("the message cannot be encoded")]
    Encode(#[source] serde_json::Error),
}

impl FrameError {
    /// Whether the stream ended (the peer closed its end or exited).
    pub fn is_eof(&self) -> bool {
        matches!(self, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof)
    }
}

/// The frame's beginning: header length, header JSON and attachment count.
fn encode_head<T: Serialize>(header: &T, attachments: usize) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(header).map_err(FrameError::Encode)?;
    let len = u32::try_from(json.len()).map_err(|_| FrameError::TooLarge {
        what: "header",
        size: json.len() as u64,
        limit: u32::MAX as usize,
    })?;
    let mut head = Vec::with_capacity(json.len() + 8);
    head.extend_from_slice(&len.to_le_bytes());
    head.extend_from_slice(&json);
    let count = u32::try_from(attachments).map_err(|_| FrameError::TooLarge {
        what: "attachment count",
        size: attachments as u64,
        limit: u32::MAX as usize,
    })?;
    head.extend_from_slice(&count.to_le_bytes());
    Ok(head)
}

fn check(what: &'static str, size: u64, limit: usize) -> Result<usize, FrameError> {
    if size > limit as u64 {
        return Err(FrameError::TooLarge { what, size, limit });
    }
    Ok(size as usize)
}

/// `Ok(None)` for an end of stream before a frame starts.
fn at_frame_start(r: io::Result<()>) -> Result<Option<()>, FrameError> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Width of the header's length and of the attachment count (bytes, little-endian `u32`).
const U32_BYTES: usize = 4;
/// Width of an attachment's length (bytes, little-endian `u64`).
const U64_BYTES: usize = 8;

/// What a [`FrameDecoder`]'s buffer holds once filled.
#[derive(Clone, Copy)]
enum Step {
    HeaderLen,
    Header,
    Count,
    AttachmentLen,
    Attachment,
}

/// Decodes one frame from bytes its caller reads, without I/O of its own, so that the
/// blocking worker and the async front share one decoder. Each step names the exact bytes it
/// needs next ([`buffer`](Self::buffer)); the caller fills them (`read_exact`) and calls
/// [`filled`](Self::filled), which checks every length against the limits before the next
/// buffer is allocated. The header and attachments are read into their own buffers and move
/// into the [`Frame`] without a copy; lengths are read into a fixed scratch array.
struct FrameDecoder {
    limits: FrameLimits,
    step: Step,
    /// A length or count being read (its first `step.width()` bytes).
    scratch: [u8; U64_BYTES],
    /// The header or attachment being read.
    payload: Vec<u8>,
    json: Vec<u8>,
    /// Attachments still to read.
    remaining: usize,
    attachments: Vec<Vec<u8>>,
}

impl Step {
    /// Bytes of the length or count this step reads; `None` for a payload.
    fn width(self) -> Option<usize> {
        match self {
            Step::HeaderLen | Step::Count => Some(U32_BYTES),
            Step::AttachmentLen => Some(U64_BYTES),
            Step::Header | Step::Attachment => None,
        }
    }
}

impl FrameDecoder {
    fn new(limits: FrameLimits) -> Self {
        FrameDecoder {
            limits,
            step: Step::HeaderLen,
            scratch: [0; U64_BYTES],
            payload: Vec::new(),
            json: Vec::new(),
            remaining: 0,
            attachments: Vec::new(),
        }
    }

    /// The bytes to fill next.
    fn buffer(&mut self) -> &mut [u8] {
        match self.step.width() {
            Some(width) => &mut self.scratch[..width],
            None => &mut self.payload,
        }
    }

    /// The length or count just read (little-endian).
    fn number(&self) -> u64 {
        let mut b = [0u8; U64_BYTES];
        let width = self.step.width().unwrap_or(0);
        b[..width].copy_from_slice(&self.scratch[..width]);
        u64::from_le_bytes(b)
    }

    /// Takes the filled buffer in; `Ok(true)` once the frame is complete.
    fn filled(&mut self) -> Result<bool, FrameError> {
        match self.step {
            Step::HeaderLen => {
                self.payload = vec![0; check("header", self.number(), self.limits.header)?];
                self.step = Step::Header;
            }
            Step::Header => {
                self.json = std::mem::take(&mut self.payload);
                self.step = Step::Count;
            }
            Step::Count => {
                let count = check("attachment count", self.number(), self.limits.attachments)?;
                self.attachments = Vec::with_capacity(count);
                self.remaining = count;
                return Ok(self.next_attachment());
            }
            Step::AttachmentLen => {
                self.payload = vec![0; check("attachment", self.number(), self.limits.attachment)?];
                self.step = Step::Attachment;
            }
            Step::Attachment => {
                self.attachments.push(std::mem::take(&mut self.payload));
                self.remaining -= 1;
                return Ok(self.next_attachment());
            }
        }
        Ok(false)
    }

    /// Asks for the next attachment's length; `true` when there is none left.
    fn next_attachment(&mut self) -> bool {
        self.step = Step::AttachmentLen;
        self.remaining == 0
    }

    /// The complete frame, its header decoded.
    fn finish<T: for<'de> Deserialize<'de>>(self) -> Result<Frame<T>, FrameError> {
        Ok(Frame {
            header: serde_json::from_slice(&self.json).map_err(FrameError::BadHeader)?,
            attachments: self.attachments,
        })
    }
}

/// Writes one frame (blocking; used by the worker).
pub fn write_frame<T: Serialize>(
    w: &mut impl Write,
    header: &T,
    attachments: &[&[u8]],
) -> Result<(), FrameError> {
    w.write_all(&encode_head(header, attachments.len())?)?;
    for a in attachments {
        w.write_all(&(a.len() as u64).to_le_bytes())?;
        w.write_all(a)?;
    }
    Ok(w.flush()?)
}

/// Reads one frame within `limits` (blocking). `Ok(None)` at a clean end of stream.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    limits: FrameLimits,
) -> Result<Option<Frame<T>>, FrameError> {
    let mut decoder = FrameDecoder::new(limits);
    if at_frame_start(r.read_exact(decoder.buffer()))?.is_none() {
        return Ok(None);
    }
    while !decoder.filled()? {
        r.read_exact(decoder.buffer())?;
    }
    decoder.finish().map(Some)
}

/// Writes one frame (async; used by the front toward a worker): the header, then each
/// attachment, given as parts written one after another (the pages of a checkpoint, shared with
/// the front's copy of it, are parts): on the wire, the same frame as [`write_frame`] writes of
/// their concatenation, with vectored writes, never copied into one buffer.
pub async fn write_frame_parts_async<T: Serialize>(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    header: &T,
    attachments: &[&[&[u8]]],
) -> Result<(), FrameError> {
    w.write_all(&encode_head(header, attachments.len())?)
        .await?;
    for parts in attachments {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        w.write_all(&(len as u64).to_le_bytes()).await?;
        write_all_vectored(w, parts).await?;
    }
    Ok(w.flush().await?)
}

/// Most slices one vectored write is given (Linux's `IOV_MAX`).
const MAX_IO_SLICES: usize = 1024;

/// Writes `parts` whole, in order, [`MAX_IO_SLICES`] at a time.
async fn write_all_vectored(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    parts: &[&[u8]],
) -> io::Result<()> {
    // Empty parts are left out: a vectored write of only empty slices writes nothing.
    let mut slices: Vec<io::IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let batch = rest.len().min(MAX_IO_SLICES);
        let written = w.write_vectored(&rest[..batch]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

/// Reads one frame within `limits` (async; used by the front on a hostile worker's stdout).
/// Every length is checked before anything is allocated for it. `Ok(None)` at a clean end of
/// stream.
pub async fn read_frame_async<T: for<'de> Deserialize<'de>>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    limits: FrameLimits,
) -> Result<Option<Frame<T>>, FrameError> {
    let mut decoder = FrameDecoder::new(limits);
    if at_frame_start(r.read_exact(decoder.buffer()).await.map(|_| ()))?.is_none() {
        return Ok(None);
    }
    while !decoder.filled()? {
        r.read_exact(decoder.buffer()).await?;
    }
    decoder.finish().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Reply, Request};

    #[test]
    fn an_attachment_count_past_the_frame_format_is_refused() {
        assert!(encode_head(&"x", 3).is_ok());
        if let Ok(too_many) = usize::try_from(u64::from(u32::MAX) + 1) {
            assert!(matches!(
                encode_head(&"x", too_many),
                Err(FrameError::TooLarge {
                    what: "attachment count",
                    ..
                })
            ));
        }
    }

    #[test]
    fn frames_round_trip_with_attachments() {
        let mut buf = Vec::new();
        let request = Request::Install {
            id: 7,
            files: vec!["/packages/a.whl".into()],
            items: vec!["a".into()],
        };
        write_frame(&mut buf, &request, &[b"wheel bytes"]).unwrap();
        let frame: Frame<Request> = read_frame(&mut buf.as_slice(), FrameLimits::REQUEST)
            .unwrap()
            .unwrap();
        assert!(
            matches!(frame.header, Request::Install { id: 7, ref items, .. } if items == &["a".to_string()])
        );
        assert_eq!(frame.attachments, vec![b"wheel bytes".to_vec()]);
        assert!(
            read_frame::<Request>(&mut &buf[buf.len()..], FrameLimits::REQUEST)
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_blocking_and_async_readers_agree_frame_by_frame() {
        let mut buf = Vec::new();
        let attachments: [&[u8]; 3] = [b"first", b"", b"third"];
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[]).unwrap();
        let install = Request::Install {
            id: 2,
            files: vec!["/a.whl".into(), "/b.whl".into(), "/c.whl".into()],
            items: vec![],
        };
        write_frame(&mut buf, &install, &attachments).unwrap();
        let (mut sync_r, mut async_r) = (buf.as_slice(), buf.as_slice());
        let limits = FrameLimits::REQUEST;
        let first: Frame<Reply> = read_frame(&mut sync_r, limits).unwrap().unwrap();
        let first_async: Frame<Reply> = read_frame_async(&mut async_r, limits)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(first.header, Reply::Pong { id: 1 }) && first.attachments.is_empty());
        assert!(
            matches!(first_async.header, Reply::Pong { id: 1 })
                && first_async.attachments.is_empty()
        );
        let second: Frame<Request> = read_frame(&mut sync_r, limits).unwrap().unwrap();
        let second_async: Frame<Request> = read_frame_async(&mut async_r, limits)
            .await
            .unwrap()
            .unwrap();
        let expected: Vec<Vec<u8>> = attachments.iter().map(|a| a.to_vec()).collect();
        assert_eq!(second.attachments, expected);
        assert_eq!(second_async.attachments, expected);
        assert!(read_frame::<Reply>(&mut sync_r, limits).unwrap().is_none());
        assert!(read_frame_async::<Reply>(&mut async_r, limits)
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn a_frame_cut_short_is_an_error_not_an_end() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[b"attachment"]).unwrap();
        let limits = FrameLimits::REQUEST;
        // A stream that ends within the header's length counts as ended (read_exact does not
        // say how much it read); from there on, the frame is cut.
        for cut in U32_BYTES..buf.len() {
            let short = &buf[..cut];
            let err = read_frame::<Reply>(&mut &short[..], limits)
                .err()
                .expect("cut frame");
            assert!(err.is_eof(), "{cut}: {err}");
            let err = read_frame_async::<Reply>(&mut &short[..], limits)
                .await
                .err()
                .expect("cut frame");
            assert!(err.is_eof(), "{cut}: {err}");
        }
    }

    #[test]
    fn lengths_over_the_limits_are_refused_before_allocating() {
        // A header claiming 4 GiB - 1 bytes must be refused, not allocated.
        let mut buf = u32::MAX.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        assert!(matches!(
            read_frame::<Reply>(&mut buf.as_slice(), FrameLimits::CONTROL),
            Err(FrameError::TooLarge { what: "header", .. })
        ));
        // An attachment on a control reply is refused too.
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[b"x"]).unwrap();
        assert!(matches!(
            read_frame::<Reply>(&mut buf.as_slice(), FrameLimits::CONTROL),
            Err(FrameError::TooLarge { .. })
        ));
    }
}
