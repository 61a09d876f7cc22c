// The sandbox's side of the worker protocol. This script's completion value is an object of
// functions that the host keeps (protected) and calls directly; nothing of it is left on any
// global, so user code cannot reach it. Every operation takes the call id the front chose and
// answers through `done(id, text)`, which only these closures hold, in one of two shapes (`ok`,
// `failed`). Asynchronous operations
// answer through `done`; they never throw past it.
(function () {
  "use strict";
  const { emit, done, emitLines, endTableRoom } = globalThis.__mcpHost;
  delete globalThis.__mcpHost;
  // The host's synchronous call, kept here before fetch.js takes it off the global.
  const hostCall = globalThis.__mcpHostCall;
  // The host call's typed messages (src/sandbox/worker_main.rs, HostRequest).
  const HOST_SNAPSHOT = JSON.stringify({ op: "snapshot" });
  const HOST_FILE = JSON.stringify({ op: "file" });
  // Code mode: user code's call of an upstream MCP tool (`op` "tool", `callJson` a ToolCall's
  // JSON, made by runtime/python/mcp_tools.py) or of a host function ("function", a FunctionCall's,
  // made by runtime/python/runner.py); answers [the ToolAnswer's JSON, its images' bytes one after
  // another]. The host parses the message strictly.
  const ask = (op, callJson) => {
    const out = hostCall(`{"op":${JSON.stringify(String(op))},"call":${callJson}}`);
    return [out.json, new Uint8Array(out.body)];
  };
  // User code's HTTP request through its libraries (runtime/python/http_bridge.py), as fetch.js
  // makes pyfetch's: the request's JSON ({method, url, headers}) and its body's bytes (or
  // undefined) in; [the answer's JSON ({status, statusText, headers, url} or {error}), its
  // body's bytes] out.
  // fetch.js's setter of how many of its requests go out at once; taken off the global at the
  // first run, before any user code runs (fetch.js is installed after this script).
  let fetchLimit = () => {};
  const takeFetchLimit = () => {
    if (typeof globalThis.__mcpFetchLimit === "function") {
      fetchLimit = globalThis.__mcpFetchLimit;
      delete globalThis.__mcpFetchLimit;
    }
  };
  const fetchBridge = (requestJson, body) => {
    const out = hostCall(`{"op":"fetch","request":${requestJson}}`, body);
    return [out.json, new Uint8Array(out.body)];
  };
  // Requests made at once: `batchJson` is `{"requests": [...], "sizes": [...]}` (the bodies one
  // after another in `body`); answers `{"responses": [...], "sizes": [...]}` and the bodies.
  const fetchManyBridge = (batchJson, body) => {
    const out = hostCall(`{"op":"fetch_many",${batchJson.slice(1)}`, body);
    return [out.json, new Uint8Array(out.body)];
  };
  // The sandbox's working directory, with a trailing slash (runtime/python/runner.py's WORKDIR); set by
  // `boot` from the binary's constants (src/assets.rs, `runner_constants`).
  let WORKDIR = null;
  // Words for Emscripten's file system errors (its errno numbers: ENOENT 44, EISDIR 31,
  // ENOTDIR 54, EEXIST 20).
  const FS_REASONS = { 44: "no such file", 31: "a folder is in the way", 54: "a file is in the way", 20: "a file is in the way" };
  const fsReason = (e) => (e && FS_REASONS[e.errno]) || (e && e.message) || String(e);
  // The virtual file that holds an upload's bytes while writeFile copies them, and the one that
  // holds the `--mount` files' bytes while mount copies them; set by `boot`, as WORKDIR.
  let UPLOAD = null;
  let MOUNT = null;
  let pyodide = null;
  // The Python helper's functions, kept here; the helper module is in no `sys.modules`.
  let helperRun = null;
  let helperFindImports = null;
  let helperReseed = null;
  let helperPrimeListing = null;
  let helperForgetRuns = null;
  let helperImportDistributions = null;

  // What the zygote held outside linear memory (`outsideMemory()` once warm), inherited by
  // every interpreter it forks; null in an interpreter not forked from a zygote.
  let outside = null;
  // What the interpreter holds outside its linear memory, which a copy of that memory cannot
  // bring back (docs/checkpoint-research.md §5): JavaScript values Python refers to (Pyodide's
  // hiwire table lives outside linear memory), open file descriptors (Emscripten's streams
  // are JavaScript objects), and shared libraries loaded since (their functions sit in the
  // WebAssembly table).
  const outsideMemory = () => ({
    js_objects: pyodide._module._hiwire_num_refs(),
    open_files: pyodide.FS.streams.filter(Boolean).length,
    loaded_libraries: Object.keys(pyodide._module.LDSO.loadedLibsByName).length,
  });

  // Whether a file of the in-memory file system may have changed since the helper last asked
  // (`filesChanged`). A `keep_globals` run lists the working directory before and after its
  // code (runtime/python/runner.py `_scan`), which costs tens of microseconds a file through
  // Emscripten's file system, twice a call; with this, it lists it again only after a change.
  // Every MEMFS operation that can create, remove, rename, write, resize or re-time a file
  // (`MEMFS_CHANGES`, wrapped by `watchFileChanges` for every kind of node) sets it, whoever
  // calls it: the code, Pyodide, or an upload (`writeFile`). True until first asked, so that a
  // new interpreter lists the directory; set again by a restore (`grow`), whose Python state
  // remembers another interpreter's listing; always true when the operations could not be
  // wrapped. The zygote lists the directory and asks once before it forks (`baseline`), so a
  // fork's first run lists it only after a change. Code that unwraps them only misleads the
  // listing of its own sandbox's files.
  let filesMayHaveChanged = true;
  let watchingFiles = false;
  const MEMFS_CHANGES = {
    node: ["setattr", "mknod", "rename", "unlink", "rmdir", "symlink"],
    stream: ["write", "msync"],
  };
  const watchFileChanges = () => {
    const tables = pyodide.FS.filesystems.MEMFS.ops_table;
    if (!tables) return;
    for (const table of Object.values(tables)) {
      for (const [part, names] of Object.entries(MEMFS_CHANGES)) {
        const ops = table[part];
        for (const name of names) {
          const op = ops && ops[name];
          if (typeof op !== "function") continue;
          ops[name] = function (...args) {
            filesMayHaveChanged = true;
            return op.apply(this, args);
          };
        }
      }
    }
    watchingFiles = true;
  };
  const filesChanged = () => {
    const changed = filesMayHaveChanged || !watchingFiles;
    filesMayHaveChanged = false;
    return changed;
  };

  const errorText = (e) => {
    if (e && typeof e === "object" && "message" in e) return `${e.name || "Error"}: ${e.message}\n${e.stack || ""}`;
    return String(e);
  };
  // Why an operation failed, typed: the interpreter ended (`os._exit`: Emscripten's ExitStatus
  // with its status, which Pyodide renames `Exit` when it ends a synchronous call; an abort or
  // a fatal runtime error: Pyodide marks the error
  // `pyodide_fatal_error`, and traps are WebAssembly.RuntimeError), or an ordinary error.
  // An operation's own refusal (no such file, too large): its reason alone, without a stack.
  class Refusal {
    constructor(reason) {
      this.reason = reason;
    }
  }
  const failure = (e) => {
    if (e instanceof Refusal) return { error: e.reason };
    if (e && typeof e === "object" && (e.name === "ExitStatus" || e.name === "Exit") && Number.isInteger(e.status)) {
      return { ended: { exit: e.status } };
    }
    if (e && typeof e === "object" && (e.pyodide_fatal_error === true || e instanceof WebAssembly.RuntimeError)) {
      return { ended: "abort", error: errorText(e) };
    }
    return { error: errorText(e) };
  };
  // Python that makes the helper module from `_mcp_source` (a str the JavaScript side put in
  // __main__, removed here, as is `_mcp_tools_source`, runtime/python/mcp_tools.py, which it
  // keeps), with the HTTP bridge (`_mcp_http_source`, runtime/python/http_bridge.py) made as its
  // `_http`, and leaves it in sys.modules, only until TAKE_HELPER.
  const MAKE_HELPER =
    "import sys as _sys, types as _types\n" +
    "_m = _types.ModuleType('_mcp_runner')\n" +
    "_m.__file__ = '/lib/_mcp_runner.py'\n" +
    "_m._CONSTANTS = __import__('json').loads(_mcp_constants)\n" +
    "exec(compile(_mcp_source, _m.__file__, 'exec'), _m.__dict__)\n" +
    "_m._tools_source = _mcp_tools_source\n" +
    "_h = _types.ModuleType('_mcp_http')\n" +
    "_h.__file__ = '/lib/_mcp_http.py'\n" +
    "exec(compile(_mcp_http_source, _h.__file__, 'exec'), _h.__dict__)\n" +
    "_m._http = _h\n" +
    "_sys.modules['_mcp_runner'] = _m\n" +
    "del _sys, _types, _m, _h, _mcp_source, _mcp_tools_source, _mcp_http_source, _mcp_constants\n";
  // Takes the helper module out of sys.modules; its value is the module.
  const TAKE_HELPER = "__import__('sys').modules.pop('_mcp_runner')";
  // Every answer is one of two shapes (src/interpreter/runner.rs, RunnerAnswer): `{"ok": …}`
  // with the operation's JSON text as is (the helper already made it one JSON value), or
  // `{"failed": …}` with why.
  const ok = (text) => `{"ok":${text}}`;
  const failed = (e) => JSON.stringify({ failed: failure(e) });
  const answer = (id, promise) =>
    promise.then(
      (text) => done(id, ok(text)),
      (e) => done(id, failed(e)),
    );

  return {
    // Boots Pyodide from the virtual files under /pyodide/ and loads the Python helper (with
    // the source of code mode's `mcp_tools`, which it keeps, and the HTTP bridge).
    // snapshotMode: "load" restores the memory snapshot at /snapshot.bin (skipping Python's
    // start-up), "make" boots normally and hands a snapshot to the host, "none" just boots.
    // Answers `{"version": …}`.
    // constantsJson: the binary's constants (src/assets.rs, `runner_constants`), for this file
    // and, through `_CONSTANTS`, for the helper.
    boot(id, helperSource, toolsSource, httpSource, constantsJson, envJson, wasmMaxBytes, snapshotMode) {
      answer(id, (async () => {
        const constants = JSON.parse(constantsJson);
        WORKDIR = constants.workdir + "/";
        UPLOAD = constants.upload_path;
        MOUNT = constants.mount_path;
        if (wasmMaxBytes) {
          // Refuse to grow WebAssembly memory past the budget, as a memory with that maximum
          // would: malloc then fails inside Pyodide and Python raises MemoryError.
          const grow = WebAssembly.Memory.prototype.grow;
          WebAssembly.Memory.prototype.grow = function (pages) {
            if (this.buffer.byteLength + pages * 65536 > wasmMaxBytes) {
              throw new RangeError("WebAssembly.Memory.grow(): the sandbox memory limit is reached");
            }
            return grow.call(this, pages);
          };
        }
        pyodide = await globalThis.loadPyodide({
          indexURL: "/pyodide/",
          createPyodideModule: globalThis.__createPyodideModule,
          env: JSON.parse(envJson),
          // Output written below Python's sys.stdout (C-level writes) still reaches the call,
          // and the front counts it against the output cap.
          stdout: (line) => emitLines("stdout", line),
          stderr: (line) => emitLines("stderr", line),
          _makeSnapshot: snapshotMode === "make",
          _loadSnapshot: snapshotMode === "load" ? new Uint8Array(globalThis.readbuffer("/snapshot.bin")) : undefined,
        });
        delete globalThis.__createPyodideModule;
        // Pyodide keeps its options for ever, the restored snapshot's bytes among them: 30 MiB
        // that every worker (and the zygote, and so every interpreter it forks) would carry.
        if (pyodide._api && pyodide._api.config) pyodide._api.config._loadSnapshot = undefined;
        // The helper module is made once, before the snapshot when one is made: interpreters
        // restored from it start with the helper compiled and its imports done (a tenth of a
        // second of a restore). Only Python objects exist then, as Pyodide's snapshot requires.
        if (snapshotMode !== "load") {
          pyodide.globals.set("_mcp_source", helperSource);
          pyodide.globals.set("_mcp_tools_source", toolsSource);
          pyodide.globals.set("_mcp_http_source", httpSource);
          pyodide.globals.set("_mcp_constants", constantsJson);
          pyodide.runPython(MAKE_HELPER);
        }
        if (snapshotMode === "make") {
          const snapshot = new Uint8Array(pyodide.makeMemorySnapshot());
          hostCall(HOST_SNAPSHOT, snapshot.slice());
        }
        // The boot's table growth is over (see runtime/js/bootstrap.js).
        endTableRoom();
        // Out of sys.modules before any user code runs; from now on only this closure holds it.
        const mod = pyodide.runPython(TAKE_HELPER);
        watchFileChanges();
        mod.setup(emit, ask, fetchBridge, fetchManyBridge, filesChanged);
        helperRun = mod.run;
        helperFindImports = mod.find_imports;
        helperReseed = mod.reseed_before_next_run;
        helperPrimeListing = mod.prime_listing;
        helperForgetRuns = mod.forget_runs;
        helperImportDistributions = mod.import_distributions;
        return JSON.stringify({ version: pyodide.version });
      })());
    },

    // Top-level imports of `code` that are neither standard library nor built in: answers a
    // JSON list of names.
    findImports(id, code) {
      answer(id, Promise.resolve().then(() => helperFindImports(code)));
    },

    // Installs packages: lock-file names and wheel paths under /packages/ (JSON list), then
    // imports the top-level modules of the distributions named in `importsJson` (a JSON list;
    // `--deps` as the interpreter boots). Answers `{}`, `{"failed": [modules that did not
    // import, with why]}`, or `{"error": …}` when a package did not install.
    install(id, itemsJson, importsJson) {
      answer(id, (async () => {
        const errors = [];
        const options = {
          messageCallback: () => {},
          errorCallback: (msg) => errors.push(msg),
          checkIntegrity: false,
        };
        // Wheels by path first: a lock package loaded by name afterwards then finds a
        // dependency the resolver took elsewhere already loaded, instead of fetching the
        // lock's own build of it.
        const items = JSON.parse(itemsJson);
        const paths = items.filter((item) => item.startsWith("/"));
        const names = items.filter((item) => !item.startsWith("/"));
        if (paths.length) await pyodide.loadPackage(paths, options);
        if (names.length) await pyodide.loadPackage(names, options);
        if (errors.length) throw new Error(errors.join("\n"));
        const failed = JSON.parse(helperImportDistributions(importsJson));
        return failed.length ? JSON.stringify({ failed }) : "{}";
      })());
    },

    // Makes the next run reseed Python's random state from the OS before user code runs
    // (called in the zygote before it forks). Answers `{}`.
    reseed(id) {
      answer(id, Promise.resolve().then(() => {
        helperReseed();
        return "{}";
      }));
    },

    // The interpreter's WebAssembly linear memory, for the host to read and write in place
    // (checkpoints, src/interpreter/linear_memory.rs). Synchronous; no call id.
    memory() {
      return pyodide._module.HEAPU8;
    },

    // Records what the interpreter holds outside its linear memory once the zygote is warm
    // (called there, before it forks): a checkpoint of a forked interpreter is whole only
    // while it holds no more than this. The warm-up's own runs are forgotten first. Answers
    // `{}`.
    baseline(id) {
      answer(id, Promise.resolve().then(() => {
        helperForgetRuns();
        // The working directory listed once, for every fork (`filesMayHaveChanged`).
        helperPrimeListing();
        outside = outsideMemory();
        return "{}";
      }));
    },

    // What the interpreter holds outside its linear memory beyond the zygote's baseline:
    // returns `{"js_objects": n, "open_files": n, "loaded_libraries": n}` (each ≥ 0).
    // Synchronous; no call id: every checkpoint asks it, and a turn of the event loop costs
    // more than the counting.
    capturable() {
      const now = outsideMemory();
      const over = (key) => Math.max(0, now[key] - (outside ? outside[key] : now[key]));
      return JSON.stringify({
        js_objects: over("js_objects"),
        open_files: over("open_files"),
        loaded_libraries: over("loaded_libraries"),
      });
    },

    // Grows the linear memory to at least `bytes` (a restore's size), as Emscripten's own
    // growth does (its views follow). Answers `{}`, or fails when it cannot grow.
    grow(id, bytes) {
      answer(id, Promise.resolve().then(() => {
        // The restored Python state's listing is another interpreter's: list again.
        filesMayHaveChanged = true;
        const module = pyodide._module;
        if (module.HEAPU8.length < bytes && !module.growMemory(bytes)) {
          throw new Refusal(`the interpreter's memory cannot grow to ${bytes} bytes`);
        }
        return "{}";
      }));
    },

    // Hands the host the bytes of file `path` (under the working directory) when it has at
    // most `cap` bytes: an image the run just made, or a resource read. Answers `{}`, or
    // fails with the reason.
    readFile(id, path, cap) {
      answer(id, Promise.resolve().then(() => {
        let bytes;
        try {
          bytes = pyodide.FS.readFile(WORKDIR + path);
        } catch (e) {
          throw new Refusal(fsReason(e));
        }
        if (bytes.length > cap) throw new Refusal(`it has more than ${cap} bytes`);
        hostCall(HOST_FILE, bytes.slice());
        return "{}";
      }));
    },

    // Writes the virtual file /upload to `path` under the working directory (its folders made
    // first), or removes `path` when `remove` is true. Answers `{}`, or fails with the reason.
    writeFile(id, path, remove) {
      answer(id, Promise.resolve().then(() => {
        const target = WORKDIR + path;
        try {
          if (remove === true) {
            pyodide.FS.unlink(target);
          } else {
            const folder = target.slice(0, target.lastIndexOf("/"));
            pyodide.FS.mkdirTree(folder);
            pyodide.FS.writeFile(target, new Uint8Array(globalThis.readbuffer(UPLOAD)));
          }
        } catch (e) {
          throw new Refusal(fsReason(e));
        }
        return "{}";
      }));
    },

    // Makes the operator's `--mount` folders and files (a JSON MountPlan: `folders`, then
    // `files` as [path, length], whose bytes follow each other in the virtual file /mount),
    // then makes them read-only: files 0444, folders 0555, and neither can be chmod-ed or
    // touched (their node's setattr refuses), so code cannot make its copy writable again.
    // Answers `{}`, or `{"error": …}`.
    mount(id, planJson) {
      answer(id, Promise.resolve().then(() => {
        const FS = pyodide.FS;
        const plan = JSON.parse(planJson);
        const bytes = new Uint8Array(globalThis.readbuffer(MOUNT));
        for (const folder of plan.folders) FS.mkdirTree(folder);
        let at = 0;
        const frozen = [];
        for (const [path, length] of plan.files) {
          FS.writeFile(path, bytes.subarray(at, at + length));
          at += length;
          FS.chmod(path, 0o444);
          frozen.push(path);
        }
        // Deepest folders first, so that each is still writable while its contents are done.
        for (const folder of [...plan.folders].reverse()) {
          FS.chmod(folder, 0o555);
          frozen.push(folder);
        }
        const refuse = () => {
          throw new FS.ErrnoError(63); // EPERM
        };
        for (const path of frozen) {
          const node = FS.lookupPath(path).node;
          node.node_ops = Object.assign({}, node.node_ops, { setattr: refuse });
        }
        return "{}";
      }));
    },

    // Runs user code (in the globals earlier runs left when keepGlobals is true: --stateful);
    // answers with the helper's result object (one JSON text). `toolsJson`: code mode's tool
    // catalog when it changed, else null; `networkJson`: what the code may do on the network
    // (the os.environ placeholders of --secret, the requests it may make at once), else null.
    // The helper answers at once, or with an awaitable (an asyncio task) when the code
    // uses top-level `await` and suspends.
    run(id, code, globalsJson, outputCap, resultCap, keepGlobals, toolsJson, networkJson) {
      takeFetchLimit();
      if (networkJson != null) fetchLimit(JSON.parse(networkJson).concurrency);
      let result;
      try {
        // Pyodide gives Python `null` as JsNull and `undefined` as None.
        result = helperRun(code, globalsJson, outputCap, resultCap, keepGlobals === true, toolsJson ?? undefined, networkJson ?? undefined);
      } catch (e) {
        done(id, failed(e));
        return;
      }
      if (typeof result === "string") {
        // Callbacks the code scheduled and did not await (the first step of a task it
        // started) run before the answer, as they did when the code itself ran in a task:
        // their output is still this call's.
        setTimeout(() => done(id, ok(result)), 0);
        return;
      }
      answer(id, Promise.resolve(result));
    },
  };
})();
