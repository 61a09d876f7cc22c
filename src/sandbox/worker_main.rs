//! The sandbox worker process: one JavaScriptCore context, one Pyodide, requests on stdin.
//!
//! Started by the front as `mcp-run-python __worker`. It boots Pyodide once, sends
//! [`Reply::Ready`], then answers [`Request`]s until stdin closes. It has no network and reads
//! no host files: Pyodide's own files are embedded in the binary and package files arrive as
//! frame attachments.

use super::protocol::{
    read_frame, write_frame, Frame, Reply, Request, RunOutcome, SnapshotMode, Stream,
};
use crate::engine::{Engine, EngineError};
use anyhow::{anyhow, Context, Result};
use include_dir::{include_dir, Dir};
use serde::Deserialize;
use std::cell::RefCell;
use std::io::{self, BufReader, BufWriter};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Pyodide 314.0.7 (DESIGN §7), `pyodide.asm.mjs` already rewritten as a classic script.
pub static PYODIDE: Dir = include_dir!("$OUT_DIR/pyodide");
const BOOTSTRAP_JS: &str = include_str!("../../js/bootstrap.js");
const RUNNER_JS: &str = include_str!("../../js/runner.js");
const FETCH_JS: &str = include_str!("../../js/fetch.js");
const RUNNER_PY: &str = include_str!("../../python/runner.py");

/// Identifies everything a memory snapshot depends on (the embedded Pyodide, our JavaScript
/// and Python, this version): a snapshot is only restored by the same runtime. Hex, 16 chars.
pub fn runtime_fingerprint() -> String {
    let mut all = Vec::new();
    for file in PYODIDE.files() {
        all.extend_from_slice(file.path().to_string_lossy().as_bytes());
        all.extend_from_slice(&crate::packages::cache::sha256_hex(file.contents()).into_bytes());
    }
    for text in [
        BOOTSTRAP_JS,
        RUNNER_JS,
        RUNNER_PY,
        env!("CARGO_PKG_VERSION"),
    ] {
        all.extend_from_slice(text.as_bytes());
    }
    crate::packages::cache::sha256_hex(&all)[..16].to_owned()
}

/// How long booting Pyodide may take before the worker gives up (seconds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the worker until stdin closes. Errors are also reported to the front as `Fatal`.
pub fn main() -> Result<()> {
    // Die with the front: a worker must never outlive the server that owns it.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let result = serve();
    if let Err(e) = &result {
        let _ = send(&Reply::Fatal {
            error: format!("{e:#}"),
        });
    }
    result
}

/// Writes one frame to the front (buffered; `write_frame` flushes at the end).
fn send_with(reply: &Reply, attachments: &[Vec<u8>]) -> io::Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    write_frame(&mut out, reply, attachments)
}

fn send(reply: &Reply) -> io::Result<()> {
    send_with(reply, &[])
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    value: serde_json::Value,
    #[serde(default)]
    error: Option<String>,
}

/// Evaluates `call` (which must end in `__host.done`) and waits for its answer.
fn call(engine: &mut Engine, call: &str, deadline: Option<Instant>) -> Result<serde_json::Value> {
    engine.eval(call, "mcp:call").map_err(|e| anyhow!(e))?;
    let text = engine.run_until_done(deadline).map_err(|e| anyhow!(e))?;
    let answer: Answer = serde_json::from_str(&text).context("bad answer from the runner")?;
    if answer.ok {
        Ok(answer.value)
    } else {
        Err(anyhow!(answer
            .error
            .unwrap_or_else(|| "unknown error".into())))
    }
}

fn js_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `--wasm-max-mib=N` from the worker's arguments, in bytes.
fn wasm_max_bytes() -> Option<u64> {
    std::env::args()
        .filter_map(|a| {
            a.strip_prefix("--wasm-max-mib=")
                .and_then(|n| n.parse::<u64>().ok())
        })
        .next()
        .map(|mib| mib << 20)
}

fn boot(
    mode: SnapshotMode,
    snapshot: Option<Vec<u8>>,
) -> Result<(Engine, String, Option<Vec<u8>>)> {
    let mut engine = Engine::new()?;
    if let Some(bytes) = snapshot {
        engine.add_file("/snapshot.bin", bytes);
    }
    let made: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let made_in = made.clone();
    engine.set_call_handler(Box::new(move |name: &str, _json: &str, bytes: Vec<u8>| {
        if name != "snapshot" {
            return Err(format!("host call {name} is not available while booting"));
        }
        *made_in.borrow_mut() = Some(bytes);
        Ok(("{}".to_owned(), Vec::new()))
    }));
    for file in PYODIDE.files() {
        let name = file.path().to_string_lossy();
        engine.add_static_file(&format!("/pyodide/{name}"), file.contents());
    }
    let text = |name: &str| -> Result<&'static str> {
        PYODIDE
            .get_file(name)
            .and_then(|f| f.contents_utf8())
            .ok_or_else(|| anyhow!("embedded asset {name} is missing"))
    };
    engine.eval(BOOTSTRAP_JS, "mcp:bootstrap.js")?;
    engine.eval(text("pyodide.js")?, "/pyodide/pyodide.js")?;
    engine.eval(text("pyodide.asm.mjs")?, "/pyodide/pyodide.asm.mjs")?;
    engine.eval(RUNNER_JS, "mcp:runner.js")?;
    let env = r#"{"HOME":"/home/pyodide","USER":"pyodide","LANG":"C.UTF-8"}"#;
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let version = call(
        &mut engine,
        &format!(
            "__mcp.boot({}, {}, {}, {})",
            js_str(RUNNER_PY),
            js_str(env),
            wasm_max_bytes().map_or("null".to_owned(), |b| b.to_string()),
            js_str(match mode {
                SnapshotMode::None => "none",
                SnapshotMode::Make => "make",
                SnapshotMode::Load => "load",
            })
        ),
        deadline,
    )
    .context("booting Pyodide")?;
    engine.clear_files();
    let snapshot = made.borrow_mut().take();
    Ok((
        engine,
        version.as_str().unwrap_or_default().to_owned(),
        snapshot,
    ))
}

/// Describes a run that failed below Python (the runner did not answer with a result).
fn runtime_failure(e: &anyhow::Error) -> RunOutcome {
    let text = format!("{e:#}");
    let first = text.lines().next().unwrap_or_default();
    let (error, fatal) = if let Some(rest) = text.split("Program terminated with exit(").nth(1) {
        let code = rest.split(')').next().unwrap_or("?");
        (format!("SystemExit: the code ended the interpreter with exit({code}) (os._exit); the next call runs in a new interpreter"), true)
    } else if text.contains("Aborted")
        || text.contains("fatal error")
        || text.contains("Unreachable code")
    {
        ("RuntimeError: the interpreter aborted (os.abort() or a fatal error in the runtime); the next call runs in a new interpreter".to_owned(), true)
    } else if e.downcast_ref::<EngineError>().is_some() {
        (format!("RuntimeError: the JavaScript runtime failed: {first}; the next call runs in a new interpreter"), true)
    } else {
        (text.clone(), false)
    };
    RunOutcome {
        status: "run-error".into(),
        return_value: None,
        return_kind: None,
        error: Some(error),
        truncated: false,
        fatal,
    }
}

fn serve() -> Result<()> {
    let input = Rc::new(RefCell::new(BufReader::new(io::stdin().lock())));
    let (mode, snapshot) = match read_frame::<Request>(&mut *input.borrow_mut())? {
        Some(Frame {
            header: Request::Boot { snapshot },
            attachments,
        }) => (snapshot, attachments.into_iter().next()),
        Some(_) => return Err(anyhow!("the first request must be `boot`")),
        None => return Ok(()),
    };
    let started = Instant::now();
    let (mut engine, version, made) = boot(mode, snapshot)?;
    {
        let ready = Reply::Ready {
            pyodide_version: version,
            boot_ms: started.elapsed().as_millis() as u64,
            restored: mode == SnapshotMode::Load,
        };
        send_with(&ready, made.as_slice())?;
    }
    // From now on every line user code writes is streamed to the front as it happens.
    engine.set_emit_sink(Box::new(|text: &str| {
        if let Ok(lines) = serde_json::from_str::<Vec<(Stream, String)>>(text) {
            let _ = send(&Reply::Output { lines });
        }
    }));
    engine.eval(FETCH_JS, "mcp:fetch.js")?;
    // `fetch` from user code: the front performs it (or refuses it) and answers on stdin.
    let fetch_input = input.clone();
    engine.set_call_handler(Box::new(move |name: &str, json: &str, body: Vec<u8>| {
        if name != "fetch" {
            return Err(format!("unknown host call {name}"));
        }
        let request: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        send_with(&Reply::Fetch { request }, &[body]).map_err(|e| e.to_string())?;
        match read_frame::<Request>(&mut *fetch_input.borrow_mut()) {
            Ok(Some(Frame {
                header: Request::FetchResult { response },
                attachments,
            })) => Ok((
                response.to_string(),
                attachments.into_iter().next().unwrap_or_default(),
            )),
            Ok(_) => Err("the front did not answer the fetch".into()),
            Err(e) => Err(format!("the front did not answer the fetch: {e}")),
        }
    }));
    loop {
        let Some(frame) = read_frame::<Request>(&mut *input.borrow_mut())? else {
            break;
        };
        let reply = match frame.header {
            // Only expected at start-up or inside a fetch; a stray one is ignored.
            Request::FetchResult { .. } | Request::Boot { .. } => continue,
            Request::FindImports { code } => {
                let json =
                    engine.eval(&format!("__mcp.findImports({})", js_str(&code)), "mcp:call")?;
                let names: Vec<String> = serde_json::from_str(&json).unwrap_or_default();
                Reply::Imports { names }
            }
            Request::Install { files, items } => {
                for (path, bytes) in files.iter().zip(frame.attachments) {
                    engine.add_file(path, bytes);
                }
                let items = serde_json::to_string(&items)?;
                let res = call(
                    &mut engine,
                    &format!("__mcp.install({})", js_str(&items)),
                    None,
                );
                engine.clear_files();
                Reply::Installed {
                    error: res.err().map(|e| format!("{e:#}")),
                }
            }
            Request::Run {
                code,
                globals,
                output_cap,
            } => {
                let globals = serde_json::to_string(&globals)?;
                let js = format!(
                    "__mcp.run({}, {}, {})",
                    js_str(&code),
                    js_str(&globals),
                    output_cap
                );
                match call(&mut engine, &js, None) {
                    Ok(v) => Reply::Ran(serde_json::from_value::<RunOutcome>(v)?),
                    Err(e) => {
                        // The code ended the runtime (os._exit, os.abort, a fatal runtime error):
                        // report it as the call's result, then stop; the front starts a new worker.
                        let outcome = runtime_failure(&e);
                        let fatal = outcome.fatal;
                        send(&Reply::Ran(outcome))?;
                        if fatal {
                            return Ok(());
                        }
                        continue;
                    }
                }
            }
        };
        send(&reply)?;
    }
    Ok(())
}
