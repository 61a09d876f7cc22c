// The sandbox's side of the worker protocol. Rust evaluates `__mcp.<op>(...)` and then drives
// the event loop until the operation calls `done(json)`. Asynchronous operations answer through
// `done`; they never throw past it.
(function () {
  "use strict";
  const { emit, done } = globalThis.__mcpHost;
  delete globalThis.__mcpHost;
  let pyodide = null;
  let helper = null;

  const errorText = (e) => {
    if (e && typeof e === "object" && "message" in e) return `${e.name || "Error"}: ${e.message}\n${e.stack || ""}`;
    return String(e);
  };
  const answer = (promise) =>
    promise.then(
      (value) => done(JSON.stringify({ ok: true, value })),
      (e) => done(JSON.stringify({ ok: false, error: errorText(e) })),
    );
  // Output goes to the host as a JSON list of [stream, line] pairs.
  const emitOutput = (stream, text) => emit(JSON.stringify([[stream, text]]));

  const mcp = {
    // Boots Pyodide from the virtual files under /pyodide/ and loads the Python helper.
    // snapshotMode: "load" restores the memory snapshot at /snapshot.bin (skipping Python's
    // start-up), "make" boots normally and hands a snapshot to the host, "none" just boots.
    boot(helperSource, envJson, wasmMaxBytes, snapshotMode) {
      answer((async () => {
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
          // Output written below Python's sys.stdout (C-level writes) still reaches the call.
          stdout: (line) => emitOutput("stdout", line),
          stderr: (line) => emitOutput("stderr", line),
          _makeSnapshot: snapshotMode === "make",
          _loadSnapshot: snapshotMode === "load" ? new Uint8Array(globalThis.readbuffer("/snapshot.bin")) : undefined,
        });
        delete globalThis.__createPyodideModule;
        if (snapshotMode === "make") {
          // Taken before any of our JavaScript objects reach Python, as Pyodide requires.
          const snapshot = new Uint8Array(pyodide.makeMemorySnapshot());
          globalThis.__mcpHostCall("snapshot", "{}", snapshot.slice());
        }
        const mod = pyodide.runPython(
          "import types, sys\n" +
          "_m = types.ModuleType('_mcp_runner')\n" +
          "_m.__file__ = '/lib/_mcp_runner.py'\n" +
          "sys.modules['_mcp_runner'] = _m\n" +
          "_m",
        );
        pyodide.runPython(helperSource, { globals: mod.__dict__, filename: "/lib/_mcp_runner.py" });
        helper = mod;
        helper.setup(emit);
        return pyodide.version;
      })());
    },

    // Top-level imports of `code` that are neither standard library nor built in (JSON list).
    findImports(code) {
      return helper.find_imports(code);
    },

    // Installs packages: lock-file names and wheel paths under /packages/ (JSON list).
    install(itemsJson) {
      answer((async () => {
        const errors = [];
        await pyodide.loadPackage(JSON.parse(itemsJson), {
          messageCallback: (msg) => console.debug(msg),
          errorCallback: (msg) => errors.push(msg),
          checkIntegrity: false,
        });
        if (errors.length) throw new Error(errors.join("\n"));
        return null;
      })());
    },

    // Runs user code; answers with the helper's result object.
    run(code, globalsJson, outputCap) {
      answer(Promise.resolve(helper.run(code, globalsJson, outputCap)).then((r) => JSON.parse(r)));
    },
  };
  Object.defineProperty(globalThis, "__mcp", { value: Object.freeze(mcp), enumerable: false });
})();
