//! The scientific runtime's side of checkpoints (docs/architecture.md §3.4 and §5.4): as in
//! Pyodide (`../checkpoint.rs`), the guest's whole state between turns is its linear memory, so
//! a checkpoint is the pages that differ from the zygote's pristine memory
//! (`../linear_memory.rs`), and a restore writes them into a fresh child of the same zygote.
//!
//! Between turns no guest frame is live: the stack pointer is back at its base and the
//! function table is the module's own (a static build loads no library), so the memory is all
//! there is. What lies outside it is the WASI context's descriptor table: a file the code
//! left open would not be open in the restored interpreter, so the guest counts its open
//! files beyond the zygote's (`scientific.py` `_capturable`) and the checkpoint then names them
//! instead.

use super::super::checkpoint::{kept_tracking, restore_image, send_taken, send_uncapturable};
use super::super::linear_memory::{Pristine, Shadow};
use super::super::serve::Served;
use super::Scientific;
use crate::protocol::pages::ZygoteId;
use crate::protocol::{CallId, Uncapturable};
use anyhow::Result;
use serde_json::json;

/// What the guest found outside its linear memory beyond the zygote's baseline.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Outside {
    open_files: u32,
}

impl Scientific {
    /// The interpreter's shadow, made at the first checkpoint or restore; `None` in an
    /// interpreter not forked from a zygote.
    fn shadow(&mut self) -> Option<&mut Shadow> {
        if self.shadow.is_none() {
            self.shadow = Pristine::inherited().map(Shadow::new);
        }
        self.shadow.as_mut()
    }

    /// The pages written since the last checkpoint or restore, as the kernel recorded them, or
    /// `None` when it cannot say (then every page is compared, from now on).
    fn written_pages(&mut self) -> Option<Vec<u32>> {
        let tracked = self.dirty.as_mut()?;
        let found = tracked.written(self.guest.memory());
        kept_tracking(&mut self.dirty, found)
    }

    /// Why the interpreter's state cannot be captured now (empty: it can).
    fn uncapturable(&mut self) -> Vec<Uncapturable> {
        if Pristine::inherited().is_none() {
            return vec![Uncapturable::NotForked];
        }
        let outside = self
            .turn(&json!({"op": "capturable"}), None)
            .ok()
            .and_then(|answer| serde_json::from_slice::<Outside>(&answer).ok());
        match outside {
            Some(Outside { open_files: 0 }) => Vec::new(),
            Some(Outside { open_files: count }) => vec![Uncapturable::OpenFiles { count }],
            // A guest that cannot say (user code broke the runner) may hold anything.
            None => vec![Uncapturable::Unknown],
        }
    }

    /// Answers [`crate::protocol::Request::Checkpoint`]: the pages changed since the last
    /// checkpoint, or why there are none.
    ///
    /// Errors: the reply cannot be sent.
    pub(super) fn take_checkpoint(&mut self, id: CallId) -> Result<Served> {
        let reasons = self.uncapturable();
        if !reasons.is_empty() {
            return send_uncapturable(id, reasons);
        }
        self.shadow();
        let written = self.written_pages();
        let Some(shadow) = self.shadow.as_mut() else {
            return send_uncapturable(id, vec![Uncapturable::NotForked]);
        };
        let memory = self.guest.memory();
        let pages = match written {
            Some(written) => shadow.changes_among(memory, written),
            None => shadow.changes(memory),
        };
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
