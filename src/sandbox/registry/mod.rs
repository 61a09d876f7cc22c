//! The registry of live sandboxes, one for every transport (docs/architecture.md §3): it mints
//! handles, finds a sandbox by the handle a client gives, bounds how many live at once
//! (`--max-sandboxes`) and ends those idle or old past their limits. Saving to and restoring
//! from the shared state directory is `persistence.rs`; putting idle sandboxes to sleep (their
//! state on disk, their worker killed) is `hibernation.rs`.
//!
//! At the cap, a new sandbox takes the place of the least recently used sandbox that is reached
//! by its handle alone and has nothing in flight (no call running or waiting): that one is
//! ended, and its next use gets the same "does not exist or has expired" answer as any ended
//! sandbox. A session's default sandbox is never evicted (`--max-sessions` bounds those), and a
//! sandbox with a call in flight never is. When no sandbox can give way, the new one is refused
//! with [`RegistryError::Full`]. Evicting rather than refusing keeps the server serving new
//! agents while an idle agent's sandbox, the cheapest to lose, goes first; the agent is told to
//! create a new one.

mod hibernation;
mod persistence;

use crate::sandbox::activity::InFlight;
use crate::sandbox::handle::{MintError, SandboxId};
use crate::sandbox::hibernation::Hibernation;
use crate::sandbox::live::{Makeup, Owner, Principal, Sandbox};
use crate::sandbox::state_dir::{blocking, Expiry, StateDir, StateError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The registry's limits (`--max-sandboxes`, `--sandbox-idle-timeout`,
/// `--sandbox-max-lifetime`).
#[derive(Debug, Clone, Copy)]
pub struct RegistryLimits {
    /// Most live sandboxes, session defaults included.
    pub max: usize,
    /// A sandbox reached by its handle alone ends once nothing of it has been in flight for
    /// this long; `None`: never.
    pub idle: Option<Duration>,
    /// A sandbox reached by its handle alone ends this long after it was made (a call in
    /// flight finishes first); `None`: never.
    pub lifetime: Option<Duration>,
}

/// Why no new sandbox was made.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// `--max-sandboxes` are live and none may give way.
    #[error("the server holds its limit of {max} sandboxes (--max-sandboxes) and every one is in use or belongs to a live session; destroy a sandbox you no longer need (destroy_sandbox) or try again later")]
    Full { max: usize },
    /// No handle could be minted.
    #[error(transparent)]
    Mint(#[from] MintError),
}

/// How much of the handle a caller gave is echoed back in [`Missing`]'s words (characters):
/// enough for the caller to tell which, too little to use, since errors are logged (rmcp logs
/// a failed `resources/read` at `warn`) and a handle is a bearer capability.
const ECHO_CHARS: usize = 10;

/// A handle that names no live sandbox: never made, destroyed, expired, evicted or malformed.
/// The words are the same in every case, so that they tell a caller nothing about handles it
/// does not hold (mcp-python-code-interpreter's "not found or has expired").
#[derive(Debug, thiserror::Error)]
#[error("sandbox \"{given}…\" does not exist or has expired; create a new one (create_sandbox, or a run_python_code call without sandbox_id) and run its setup again")]
pub struct Missing {
    given: String,
}

impl Missing {
    /// The refusal for `text`, a handle given by a caller.
    pub fn of(text: &str) -> Missing {
        Missing {
            given: text
                .chars()
                .take(ECHO_CHARS)
                .flat_map(char::escape_debug)
                .collect(),
        }
    }
}

/// `text`, a handle a caller gave (a `sandbox_id` argument, a resource URI, a header), as a
/// [`SandboxId`]: the one place a caller's text becomes a handle, at the edge where it
/// arrives, so that nothing below parses it again.
///
/// Errors: [`Missing`] when `text` cannot be a handle, in the words an unknown handle gets
/// (a malformed handle tells the caller no more than an expired one).
pub fn named(text: &str) -> Result<SandboxId, Missing> {
    SandboxId::parse(text).ok_or_else(|| Missing::of(text))
}

/// A sandbox found by its handle, held in flight (neither evicted nor expired) until dropped.
pub struct Entered {
    pub sandbox: Arc<Sandbox>,
    pub in_flight: InFlight,
}

/// The registry's sizes, for metrics ([`Registry::counts`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Live sandboxes, hibernated ones included.
    pub sandboxes: usize,
    /// Those holding a worker between calls.
    pub idle: usize,
    /// Those hibernating (state on disk, no worker).
    pub hibernated: usize,
    /// Bytes of hibernated state on disk.
    pub hibernated_bytes: u64,
}

/// Why a handle could not be opened ([`Registry::open`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Missing(#[from] Missing),
    /// The state directory failed while restoring the sandbox.
    #[error("sandbox {short} could not be restored: {source}")]
    State {
        short: String,
        #[source]
        source: StateError,
    },
}

/// The live sandboxes (see the module's documentation).
pub struct Registry {
    limits: RegistryLimits,
    live: Mutex<HashMap<SandboxId, Arc<Sandbox>>>,
    /// `--state-dir`: where sandboxes reached by handle are saved after each call and restored
    /// from by any replica.
    state: Option<Arc<StateDir>>,
    /// Most bytes of files a restored sandbox keeps copies of (`--max-session-file-bytes`).
    file_cap: u64,
    /// Held while a sandbox is restored, so that two calls for it restore it once.
    restoring: tokio::sync::Mutex<()>,
    /// `--hibernate-after`: where idle sandboxes keep their state without a worker.
    hibernation: Option<Arc<Hibernation>>,
}

/// How often the state directory is swept for sandboxes past their limits whose replica is
/// gone (seconds).
const STATE_SWEEP: Duration = Duration::from_secs(60);

/// Bounds of how often the registry looks for expired sandboxes.
const MIN_SWEEP: Duration = Duration::from_millis(100);
const MAX_SWEEP: Duration = Duration::from_secs(30);

/// How many sweeps fit in the shortest limit: an expiry is seen at most a quarter late.
const SWEEPS_PER_LIMIT: u32 = 4;

impl Registry {
    /// An empty registry under `limits` (a `max` of 0 counts as 1), without a state directory.
    #[cfg(test)]
    pub fn new(limits: RegistryLimits) -> Arc<Registry> {
        Registry::with_state(limits, None, 0)
    }

    /// An empty registry under `limits` that saves sandboxes reached by handle to `state` and
    /// restores them from it, keeping at most `file_cap` bytes of a restored sandbox's files.
    #[cfg(test)]
    pub fn with_state(
        limits: RegistryLimits,
        state: Option<StateDir>,
        file_cap: u64,
    ) -> Arc<Registry> {
        Registry::with_hibernation(limits, state, file_cap, None)
    }

    /// `with_state` (in tests), with sandboxes idle past `hibernation.after`
    /// hibernating ([`crate::sandbox::hibernation`]).
    pub fn with_hibernation(
        limits: RegistryLimits,
        state: Option<StateDir>,
        file_cap: u64,
        hibernation: Option<Hibernation>,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            limits: RegistryLimits {
                max: limits.max.max(1),
                ..limits
            },
            live: Mutex::default(),
            state: state.map(Arc::new),
            file_cap,
            restoring: tokio::sync::Mutex::const_new(()),
            hibernation: hibernation.map(Arc::new),
        })
    }

    /// How many sandboxes are live, how many of them hold a worker between calls, and how
    /// many hibernate (for metrics).
    pub fn counts(&self) -> Counts {
        let live = self.live();
        Counts {
            sandboxes: live.len(),
            idle: live.values().filter(|s| s.has_idle_interpreter()).count(),
            hibernated: live.values().filter(|s| s.state.is_hibernated()).count(),
            hibernated_bytes: self.hibernation.as_ref().map_or(0, |h| h.used()),
        }
    }

    /// How many sandboxes count against `--max-sandboxes`: all but the hibernated (which hold
    /// no worker; disk bounds them).
    fn awake(live: &HashMap<SandboxId, Arc<Sandbox>>) -> usize {
        live.values().filter(|s| !s.state.is_hibernated()).count()
    }

    fn expiry(&self) -> Expiry {
        Expiry {
            idle: self.limits.idle,
            lifetime: self.limits.lifetime,
        }
    }

    /// How long a sandbox reached by its handle alone may go without a call.
    pub fn idle(&self) -> Option<Duration> {
        self.limits.idle
    }

    fn live(&self) -> MutexGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many sandboxes are live.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.live().len()
    }

    /// Whether `sandbox` is past a limit at `now`: idle past the idle time or older than the
    /// lifetime. Only sandboxes reached by their handle alone expire.
    fn expired(&self, sandbox: &Sandbox, now: Instant) -> bool {
        if sandbox.owner != Owner::Handle {
            return false;
        }
        let idle = self
            .limits
            .idle
            .and_then(|idle| sandbox.activity().idle_at(idle))
            .is_some_and(|at| at <= now);
        let old = self
            .limits
            .lifetime
            .is_some_and(|life| now.duration_since(sandbox.created) >= life);
        idle || old
    }

    /// A new sandbox held by `owner` (tests: the server makes its own through
    /// [`create_as`](Self::create_as)), with `dependencies` for each of its workers (of the
    /// server's own runtime),
    /// registered under a fresh handle; at the cap it takes an idle sandbox's place.
    ///
    /// Errors: [`RegistryError::Full`] when `--max-sandboxes` are live and none may give way;
    /// [`RegistryError::Mint`] when the random source fails.
    #[cfg(test)]
    pub fn create(
        &self,
        owner: Owner,
        dependencies: Vec<String>,
    ) -> Result<Arc<Sandbox>, RegistryError> {
        self.create_as(SandboxId::mint()?, owner, Makeup::plain(dependencies), None)
    }

    /// `create` (in tests) under a handle minted before (the HTTP front names a sandbox a
    /// call will make in its response headers, for the load balancer, before the call runs).
    ///
    /// Errors: [`RegistryError::Full`].
    pub fn create_as(
        &self,
        id: SandboxId,
        owner: Owner,
        makeup: Makeup,
        principal: Option<Principal>,
    ) -> Result<Arc<Sandbox>, RegistryError> {
        let sandbox = Sandbox::owned(id, owner, makeup, principal);
        self.insert(sandbox.clone())?;
        tracing::debug!("sandbox {} created ({:?})", sandbox.id.short(), owner);
        Ok(sandbox)
    }

    /// At `--max-sandboxes`: waits until the live sandboxes whose last call's checkpoint is
    /// still being read after its answer (about a millisecond, `server::call::checkpoints`)
    /// are idle again, so that one of them may give way to a new sandbox
    /// ([`make_room`](Self::make_room)) rather than the new one be refused. Waits for no call.
    /// Await it before a create ([`create_as`](Self::create_as)) and before a hibernated
    /// sandbox wakes ([`open`](Self::open)).
    pub async fn settle_for_room(&self) {
        let checkpointing: Vec<Arc<Sandbox>> = {
            let live = self.live();
            if Self::awake(&live) < self.limits.max {
                return;
            }
            live.values()
                .filter(|s| s.is_checkpointing())
                .cloned()
                .collect()
        };
        for sandbox in checkpointing {
            sandbox.settled().await;
        }
    }

    /// Registers `sandbox`; at the cap it takes an idle sandbox's place.
    fn insert(&self, sandbox: Arc<Sandbox>) -> Result<(), RegistryError> {
        let mut live = self.live();
        self.make_room(&mut live)?;
        live.insert(sandbox.id.clone(), sandbox);
        Ok(())
    }

    /// Room for one more awake sandbox under `--max-sandboxes`: at the cap the expired go, then
    /// the least recently used idle sandbox hibernates, else the least recently used idle one
    /// reached by handle ends.
    ///
    /// Errors: [`RegistryError::Full`] when none may give way.
    fn make_room(&self, live: &mut HashMap<SandboxId, Arc<Sandbox>>) -> Result<(), RegistryError> {
        if Self::awake(live) >= self.limits.max {
            self.sweep_locked(live);
        }
        if Self::awake(live) >= self.limits.max && self.hibernate_one(live) {
            return Ok(());
        }
        if Self::awake(live) >= self.limits.max {
            let victim = live
                .values()
                .filter(|s| s.owner == Owner::Handle && !s.state.is_hibernated())
                .filter_map(|s| s.activity().idle_since().map(|since| (since, s.id.clone())))
                .min();
            let Some((since, victim)) = victim else {
                return Err(RegistryError::Full {
                    max: self.limits.max,
                });
            };
            if let Some(evicted) = live.remove(&victim) {
                tracing::info!(
                    "sandbox {} (idle for {} s) was evicted to make room (--max-sandboxes {})",
                    evicted.id.short(),
                    since.elapsed().as_secs(),
                    self.limits.max
                );
                self.forget(&evicted);
            }
        }
        Ok(())
    }

    /// Ends `sandbox` for good: also its saved state, unless another replica holds it now.
    fn forget(&self, sandbox: &Arc<Sandbox>) {
        sandbox.end();
        self.forget_state(sandbox);
    }

    /// The sandbox named by `id`, held in flight until the result is dropped: a live one
    /// (after checking, with `--state-dir`, that no other replica took it over since), else one
    /// restored from the state directory. The handle is checked against its holder here: a
    /// sandbox of another `principal` is [`Missing`], as an unknown one (SEP-2567).
    ///
    /// Errors: [`OpenError::Missing`] when `id` names no sandbox of `principal`, live or
    /// saved; [`OpenError::State`] when the state directory fails.
    pub async fn open(
        &self,
        id: &SandboxId,
        principal: Option<&Principal>,
    ) -> Result<Entered, OpenError> {
        let entered = self.open_any(id, principal).await?;
        if !entered.sandbox.belongs_to(principal) {
            return Err(Missing::of(id.as_str()).into());
        }
        if entered.sandbox.state.is_hibernated() {
            // It wakes for this request: another makes room, as for a new sandbox (once the
            // checkpoints read after their answers are kept, so that a sandbox whose call just
            // answered may be the one). When none can, it wakes all the same (its state is not
            // refused for the cap) and the cap is passed until one ends.
            self.settle_for_room().await;
            if let Err(full) = self.make_room(&mut self.live()) {
                tracing::warn!("sandbox {} wakes past the cap: {full}", id.short());
            }
        }
        Ok(entered)
    }

    /// [`open`](Self::open) before the principal is checked.
    async fn open_any(
        &self,
        id: &SandboxId,
        principal: Option<&Principal>,
    ) -> Result<Entered, OpenError> {
        let Some(state) = &self.state else {
            return Ok(self.enter(id)?);
        };
        let entered = match self.enter(id) {
            Ok(entered) if entered.sandbox.owner != Owner::Handle => return Ok(entered),
            Ok(entered) => entered,
            Err(missing) => return self.restore(id, missing, principal).await,
        };
        let (state, held) = (state.clone(), entered.sandbox.id.clone());
        let now = blocking(move || state.generation(&held)).await;
        let ours = entered.sandbox.saves.generation();
        match now {
            Ok(Some(theirs)) if theirs > ours => {
                tracing::info!(
                    "sandbox {} was taken over by another replica (generation {theirs} > {ours}); dropping this replica's copy",
                    entered.sandbox.id.short()
                );
                let stale = entered.sandbox.clone();
                drop(entered);
                self.drop_stale(&stale);
                self.restore(id, Missing::of(id.as_str()), principal).await
            }
            Ok(_) => Ok(entered),
            Err(source) => Err(OpenError::State {
                short: entered.sandbox.id.short().to_string(),
                source,
            }),
        }
    }

    /// Ends this replica's copy of a sandbox another replica took over (its saved state is the
    /// new owner's): out of the registry, unless a newer copy took its place there already.
    fn drop_stale(&self, stale: &Arc<Sandbox>) {
        let mut live = self.live();
        if live.get(&stale.id).is_some_and(|s| Arc::ptr_eq(s, stale)) {
            live.remove(&stale.id);
        }
        drop(live);
        stale.end();
    }

    /// The live sandbox named by `id`, held in flight until the result is dropped, whoever
    /// holds it: [`open`](Self::open), the one caller, checks the principal.
    ///
    /// Errors: [`Missing`] when `id` names no live sandbox, whatever the reason.
    fn enter(&self, id: &SandboxId) -> Result<Entered, Missing> {
        let missing = || Missing::of(id.as_str());
        let mut live = self.live();
        let sandbox = live.get(id).cloned().ok_or_else(missing)?;
        if sandbox.has_ended() || self.expired(&sandbox, Instant::now()) {
            if sandbox.activity().idle_since().is_some() {
                live.remove(id);
                self.forget(&sandbox);
            }
            return Err(missing());
        }
        let in_flight = sandbox.begin();
        Ok(Entered { sandbox, in_flight })
    }

    /// The live sandbox named by `id`, if any, without holding it (a transport stamping a
    /// call's arrival as it reads it; the call itself then [`open`](Self::open)s it).
    pub fn peek(&self, id: &SandboxId) -> Option<Arc<Sandbox>> {
        self.live().get(id).cloned()
    }

    /// Takes the sandbox named by `id` out of the registry (`destroy_sandbox`): later uses
    /// get [`Missing`]. The caller ends it.
    ///
    /// Errors: [`Missing`] when `id` names no live sandbox.
    pub fn remove_named(&self, id: &SandboxId) -> Result<Arc<Sandbox>, Missing> {
        let sandbox = self
            .live()
            .remove(id)
            .ok_or_else(|| Missing::of(id.as_str()))?;
        self.forget_state(&sandbox);
        Ok(sandbox)
    }

    /// Removes `sandbox`'s saved state, unless another replica holds it under a newer
    /// generation, in the background; the sandbox itself is not ended.
    fn forget_state(&self, sandbox: &Arc<Sandbox>) {
        let (Some(state), Owner::Handle) = (&self.state, sandbox.owner) else {
            return;
        };
        let generation = sandbox.saves.generation();
        if generation == 0 {
            return;
        }
        let (state, id) = (state.clone(), sandbox.id.clone());
        let remove = move || {
            if let Err(e) = state.remove(&id, generation) {
                tracing::warn!("sandbox {}: {e}", id.short());
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }

    /// Takes `id` out of the registry and ends it (its session ended).
    pub fn end(&self, id: &SandboxId) {
        if let Some(sandbox) = self.live().remove(id) {
            sandbox.end();
        }
    }

    /// Ends the sandboxes past a limit that have nothing in flight.
    pub fn sweep(&self) {
        self.sweep_locked(&mut self.live());
    }

    fn sweep_locked(&self, live: &mut HashMap<SandboxId, Arc<Sandbox>>) {
        let now = Instant::now();
        live.retain(|_, sandbox| {
            let gone = self.expired(sandbox, now) && sandbox.activity().idle_since().is_some();
            if gone {
                tracing::debug!("sandbox {} expired", sandbox.id.short());
                self.forget(sandbox);
            }
            !gone
        });
    }

    /// How often to sweep: a quarter of the shortest limit, within bounds; `None` without
    /// limits.
    fn sweep_interval(&self) -> Option<Duration> {
        let hibernate = self.hibernation.as_ref().map(|h| h.after);
        let shortest = [self.limits.idle, self.limits.lifetime, hibernate]
            .into_iter()
            .flatten()
            .min()?;
        Some((shortest / SWEEPS_PER_LIMIT).clamp(MIN_SWEEP, MAX_SWEEP))
    }

    /// Sweeps in the background until `shutdown`, then ends every sandbox (their saved state
    /// stays, for other replicas); with `--state-dir`, also sweeps the state directory for
    /// sandboxes past their limits every [`STATE_SWEEP`].
    pub fn spawn_sweeper(self: &Arc<Self>, shutdown: CancellationToken) {
        if let Some(state) = self.state.clone() {
            let expiry = self.expiry();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(STATE_SWEEP);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.cancelled() => break,
                    }
                    let state = state.clone();
                    match blocking(move || state.sweep(expiry)).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!("removed {n} expired sandboxes from the state directory")
                        }
                        Err(e) => tracing::warn!("{e}"),
                    }
                }
            });
        }
        let this = self.clone();
        let interval = self.sweep_interval();
        tokio::spawn(async move {
            match interval {
                Some(interval) => {
                    let mut tick = tokio::time::interval(interval);
                    loop {
                        tokio::select! {
                            _ = tick.tick() => {
                                this.sweep();
                                this.hibernate_idle().await;
                            }
                            _ = shutdown.cancelled() => break,
                        }
                    }
                }
                None => shutdown.cancelled().await,
            }
            this.end_all();
        });
    }

    /// Ends every sandbox (at shutdown).
    pub fn end_all(&self) {
        for (_, sandbox) in self.live().drain() {
            sandbox.end();
        }
        if let Some(hibernation) = &self.hibernation {
            hibernation.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(max: usize, idle: Option<u64>) -> Arc<Registry> {
        Registry::new(RegistryLimits {
            max,
            idle: idle.map(Duration::from_secs),
            lifetime: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_handle_finds_its_sandbox_and_nothing_else() {
        let r = registry(4, None);
        let a = r.create(Owner::Handle, Vec::new()).expect("room");
        let found = r.enter(&a.id).expect("live");
        assert!(Arc::ptr_eq(&found.sandbox, &a));
        let unknown = SandboxId::mint().expect("random");
        let missing = r.enter(&unknown).err().expect("unknown");
        let malformed = named("nonsense!!").expect_err("malformed");
        drop(found);
        r.remove_named(&a.id).expect("live").end();
        let destroyed = r.enter(&a.id).err().expect("destroyed");
        // The same words whichever it was, but for the echoed start of the handle.
        let words = |m: Missing, given: &str| m.to_string().replace(&given[..ECHO_CHARS], "<id>");
        assert_eq!(
            words(missing, unknown.as_str()),
            words(destroyed, a.id.as_str())
        );
        assert!(words(malformed, "nonsense!!").contains("does not exist or has expired"));
        // Never the whole handle: errors are logged.
        let echoed = r.enter(&a.id).err().expect("destroyed").to_string();
        assert!(!echoed.contains(a.id.as_str()), "{echoed}");
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_least_recently_used_idle_sandbox_gives_way() {
        let r = registry(2, None);
        let old = r.create(Owner::Handle, Vec::new()).expect("room");
        tokio::time::advance(Duration::from_secs(1)).await;
        let busy = r.create(Owner::Handle, Vec::new()).expect("room");
        let held = r.enter(&busy.id).expect("live");
        tokio::time::advance(Duration::from_secs(1)).await;
        let new = r
            .create(Owner::Handle, Vec::new())
            .expect("the idle one gives way");
        assert!(old.has_ended() && r.enter(&old.id).is_err());
        assert!(!busy.has_ended());
        // Now one is busy and the other is a session's: nothing may give way.
        r.end(&new.id);
        let session = r.create(Owner::Session, Vec::new()).expect("room");
        assert!(matches!(
            r.create(Owner::Handle, Vec::new()),
            Err(RegistryError::Full { max: 2 })
        ));
        drop(held);
        assert!(!session.has_ended());
        r.create(Owner::Handle, Vec::new())
            .expect("the busy one is idle now");
        assert!(busy.has_ended());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_handle_sandboxes_expire_but_session_ones_and_busy_ones_do_not() {
        let r = registry(8, Some(10));
        let idle = r.create(Owner::Handle, Vec::new()).expect("room");
        let busy = r.create(Owner::Handle, Vec::new()).expect("room");
        let session = r.create(Owner::Session, Vec::new()).expect("room");
        let held = r.enter(&busy.id).expect("live");
        tokio::time::advance(Duration::from_secs(11)).await;
        r.sweep();
        assert!(idle.has_ended());
        assert!(!busy.has_ended() && !session.has_ended());
        drop(held);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(r.enter(&busy.id).is_ok(), "idle for 5 s only");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(r.enter(&busy.id).is_err());
        assert_eq!(r.len(), 1);
    }
}
