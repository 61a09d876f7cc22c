//! The two runtimes one server serves (docs/architecture.md §5.4): its own (`--runtime`),
//! ready from the start, and the other, made ready at the first sandbox that asks for it
//! (`create_sandbox(runtime=…)`), then kept. Each has its own workers' spares (its own
//! launcher, zygote and arguments) and says what it has built in; the executor picks by the
//! sandbox's runtime, so that everything else (queue, limits, registry, tools) stays one.

use crate::packages::scientific::BuiltIn;
use crate::protocol::launch::Runtime;
use crate::worker::spares::Spares;
use futures::future::BoxFuture;
use std::sync::Arc;
use thiserror::Error;
use tokio::sync::OnceCell;

/// What the executor needs of one runtime.
pub struct RuntimeKit {
    /// Where its workers come from.
    pub spares: Arc<Spares>,
    /// The scientific runtime's packages, which are all a call there can have (nothing is
    /// installed); `None` for Pyodide, which installs.
    pub built_in: Option<Arc<BuiltIn>>,
}

/// Makes the other runtime ready (`src/modes.rs`): its artifacts, launcher and spares.
///
/// Errors: why it cannot be had on this server, for the tool's answer.
pub type MakeKit = Box<dyn Fn() -> BoxFuture<'static, anyhow::Result<RuntimeKit>> + Send + Sync>;

/// A sandbox asked for a runtime this server cannot give it.
#[derive(Debug, Error)]
#[error("the {runtime} runtime cannot be had on this server: {source:#}")]
pub struct RuntimeUnavailable {
    /// The runtime asked for.
    pub runtime: Runtime,
    /// Why: an option of the server that only the other runtime serves, or its artifacts
    /// could not be made ready (offline, not cached, a failed check).
    #[source]
    pub source: anyhow::Error,
}

/// The server's runtimes (see the module's documentation).
pub struct Runtimes {
    /// `--runtime`: the runtime of sandboxes that asked for none.
    own: Runtime,
    /// Its kit, ready from the start.
    own_kit: RuntimeKit,
    /// The other runtime's kit, once made.
    other: OnceCell<RuntimeKit>,
    /// Makes it.
    make_other: MakeKit,
}

impl Runtimes {
    /// `own_kit` serves `own`; the other runtime is made by `make_other` when first asked for.
    pub fn new(own: Runtime, own_kit: RuntimeKit, make_other: MakeKit) -> Runtimes {
        Runtimes {
            own,
            own_kit,
            other: OnceCell::new(),
            make_other,
        }
    }

    /// The server's own runtime's kit.
    pub fn own_kit(&self) -> &RuntimeKit {
        &self.own_kit
    }

    /// The kit of `runtime` (`None`: the server's own), made ready now when it is the other one
    /// and was never asked for (a minute or more when the scientific runtime's artifacts are
    /// not in the cache yet). Callers asking at once wait for one making.
    ///
    /// Errors: [`RuntimeUnavailable`]; a later call tries again.
    pub async fn kit(&self, runtime: Option<Runtime>) -> Result<&RuntimeKit, RuntimeUnavailable> {
        let runtime = runtime.unwrap_or(self.own);
        if runtime == self.own {
            return Ok(&self.own_kit);
        }
        self.other
            .get_or_try_init(|| (self.make_other)())
            .await
            .map_err(|source| RuntimeUnavailable { runtime, source })
    }

    /// The kit of `runtime` if it is ready (the server's own always is).
    pub fn ready_kit(&self, runtime: Option<Runtime>) -> Option<&RuntimeKit> {
        match runtime.unwrap_or(self.own) == self.own {
            true => Some(&self.own_kit),
            false => self.other.get(),
        }
    }

    /// Every kit made so far.
    pub fn kits(&self) -> impl Iterator<Item = &RuntimeKit> {
        std::iter::once(&self.own_kit).chain(self.other.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::launcher::Launcher;
    use crate::worker::mount::Mounts;
    use crate::worker::spares::SpareCounts;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A kit whose workers are never started (the tests take none).
    fn kit() -> RuntimeKit {
        let launcher = Launcher::new(
            "/nonexistent".into(),
            Vec::new(),
            None,
            None,
            Mounts::default(),
            None,
        );
        RuntimeKit {
            spares: Spares::new(
                Arc::new(launcher),
                SpareCounts {
                    target: 0,
                    initial: 0,
                    when_reused: 0,
                },
            ),
            built_in: None,
        }
    }

    /// Runtimes of a Pyodide server whose scientific runtime fails `failures` times, then is
    /// made; with the count of attempts.
    fn runtimes(failures: usize) -> (Runtimes, Arc<AtomicUsize>) {
        let attempts = Arc::new(AtomicUsize::new(0));
        let counted = attempts.clone();
        let make: MakeKit = Box::new(move || {
            let attempt = counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match attempt < failures {
                    true => Err(anyhow::anyhow!("offline").context("its artifacts")),
                    false => Ok(kit()),
                }
            })
        });
        (Runtimes::new(Runtime::Pyodide, kit(), make), attempts)
    }

    #[tokio::test]
    async fn the_own_runtime_is_ready_and_the_other_is_made_once_when_asked_for() {
        let (runtimes, attempts) = runtimes(0);
        let own = runtimes.kit(None).await.expect("own") as *const RuntimeKit;
        assert_eq!(
            own,
            runtimes.kit(Some(Runtime::Pyodide)).await.expect("own") as *const _
        );
        assert!(runtimes.ready_kit(Some(Runtime::Scientific)).is_none());
        assert_eq!(runtimes.kits().count(), 1);
        assert_eq!(attempts.load(Ordering::SeqCst), 0);
        let other = runtimes.kit(Some(Runtime::Scientific)).await.expect("made") as *const _;
        assert_ne!(own, other);
        runtimes.kit(Some(Runtime::Scientific)).await.expect("kept");
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert!(runtimes.ready_kit(Some(Runtime::Scientific)).is_some());
        assert_eq!(runtimes.kits().count(), 2);
    }

    #[tokio::test]
    async fn a_runtime_that_cannot_be_had_says_why_and_is_tried_again() {
        let (runtimes, attempts) = runtimes(1);
        let Err(unavailable) = runtimes.kit(Some(Runtime::Scientific)).await else {
            panic!("made");
        };
        assert_eq!(
            unavailable.to_string(),
            "the scientific runtime cannot be had on this server: its artifacts: offline"
        );
        assert!(runtimes.kit(Some(Runtime::Scientific)).await.is_ok());
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }
}
