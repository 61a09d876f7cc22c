//! A sandbox's interpreter state across its workers (`--stateful`): a checkpoint
//! after every completed call (`after_run`; taken once the call's answer is sent, with the
//! sandbox's worker held until it is kept, unless a save to the state directory must carry
//! it first), kept by the sandbox
//! ([`crate::sandbox::checkpoint::Saved`]), and restored into the next worker when one is lost
//! or stopped (`resume`), so that the variables, functions and imports of earlier calls come
//! back, not only the files.

use crate::protocol::Uncapturable;
use crate::sandbox::checkpoint::{CheckpointError, Resumable, MAX_MEMORY_BYTES};
use crate::sandbox::files::SandboxFiles;
use crate::sandbox::live::{Owner, Sandbox};
use crate::server::call::execute::Executor;
use crate::server::call::outcome::CheckpointWhen;
use crate::server::call::queue::Held;
use crate::server::call::result::CallResult;
use crate::traces;
use crate::worker::client::{AskedCheckpoint, Checkpointed, Deadline, Phase, Worker, WorkerError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument as _;

/// How long taking or restoring a checkpoint may take (seconds): a scan of the memory and
/// its pages through a pipe, milliseconds for tens of MiB.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);

/// How the checkpoint's debug line says it was read before the call's answer went out.
const BEFORE: &str = "before the answer";
/// How it says it was read after the answer went out.
const AFTER: &str = "after the answer";

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

/// Why a kept worker's checkpoint was not taken: the worker is to be discarded.
#[derive(Debug, thiserror::Error)]
pub(super) enum CheckpointFailed {
    /// It did not answer in time, or its pipes failed.
    #[error("the interpreter did not answer: {0}")]
    Worker(#[source] WorkerError),
    /// It answered pages that do not fit (the kept state is cleared).
    #[error("its pages did not fit: {0}")]
    Unfit(#[source] CheckpointError),
}

impl Executor {
    /// The most bytes of linear memory a checkpoint may describe: `--memory`, else
    /// [`MAX_MEMORY_BYTES`].
    fn checkpoint_cap(&self) -> u64 {
        self.settings
            .limits
            .memory_limit
            .unwrap_or(MAX_MEMORY_BYTES)
    }

    /// Whether `sandbox`'s checkpoint may wait until its call's answer is sent: not when the
    /// answer goes out only once the sandbox is saved to the state directory with it
    /// (`--state-dir`, a sandbox reached by handle), so that another replica that takes its
    /// next call finds this call's state.
    fn defers_checkpoint(&self, sandbox: &Sandbox) -> bool {
        !(self.settings.saves_state && sandbox.owner == Owner::Handle)
    }

    /// After a call that kept its worker in a sandbox that checkpoints: when the run said
    /// the state cannot be captured (`said`), the sandbox's state is stale and `result`'s
    /// `state` note says why, with no round trip; otherwise the checkpoint is asked for now
    /// and read once the answer is sent, or read now when it may not wait
    /// ([`Executor::defers_checkpoint`]). `Err` when it failed now: the worker is to be
    /// discarded.
    pub(super) async fn after_run(
        &self,
        sandbox: &Sandbox,
        worker: &mut Worker,
        said: Option<Vec<Uncapturable>>,
        result: &mut CallResult,
    ) -> Result<CheckpointWhen, CheckpointFailed> {
        if let Some(reasons) = said.filter(|reasons| !reasons.is_empty()) {
            if let Some(note) = uncaptured(sandbox, &reasons) {
                add_note(result, note);
            }
            return Ok(CheckpointWhen::Done);
        }
        let deadline = Deadline::after(CHECKPOINT_TIMEOUT, Phase::Checkpointing);
        let started = std::time::Instant::now();
        let asked = worker
            .ask_checkpoint(deadline)
            .await
            .map_err(CheckpointFailed::Worker)?;
        if self.defers_checkpoint(sandbox) {
            return Ok(CheckpointWhen::AfterAnswer(asked, deadline));
        }
        let taken = take(
            sandbox,
            worker,
            (asked, deadline),
            self.checkpoint_cap(),
            BEFORE,
        )
        .instrument(traces::step("checkpoint"))
        .await;
        result.timing.checkpoint = started.elapsed();
        if let Some(note) = taken? {
            add_note(result, note);
        }
        Ok(CheckpointWhen::Done)
    }

    /// Takes the checkpoint a call owes ([`CheckpointWhen::AfterAnswer`]) in the background,
    /// holding its sandbox's worker (`held`) and its running slot (`permit`) until it is kept:
    /// the sandbox's next call queues behind it, and `--workers` counts it. A note the
    /// checkpoint gives goes to the sandbox's next call; a worker that fails it, or whose
    /// sandbox ended meanwhile, is killed, and the next call's new worker says what was lost
    /// (its state is then stale: its last checkpoint is older than its last call).
    pub(super) fn checkpoint_after_answer(
        &self,
        mut held: Held,
        permit: OwnedSemaphorePermit,
        sandbox: Arc<Sandbox>,
        asked: (AskedCheckpoint, Deadline),
    ) {
        let cap = self.checkpoint_cap();
        // In use and checkpointing from now, before the answer goes out: a create at
        // `--max-sandboxes` that comes right after the answer finds it so and waits, and the
        // sandbox cannot expire or be evicted before the task first runs.
        let in_flight = sandbox.begin();
        let checkpointing = sandbox.checkpointing();
        let owed = async move {
            let failed = match held.slot().as_mut() {
                Some(worker) => tokio::select! {
                    taken = take(&sandbox, worker, asked, cap, AFTER) => match taken {
                        Ok(note) => {
                            if let Some(note) = note {
                                sandbox.notes.set(note);
                            }
                            None
                        }
                        Err(e) => Some(e.to_string()),
                    },
                    _ = sandbox.until_ended() => None,
                },
                None => None,
            };
            if let Some(why) = &failed {
                tracing::warn!("sandbox {}: checkpoint failed: {why}", sandbox.id.short());
                sandbox
                    .state
                    .stale(&format!("its checkpoint failed ({why})"));
                sandbox.with_files(SandboxFiles::survive);
            }
            if failed.is_some() || sandbox.has_ended() {
                held.discard().await;
            }
            // Idle, then its worker free, then settled: whoever waits for that
            // (`Sandbox::settled`) finds it ready to hibernate or end at `--max-sandboxes`.
            drop(in_flight);
            drop((held, permit));
            drop(checkpointing);
            sandbox.end_call();
        };
        tokio::spawn(owed.instrument(traces::step("checkpoint after the answer")));
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

/// Reads the checkpoint `asked` of `worker` (at most `cap` bytes of linear memory) and keeps it
/// in `sandbox`, logging it as read `when` ([`BEFORE`] or [`AFTER`] the call's answer). The
/// `state` note due when the state turned out not capturable.
///
/// Errors: [`CheckpointFailed`]; the worker is then to be discarded.
async fn take(
    sandbox: &Sandbox,
    worker: &mut Worker,
    (asked, deadline): (AskedCheckpoint, Deadline),
    cap: u64,
    when: &str,
) -> Result<Option<String>, CheckpointFailed> {
    let started = std::time::Instant::now();
    let taken = worker.checkpoint_taken(asked, cap, deadline).await;
    let answered = started.elapsed();
    match taken.map_err(CheckpointFailed::Worker)? {
        Checkpointed::Taken(zygote, pages) => {
            let installed = worker.installed_pins();
            let kept = sandbox
                .state
                .keep(zygote, &pages, installed)
                .map_err(CheckpointFailed::Unfit)?;
            tracing::debug!(
                "sandbox {}: checkpoint of {} changed page(s) read {when} in {} µs; {} KiB kept (the worker's answer in {} µs)",
                sandbox.id.short(),
                pages.indexes.len(),
                started.elapsed().as_micros(),
                kept >> 10,
                answered.as_micros()
            );
            Ok(None)
        }
        Checkpointed::Uncapturable(reasons) => Ok(uncaptured(sandbox, &reasons)),
    }
}

/// `sandbox`'s last call left a state that cannot be captured, for `reasons`: the state is
/// stale, and the `state` note that says so, unless the reason is nothing the code did.
fn uncaptured(sandbox: &Sandbox, reasons: &[Uncapturable]) -> Option<String> {
    // An interpreter booted while the zygote warmed up: nothing the code did, and nothing it
    // can change; a loss later says the state is gone.
    if reasons == [Uncapturable::NotForked] {
        sandbox.state.stale(&Uncapturable::NotForked.to_string());
        return None;
    }
    let why = reasons
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    sandbox.state.stale(&why);
    Some(format!(
        "not saved: this call's interpreter state cannot be captured ({why}); if the interpreter is lost, only the sandbox's files come back"
    ))
}

/// Appends `note` to `result`'s `state` note.
fn add_note(result: &mut CallResult, note: String) {
    result.state = Some(match result.state.take() {
        Some(earlier) => format!("{earlier}; {note}"),
        None => note,
    });
}
