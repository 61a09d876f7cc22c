//! Build script: prepares the embedded Pyodide assets, and exports the symbols the engine's
//! library binds to this binary's definitions (it is opened at run time, not linked).
//!
//! The assets (docs/architecture.md §7) come from `pyodide-assets/` (fetched by `scripts/setup.sh`) or from
//! the directory named by `PYODIDE_ASSETS_DIR`. They are copied to `$OUT_DIR/pyodide/`, with
//! `pyodide.asm.mjs` rewritten into a classic script because the JavaScriptCore C API has no
//! ES-module loader. The rewrite fails the build loudly if the upstream text changes.

use sha2::{Digest, Sha256};
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

const ASSETS: [&str; 5] = [
    "pyodide.js",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
];

/// Exact upstream snippets of `pyodide.asm.mjs` (314.0.7) and what they become.
const ASM_REWRITES: [(&str, &str, usize); 3] = [
    // The only module syntax: the default export of the factory.
    (
        "export default _createPyodideModule;",
        "globalThis.__createPyodideModule = _createPyodideModule;",
        1,
    ),
    // `import.meta` is a syntax error outside modules; the URL is only used to name the script.
    ("import.meta.url", "\"/pyodide/pyodide.asm.mjs\"", 3),
    // Randomness (Python's `os.urandom`, `random.seed()`, Emscripten's /dev/urandom) from
    // `crypto.getRandomValues`, which runtime/js/bootstrap.js serves from the OS in one call.
    // Emscripten takes this engine for a "shell" and would read it through
    // `os.system("head -cN /dev/urandom | base64")` and a base64 round trip instead: about
    // 0.5 µs a byte in 256-byte calls, so `random.seed()` (2,496 bytes), which every forked
    // interpreter's first run makes, took 0.8-1.3 ms.
    (
        "if(ENVIRONMENT_IS_SHELL){return view=>{if(!os.system)",
        "if(false){return view=>{if(!os.system)",
        1,
    ),
];

fn main() {
    println!("cargo:rerun-if-env-changed=PYODIDE_ASSETS_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    require_linux();
    export_engine_interposers();
    pack_relative_relocations();

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let src = env::var_os("PYODIDE_ASSETS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("pyodide-assets"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("pyodide");
    fs::create_dir_all(&out).expect("create $OUT_DIR/pyodide");

    // The digest of the embedded assets, for the memory snapshot's fingerprint
    // (`assets::runtime_fingerprint`): computed here once instead of hashing ~13 MiB at
    // every start of the server, in front of its first boot.
    let mut digest = Sha256::new();
    for name in ASSETS {
        let from = src.join(name);
        println!("cargo:rerun-if-changed={}", from.display());
        if !from.is_file() {
            panic!(
                "Pyodide asset {} is missing. Run `scripts/setup.sh` (it fetches pyodide@314.0.7 \
                 from the npm registry into pyodide-assets/) or set PYODIDE_ASSETS_DIR.",
                from.display()
            );
        }
        let to = out.join(name);
        let bytes = if name == "pyodide.asm.mjs" {
            let text = fs::read_to_string(&from).expect("read pyodide.asm.mjs");
            rewrite_asm(&text).into_bytes()
        } else {
            fs::read(&from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
        };
        write_if_changed(&to, &bytes);
        digest.update(name.as_bytes());
        digest.update(Sha256::digest(&bytes));
    }
    let hex: String = digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("cargo:rustc-env=PYODIDE_ASSETS_SHA256={hex}");
}

fn rewrite_asm(text: &str) -> String {
    let mut text = text.to_owned();
    for (from, to, count) in ASM_REWRITES {
        let found = text.matches(from).count();
        if found != count {
            panic!(
                "pyodide.asm.mjs no longer matches the expected upstream text: `{from}` occurs \
                 {found} times, expected {count}. The classic-script rewrite in build.rs must be \
                 updated for this Pyodide version."
            );
        }
        text = text.replace(from, to);
    }
    text
}

fn write_if_changed(path: &Path, bytes: &[u8]) {
    if fs::read(path).map(|old| old == bytes).unwrap_or(false) {
        return;
    }
    fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Stops a build for another system here, before anything of this crate or its engine is
/// compiled: the second wall (seccomp, Landlock, namespaces), the fork server and the dirty-page
/// tracking are Linux's, and their dependencies are Linux-only (Cargo.toml's
/// `cfg(target_os = "linux")` table). docs/platforms.md has the design of a macOS port. (The
/// architecture is checked where it matters: the seccomp filter, src/interpreter/confine/filter.rs.)
fn require_linux() {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "linux" {
        panic!(
            "mcp-run-python builds for Linux only (x86_64 and aarch64), not for `{os}`: its \
             sandbox is seccomp, Landlock and Linux namespaces, and its interpreters are forked \
             from a zygote. docs/platforms.md has the design of a macOS port; until then, run \
             the Linux wheel in a Linux VM or container (README, \"Install\")."
        );
    }
}

/// JavaScriptCore is not linked: the engine opens it at run time, only in the processes that run
/// JavaScript (src/engine/library.rs), so a serving front never maps it. What the build still
/// does for it: the engine's helper threads' idle timeout (src/engine/helper_threads.rs) needs
/// the binary's `WTF::AutomaticThread` constructors in its dynamic symbol table, for the
/// library's calls to reach them when it is opened.
fn export_engine_interposers() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=_ZN3WTF15AutomaticThreadC2*");
}

/// The binary's relative relocations packed (`DT_RELR`, glibc 2.36, which the wheel's tag
/// already needs): the dynamic linker applies its ~65,000 of them from a table of a few KiB
/// instead of 1.5 MiB of `Elf64_Rela` entries, at every start of every process (issue 49: a
/// front's exec, `--version`).
fn pack_relative_relocations() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}
