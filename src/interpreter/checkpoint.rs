//! The interpreter's side of checkpoints (docs/architecture.md §3.4, `src/interpreter/linear_memory.rs`): takes one
//! between runs when the front asks, and restores one into a fresh interpreter.
//!
//! A checkpoint is whole only when everything the interpreter holds is in its linear memory;
//! the runner (`runtime/js/runner.js` `capturable`) and the engine's timers say what lies outside,
//! and the answer then names it instead of sending pages that would restore a broken
//! interpreter.

use super::linear_memory::{Pristine, RestoreError, Shadow};
use super::reply::{send, send_with};
use super::runner::{call, parse_answer, Empty};
use super::serve::{Served, Serving};
use crate::engine::Arg;
use crate::interpreter::dirty_pages::{DirtyPages, TrackingError};
use crate::protocol::pages::{Pages, ZygoteId};
use crate::protocol::{CallId, CheckpointOutcome, Reply, Uncapturable};
use anyhow::Result;
use serde::Deserialize;

/// What the runner found outside linear memory beyond the zygote's baseline.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Outside {
    js_objects: u32,
    open_files: u32,
    loaded_libraries: u32,
}

impl Serving {
    /// The interpreter's shadow, made at the first checkpoint or restore; `None` in an
    /// interpreter not forked from a zygote.
    fn shadow(&mut self) -> Option<&mut Shadow> {
        Shadow::in_slot(&mut self.shadow)
    }

    /// The pages written since the last checkpoint or restore, as the kernel recorded them
    /// (`dirty_pages.rs`), or `None` when it cannot say: then every page is to be compared, and
    /// so at every later checkpoint (the tracking is dropped at its first error).
    fn written_pages(&mut self) -> Option<Vec<u32>> {
        let Serving {
            engine,
            runner,
            dirty,
            ..
        } = self;
        let tracked = dirty.as_mut()?;
        let found = engine
            .with_bytes(&runner.memory, |m| tracked.written(m))
            .map_err(TrackingError::Memory)
            .and_then(|written| written);
        kept_tracking(dirty, found)
    }

    /// Why the interpreter's state cannot be captured now (empty: it can).
    pub(super) fn uncapturable(&mut self) -> Vec<Uncapturable> {
        if Pristine::inherited().is_none() {
            return vec![Uncapturable::NotForked];
        }
        let mut reasons = Vec::new();
        // Synchronous (runner.js): the counts, or an error when user code broke them.
        let outside = self
            .engine
            .call(&self.runner.capturable, &[])
            .ok()
            .and_then(|text| serde_json::from_str::<Outside>(&text).ok());
        match outside {
            Some(o) => {
                if o.js_objects > 0 {
                    reasons.push(Uncapturable::JsObjects {
                        count: o.js_objects,
                    });
                }
                if o.open_files > 0 {
                    reasons.push(Uncapturable::OpenFiles {
                        count: o.open_files,
                    });
                }
                if o.loaded_libraries > 0 {
                    reasons.push(Uncapturable::LoadedLibraries {
                        count: o.loaded_libraries,
                    });
                }
            }
            // A runner that cannot say (user code broke Pyodide's objects) may hold anything.
            None => reasons.push(Uncapturable::Unknown),
        }
        let timers = self.engine.pending_timers();
        if timers > 0 {
            reasons.push(Uncapturable::PendingCallbacks {
                count: u32::try_from(timers).unwrap_or(u32::MAX),
            });
        }
        reasons
    }

    /// Answers [`crate::protocol::Request::Checkpoint`]: the pages changed since the
    /// last checkpoint as two attachments, or why there are none.
    pub(super) fn checkpoint(&mut self, id: CallId) -> Result<Served> {
        let started = std::time::Instant::now();
        let reasons = self.uncapturable();
        let checked = started.elapsed();
        if !reasons.is_empty() {
            return send_uncapturable(id, reasons);
        }
        self.shadow();
        let written = self.written_pages();
        let found = started.elapsed();
        let Serving {
            engine,
            runner,
            shadow,
            ..
        } = self;
        let Some(shadow) = shadow.as_mut() else {
            // Not forked (uncapturable() says so first): answered all the same.
            return send_uncapturable(id, vec![Uncapturable::NotForked]);
        };
        let zygote = shadow.zygote();
        let pages = engine.with_bytes(&runner.memory, |m| match written {
            Some(written) => shadow.changes_among(m, written),
            None => shadow.changes(m),
        })?;
        tracing::debug!(
            "checkpoint: capturable checked in {} µs, written pages {} in {} µs, {} changed page(s) of {} KiB encoded in {} µs ({} bytes)",
            checked.as_micros(),
            if self.dirty.is_some() {
                "found"
            } else {
                "not known (all compared)"
            },
            (found - checked).as_micros(),
            pages.indexes.len(),
            pages.memory_bytes >> 10,
            (started.elapsed() - found).as_micros(),
            pages.bytes.len()
        );
        send_taken(id, zygote, &pages)
    }

    /// Answers [`crate::protocol::Request::Restore`]: `Some(why)` when the state was
    /// not restored.
    pub(super) fn restore(
        &mut self,
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        reseed: bool,
        attachments: Vec<Vec<u8>>,
    ) -> Option<String> {
        let started = std::time::Instant::now();
        let image = match restore_image(self.shadow(), zygote, memory_bytes, attachments) {
            Ok(image) => image,
            Err(why) => return Some(why),
        };
        let grown = call(
            &mut self.engine,
            &self.runner.grow,
            id,
            &[Arg::Num(memory_bytes as f64)],
            None,
        );
        if let Err(e) = grown
            .map_err(anyhow::Error::from)
            .and_then(|t| parse_answer::<Empty>(&t).map_err(anyhow::Error::from))
        {
            return Some(format!("{e:#}"));
        }
        let grown_at = started.elapsed();
        let Serving {
            engine,
            runner,
            shadow,
            ..
        } = self;
        let shadow = shadow.as_mut()?;
        match engine.with_bytes(&runner.memory, |m| shadow.restore(m, &image)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Some(e.to_string()),
            Err(e) => return Some(e.to_string()),
        }
        // The restore's own writes made memory what the shadow now holds: not changes.
        self.written_pages();
        tracing::debug!(
            "restore: memory grown in {} µs, {} page(s) written in {} µs",
            grown_at.as_micros(),
            image.indexes.len(),
            (started.elapsed() - grown_at).as_micros()
        );
        if reseed {
            return self.reseed(id);
        }
        None
    }

    /// Makes the next run reseed Python's `random` ([`crate::protocol::Request::Reseed`],
    /// and a fork's restore): `Some(why)` when it could not.
    pub(super) fn reseed(&mut self, id: CallId) -> Option<String> {
        let reseeded = call(&mut self.engine, &self.runner.reseed, id, &[], None);
        reseeded.err().map(|e| e.to_string())
    }
}

/// Answers a checkpoint request with why the state cannot be captured (`reasons`, at least
/// one).
///
/// Errors: the reply cannot be sent.
pub(super) fn send_uncapturable(id: CallId, reasons: Vec<Uncapturable>) -> Result<Served> {
    let outcome = CheckpointOutcome::Uncapturable { reasons };
    send(&Reply::Checkpoint { id, outcome })?;
    Ok(Served::Answered)
}

/// Answers a checkpoint request with `pages`, measured against zygote `zygote`, as the two
/// attachments [`CheckpointOutcome::Taken`] names.
///
/// Errors: more pages than a `u32` counts, or the reply cannot be sent.
pub(super) fn send_taken(id: CallId, zygote: ZygoteId, pages: &Pages) -> Result<Served> {
    let outcome = CheckpointOutcome::Taken {
        zygote,
        memory_bytes: pages.memory_bytes,
        pages: u32::try_from(pages.indexes.len())?,
    };
    send_with(
        &Reply::Checkpoint { id, outcome },
        &[&pages.index_bytes(), &pages.bytes],
    )?;
    Ok(Served::Answered)
}

/// A restore's pages from its two attachments, if they fit and were taken against the zygote
/// this interpreter was forked from (`shadow`: `None` when it was not); otherwise why not, as
/// the reply's `error` words it.
pub(super) fn restore_image(
    shadow: Option<&mut Shadow>,
    zygote: ZygoteId,
    memory_bytes: u64,
    attachments: Vec<Vec<u8>>,
) -> Result<Pages, String> {
    let mut parts = attachments.into_iter();
    let (Some(indexes), Some(bytes), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(RestoreError::Shape.to_string());
    };
    let image = Pages::from_parts(memory_bytes, &indexes, bytes).map_err(|e| e.to_string())?;
    match shadow.map(|s| s.zygote()) {
        None => Err(RestoreError::NotForked.to_string()),
        Some(ours) if ours != zygote => Err(RestoreError::OtherZygote.to_string()),
        Some(_) => Ok(image),
    }
}

/// The pages the kernel found written (`found`), or `None` when it could not say: the
/// tracking (`dirty`) is then dropped, and every later checkpoint compares every page.
pub(super) fn kept_tracking(
    dirty: &mut Option<DirtyPages>,
    found: Result<Vec<u32>, TrackingError>,
) -> Option<Vec<u32>> {
    found
        .map_err(|e| {
            tracing::warn!("checkpoints compare the whole memory from now on: {e}");
            *dirty = None;
        })
        .ok()
}
