//! The scientific runtime's side of checkpoints (docs/architecture.md §3.4 and §5.4): as in
//! Pyodide (`../checkpoint.rs`), the guest's whole state between turns is its linear memory, so
//! a checkpoint is the pages that differ from the zygote's pristine memory
//! (`../linear_memory.rs`), and a restore writes them into a fresh child of the same zygote.
//!
//! Between turns no guest frame is live: the stack pointer is back at its base and the
//! function table is the module's own (a static build loads no library), so the memory is all
//! there is. What lies outside it is the WASI context's descriptor table: a file the code
//! left open would not be open in the restored interpreter. Every file or folder the guest
//! holds open is a descriptor of this process (wasmtime-wasi opens it on the host), so the
//! checkpoint counts this process's descriptors beyond those it had once forked
//! ([`open_descriptors`]; the guest's word is not asked) and then names them instead.

use super::super::checkpoint::{kept_tracking, restore_image, send_taken, send_uncapturable};
use super::super::confine::GUEST_NOFILE_MAX;
use super::super::linear_memory::{Pristine, Shadow};
use super::super::serve::Served;
use super::Scientific;
use crate::protocol::pages::ZygoteId;
use crate::protocol::{CallId, Uncapturable};
use anyhow::Result;
use std::os::fd::RawFd;

/// The descriptors open in this process now: at most the guest's descriptor limit, so none
/// lies past it.
pub(super) fn open_descriptors() -> Vec<RawFd> {
    let highest = RawFd::try_from(GUEST_NOFILE_MAX).unwrap_or(RawFd::MAX);
    (0..highest)
        // SAFETY: fcntl(F_GETFD) on a number that may not be open only reads its flags or
        // fails.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0)
        .collect()
}

impl Scientific {
    /// The interpreter's shadow, made at the first checkpoint or restore; `None` in an
    /// interpreter not forked from a zygote.
    fn shadow(&mut self) -> Option<&mut Shadow> {
        Shadow::in_slot(&mut self.shadow)
    }

    /// The pages written since the last checkpoint or restore, as the kernel recorded them, or
    /// `None` when it cannot say (then every page is compared, from now on).
    fn written_pages(&mut self) -> Option<Vec<u32>> {
        let tracked = self.dirty.as_mut()?;
        let found = tracked.written(self.guest.memory());
        kept_tracking(&mut self.dirty, found)
    }

    /// Why the interpreter's state cannot be captured now (empty: it can).
    pub(super) fn uncapturable(&mut self) -> Vec<Uncapturable> {
        if Pristine::inherited().is_none() {
            return vec![Uncapturable::NotForked];
        }
        let opened = open_descriptors()
            .into_iter()
            .filter(|fd| !self.forked_descriptors.contains(fd))
            .count();
        match u32::try_from(opened) {
            Ok(0) => Vec::new(),
            Ok(count) => vec![Uncapturable::OpenFiles { count }],
            Err(_) => vec![Uncapturable::Unknown],
        }
    }

    /// Answers [`crate::protocol::Request::Checkpoint`]: the pages changed since the last
    /// checkpoint, or why there are none.
    ///
    /// Errors: the reply cannot be sent.
    pub(super) fn take_checkpoint(&mut self, id: CallId) -> Result<Served> {
        let started = std::time::Instant::now();
        let reasons = self.uncapturable();
        if !reasons.is_empty() {
            return send_uncapturable(id, reasons);
        }
        let checked = started.elapsed();
        self.shadow();
        let written = self.written_pages();
        let scanned = started.elapsed();
        let Some(shadow) = self.shadow.as_mut() else {
            return send_uncapturable(id, vec![Uncapturable::NotForked]);
        };
        let memory = self.guest.memory();
        let pages = match written {
            Some(written) => shadow.changes_among(memory, written),
            None => shadow.changes(memory),
        };
        tracing::debug!(
            "checkpoint: capturable checked in {} µs, written pages found in {} µs, {} page(s) compared in {} µs",
            checked.as_micros(),
            (scanned - checked).as_micros(),
            pages.indexes.len(),
            (started.elapsed() - scanned).as_micros()
        );
        send_taken(id, shadow.zygote(), &pages)
    }

    /// Answers [`crate::protocol::Request::Restore`]: `Some(why)` when the state was not
    /// restored (the worker is then discarded).
    pub(super) fn restore_checkpoint(
        &mut self,
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        reseed: bool,
        attachments: Vec<Vec<u8>>,
    ) -> Option<String> {
        let image = match restore_image(self.shadow(), zygote, memory_bytes, attachments) {
            Ok(image) => image,
            Err(why) => return Some(why),
        };
        if let Err(e) = self.guest.grow_memory_to(memory_bytes) {
            return Some(crate::protocol::error_words(&e));
        }
        let shadow = self.shadow.as_mut()?;
        if let Err(e) = shadow.restore(self.guest.memory_mut(), &image) {
            return Some(e.to_string());
        }
        // The restore's own writes made memory what the shadow now holds: not changes.
        self.written_pages();
        if reseed {
            return self.reseed_guest(id);
        }
        None
    }

    /// Makes the next run reseed Python's `random` and NumPy's global generator (a fork's
    /// restore, [`crate::protocol::Request::Reseed`]): `Some(why)` when it could not.
    pub(super) fn reseed_guest(&mut self, _id: CallId) -> Option<String> {
        self.request("reseed").err().map(|e| format!("{e:#}"))
    }
}
