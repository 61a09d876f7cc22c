//! Packages installed into the interpreter: a call's `Request::Install`, and `--deps` as the
//! interpreter boots. The front resolves and fetches them (`src/packages/`); here their files
//! are written and loaded by the runner.

use super::boot::{BOOT_CALL, BOOT_TIMEOUT};
use super::runner::{call, parse_answer, Runner};
use crate::engine::{Arg, Engine};
use crate::protocol::{BootInstall, CallId};
use anyhow::Result;
use serde::Deserialize;
use std::time::Instant;

/// The runner's answer to `install`: the modules that failed to import, each with why.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Installed {
    #[serde(default)]
    pub failed: Vec<String>,
}

/// Makes `files[i]` hold `bytes[i]`, loads `items` with the runner's `install` (lock package
/// names, wheel paths), then imports the top-level modules of the distributions `imports`; the
/// files are forgotten after. The call's `Install` and the boot's `--deps` both come here.
///
/// Errors: a package did not install, or the runner's answer has the wrong shape.
#[allow(clippy::too_many_arguments)]
pub(super) fn install_packages(
    engine: &mut Engine,
    runner: &Runner,
    id: CallId,
    files: &[String],
    bytes: Vec<Vec<u8>>,
    items: &[String],
    imports: &[String],
    deadline: Option<Instant>,
) -> Result<Installed> {
    for (path, bytes) in files.iter().zip(bytes) {
        engine.add_file(path, bytes);
    }
    let items = serde_json::to_string(items)?;
    let imports = serde_json::to_string(imports)?;
    let args = [Arg::Str(&items), Arg::Str(&imports)];
    let answer = call(engine, &runner.install, id, &args, deadline);
    engine.clear_files();
    Ok(parse_answer::<Installed>(&answer?)?)
}

/// Installs `--deps` as the worker boots ([`BootInstall`]: `files[i]`'s bytes are `bytes[i]`),
/// then imports their top-level modules, so that the worker's calls (and, in the zygote, every
/// worker forked from it) find them ready. A module that fails to import is logged on
/// stderr and left for the calls to import.
///
/// Errors: a package did not install (the front then installs `--deps` at the first call, which
/// reports why in words).
pub(super) fn preinstall(
    engine: &mut Engine,
    runner: &Runner,
    install: BootInstall,
    bytes: Vec<Vec<u8>>,
) -> Result<()> {
    let started = Instant::now();
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let installed = install_packages(
        engine,
        runner,
        BOOT_CALL,
        &install.files,
        bytes,
        &install.items,
        &install.imports,
        deadline,
    )?;
    for failed in installed.failed {
        eprintln!("--deps: not imported at boot: {failed}");
    }
    eprintln!(
        "--deps installed and imported in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}
