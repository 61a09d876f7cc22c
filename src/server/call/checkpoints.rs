//! A sandbox's interpreter state across its workers (`--stateful`): a checkpoint
//! after every completed call (`checkpoint`), kept by the sandbox
//! ([`crate::sandbox::checkpoint::Saved`]), and restored into the next worker when one is lost
//! or stopped (`resume`), so that the variables, functions and imports of earlier calls come
//! back, not only the files.

use crate::protocol::Uncapturable;
use crate::sandbox::checkpoint::{Resumable, MAX_MEMORY_BYTES};
use crate::sandbox::live::Sandbox;
use crate::server::call::execute::Executor;
use crate::server::call::result::CallResult;
use crate::worker::client::{Checkpointed, Deadline, Phase, Worker};
use std::time::Duration;

/// How long taking or restoring a checkpoint may take (seconds): a scan of the memory and
/// its pages through a pipe, milliseconds for tens of MiB.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);

/// What [`Executor::resume`] did with a new worker.
pub enum Resumed {
    /// The sandbox had no state to restore.
    Nothing,
    /// The interpreter holds the sandbox's state as its last completed call left it.
    Restored,
    /// The state could not be restored (why, in words for the `state` note); the worker
    /// is to be discarded.
    Failed(String),
}

impl Executor {
    /// After a call that kept its worker: takes a checkpoint and keeps it in the sandbox.
    /// When the state cannot be captured, `result`'s `state` note says why. `false` when the
    /// worker failed to answer, or answered pages that do not fit (it is to be discarded).
    pub(super) async fn checkpoint(
        &self,
        sandbox: &Sandbox,
        worker: &mut Worker,
        result: &mut CallResult,
    ) -> bool {
        let started = std::time::Instant::now();
        let max = self
            .settings
            .limits
            .memory_limit
            .unwrap_or(MAX_MEMORY_BYTES);
        let deadline = Deadline::after(CHECKPOINT_TIMEOUT, Phase::Checkpointing);
        let taken = worker.checkpoint(max, deadline).await;
        let answered = started.elapsed();
        let taken = match taken {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!("sandbox {}: checkpoint failed: {e}", sandbox.id.short());
                return false;
            }
        };
        match taken {
            Checkpointed::Taken(zygote, pages) => {
                let installed = worker.installed_pins();
                let kept = match sandbox.state.keep(zygote, &pages, installed) {
                    Ok(kept) => kept,
                    Err(e) => {
                        tracing::warn!(
                            "sandbox {}: a worker's checkpoint did not fit: {e}",
                            sandbox.id.short()
                        );
                        return false;
                    }
                };
                tracing::debug!(
                    "sandbox {}: checkpoint of {} changed page(s) in {} µs; {} KiB kept (the worker's answer in {} µs)",
                    sandbox.id.short(),
                    pages.indexes.len(),
                    started.elapsed().as_micros(),
                    kept >> 10,
                    answered.as_micros()
                );
            }
            // An interpreter booted while the zygote warmed up: nothing the code did, and
            // nothing it can change; a loss later says the state is gone.
            Checkpointed::Uncapturable(reasons) if reasons == [Uncapturable::NotForked] => {
                sandbox.state.stale(&Uncapturable::NotForked.to_string());
            }
            Checkpointed::Uncapturable(reasons) => {
                let why = reasons
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                sandbox.state.stale(&why);
                let note = format!(
                    "not saved: this call's interpreter state cannot be captured ({why}); if the interpreter is lost, only the sandbox's files come back"
                );
                result.state = Some(match result.state.take() {
                    Some(earlier) => format!("{earlier}; {note}"),
                    None => note,
                });
            }
        }
        true
    }

    /// A new worker for `sandbox`: when the sandbox holds a state it can resume, installs the
    /// packages that state had and restores it into the worker.
    pub(super) async fn resume(&self, sandbox: &Sandbox, worker: &mut Worker) -> Resumed {
        // A hibernated state is read back first: a few hundred KiB from local disk, read in
        // place (the read is shorter than a hop to a blocking thread would be worth).
        if let Err(e) = sandbox.state.wake(&sandbox.id) {
            return Resumed::Failed(e.to_string());
        }
        let taken = std::time::Instant::now();
        let Some(Resumable {
            image,
            installed,
            reseed,
        }) = sandbox.state.resumable()
        else {
            tracing::debug!(
                "sandbox {}: no current state to restore",
                sandbox.id.short()
            );
            return Resumed::Nothing;
        };
        tracing::debug!(
            "sandbox {}: its state taken for a restore in {} µs",
            sandbox.id.short(),
            taken.elapsed().as_micros()
        );
        if !installed.is_empty() {
            let deadline = Deadline::after(self.settings.limits.install_timeout, Phase::Installing);
            if let Err(e) = self.reinstall(worker, &installed, deadline).await {
                sandbox.state.forget();
                return Resumed::Failed(format!("its packages did not install again: {e}"));
            }
        }
        let deadline = Deadline::after(CHECKPOINT_TIMEOUT, Phase::Restoring);
        let started = std::time::Instant::now();
        // The pages go to the worker from where the kept state holds them.
        let (indexes, pages): (Vec<u32>, Vec<&[u8]>) = image.pages().unzip();
        let index_bytes = crate::protocol::pages::index_bytes(&indexes);
        let sent = (index_bytes.as_slice(), pages.as_slice());
        let restored = worker.restore(image.zygote(), image.memory_bytes(), sent, reseed, deadline);
        match restored.await {
            Ok(None) => {
                tracing::debug!(
                    "sandbox {}: restored {} page(s) in {} µs",
                    sandbox.id.short(),
                    indexes.len(),
                    started.elapsed().as_micros()
                );
                Resumed::Restored
            }
            Ok(Some(why)) => {
                sandbox.state.forget();
                Resumed::Failed(why)
            }
            Err(e) => {
                sandbox.state.forget();
                Resumed::Failed(e.to_string())
            }
        }
    }

    /// Installs `installed` (name, version) pinned into `worker`, as the interpreter whose
    /// state is being restored had them (Pyodide's: a scientific interpreter installs nothing,
    /// so its state names nothing installed).
    async fn reinstall(
        &self,
        worker: &mut Worker,
        installed: &[(String, String)],
        deadline: Deadline,
    ) -> Result<(), super::execute::InstallError> {
        let pins: Vec<String> = installed
            .iter()
            .map(|(name, version)| format!("{name}=={version}"))
            .collect();
        deadline
            .bound(self.install(worker, None, &[], &pins, deadline))
            .await
            .map_err(super::execute::InstallError::Worker)?
    }
}
