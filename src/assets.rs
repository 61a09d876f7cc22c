//! What the binary carries to start Python without network or files: Pyodide's own files, our
//! JavaScript (`runtime/js/`) and our Python (`runtime/python/`), and the fingerprint that names them all
//! (docs/architecture.md §7). The interpreter boots from them; the front reads only the lock
//! file (to resolve packages) and the fingerprint (to key its caches and its zygote service).

use crate::protocol::{MAX_IMAGES, MAX_LISTED_FILES};
use include_dir::{include_dir, Dir};
use sha2::{Digest, Sha256};

/// Hex digits of [`runtime_fingerprint`]: enough to tell runtimes apart in a file name.
const FINGERPRINT_HEX: usize = 16;

/// Pyodide 314.0.7 (docs/architecture.md §7), `pyodide.asm.mjs` already rewritten as a classic script.
pub static PYODIDE: Dir = include_dir!("$OUT_DIR/pyodide");
/// `runtime/js/bootstrap.js`: the globals Pyodide expects, made from the engine's `__host` functions.
pub const BOOTSTRAP_JS: &str = include_str!("../runtime/js/bootstrap.js");
/// `runtime/js/runner.js`: the functions the interpreter keeps and calls for each request.
pub const RUNNER_JS: &str = include_str!("../runtime/js/runner.js");
/// `runtime/js/fetch.js`: `fetch` for user code, answered by the front under `--allow-net`.
pub const FETCH_JS: &str = include_str!("../runtime/js/fetch.js");
/// `runtime/python/runner.py`: the helper inside Pyodide that runs a call's code.
pub const RUNNER_PY: &str = include_str!("../runtime/python/runner.py");
/// `runtime/python/mcp_tools.py`: code mode's `mcp_tools` module, built inside Pyodide.
pub const MCP_TOOLS_PY: &str = include_str!("../runtime/python/mcp_tools.py");
/// `runtime/python/http_bridge.py`: `http.client`, `urllib3` and `httpx` sending through the
/// front (`--allow-net`), made inside Pyodide with the helper.
pub const HTTP_BRIDGE_PY: &str = include_str!("../runtime/python/http_bridge.py");

/// `runtime/python/scientific.py`: the scientific runtime's guest side of the runner, handed to
/// the guest over its door (`src/interpreter/scientific/`).
pub const SCIENTIFIC_PY: &str = include_str!("../runtime/python/scientific.py");

/// The virtual file an upload's bytes wait in while the runner copies them (`runtime/js/runner.js`).
pub const UPLOAD_PATH: &str = "/upload";

/// The virtual file that holds the `--mount` files' bytes while the runner copies them
/// (`runtime/js/runner.js`).
pub const MOUNT_PATH: &str = "/mount";

/// A sandbox's working directory: Pyodide's home, the code's current directory when its
/// interpreter starts.
pub const WORKDIR: &str = "/home/pyodide";

/// The constants `runtime/js/runner.js` and `runtime/python/runner.py` take from the binary rather than repeat
/// by hand, as the JSON object handed to the runner's `boot`: `max_images` and
/// `max_listed_files` (the front refuses more, `src/protocol/messages.rs`), `upload_path`,
/// `mount_path` and `workdir`.
pub fn runner_constants() -> String {
    serde_json::json!({
        "max_images": MAX_IMAGES,
        "max_listed_files": MAX_LISTED_FILES,
        "upload_path": UPLOAD_PATH,
        "mount_path": MOUNT_PATH,
        "workdir": WORKDIR,
    })
    .to_string()
}

/// Identifies everything a memory snapshot depends on (the embedded Pyodide, our JavaScript
/// and Python and the constants they are given, this version): a snapshot is only restored by the same runtime. Hex, 16 chars.
pub fn runtime_fingerprint() -> String {
    let mut all = Vec::new();
    // The embedded Pyodide's digest, made by build.rs as it embeds the files.
    all.extend_from_slice(env!("PYODIDE_ASSETS_SHA256").as_bytes());
    for text in [
        BOOTSTRAP_JS,
        RUNNER_JS,
        RUNNER_PY,
        MCP_TOOLS_PY,
        HTTP_BRIDGE_PY,
        env!("CARGO_PKG_VERSION"),
    ] {
        all.extend_from_slice(text.as_bytes());
    }
    // The helper module in a snapshot was made with these.
    all.extend_from_slice(runner_constants().as_bytes());
    hex::encode(Sha256::digest(&all))[..FINGERPRINT_HEX].to_owned()
}
