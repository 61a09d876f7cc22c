"""Runs inside Pyodide: executes one call's code and shapes its result (docs/architecture.md §4).

Loaded into a module object named ``_mcp_runner`` (before the memory snapshot is taken, so
that restored interpreters start with it), which is out of ``sys.modules`` before any user code
runs; the JavaScript runner keeps ``run`` and ``find_imports`` in closures. Every call
gets fresh globals; stdout and stderr lines go to the host as they are written, in the order
written, up to the output cap. Text that crosses to the host never holds lone surrogates: they
are escaped ``\\udcxx`` style (``backslashreplace``), never dropped.
"""

import ast
import builtins
import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import linecache
import os
import re
import sys
import textwrap
import time
import traceback

from pyodide.code import find_imports as _find_imports, should_quiet

# The binary's constants (src/assets.rs, `runner_constants`): `max_images`, `max_listed_files`,
# `upload_path`, `mount_path` and `workdir`. runtime/js/runner.js sets it on this module before its code
# runs, so that nothing here repeats a number the front checks.
_CONSTANTS: dict

_emit = None
# Modules that come with Pyodide itself and are never packages to install.
_BUILTIN = {"js", "pyodide", "pyodide_js", "_pyodide", "_mcp_runner", "mcp_tools", "mcp_run_python"}
# The user's code is `main.py` in tracebacks, as in the Deno original.
USER_FILENAME = "main.py"
# Top-level `await` is allowed, as in Pyodide's `eval_code_async`.
_COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
# `co_flags` bit of a code object that must be awaited (top-level `await`): `inspect.CO_COROUTINE`.
_CO_COROUTINE = 0x80


def _clean(text):
    """``text`` with lone surrogates escaped (``'\\udc80'``), so that it is valid UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


# matplotlib's backend in the sandbox (``MPLBACKEND``, unless the code picks another): Agg
# rendering, and a ``show()`` that leaves the figures open, so that ``plt.show()`` works without
# a display; a ``--stateful`` call's open figures are saved and returned as images when it ends.
_MPL_BACKEND = "_mcp_matplotlib_backend"
_MPL_BACKEND_SOURCE = '''"""mcp-run-python's matplotlib backend: Agg rendering; show() keeps the figures open,
and with --stateful the server returns them as images when the call ends."""
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401


def show(*args, **kwargs):
    """Nothing to show on: the figures stay open until the call ends."""
'''


def setup(emit, ask, fetch=None, fetch_many=None, files_changed=None):
    """Connects the helper to its host: ``emit`` and ``ask`` carry output and questions,
    ``fetch`` and ``fetch_many`` the network (Pyodide's host only), and ``files_changed`` says
    whether a file may have changed since it was last called (runtime/js/runner.js
    ``filesChanged``; without it, ``_scan`` lists the working directory at every run)."""
    global _emit, _ask, _files_changed
    _emit = emit
    _ask = ask
    _files_changed = files_changed
    if fetch is not None:
        _http.install(_pyodide_fetch(fetch), _pyodide_fetch(fetch_many))
    sys.meta_path.insert(0, _ToolsFinder())
    sys.modules["mcp_run_python"] = _SANDBOX_MODULE
    reseed()
    for folder in sys.path:
        if folder.endswith("site-packages"):
            with open(os.path.join(folder, _MPL_BACKEND + ".py"), "w") as f:
                f.write(_MPL_BACKEND_SOURCE)
            os.environ.setdefault("MPLBACKEND", "module://" + _MPL_BACKEND)
            break


def _pyodide_fetch(fetch):
    """An HTTP bridge's host call (runtime/js/runner.js `fetchBridge`, `fetchManyBridge`) with
    Python's bytes in and out."""
    from pyodide.ffi import to_js

    def bridged(request_json, body):
        answer = fetch(request_json, None if body is None else to_js(body))
        return answer[0], answer[1].to_bytes()

    return bridged


def reseed():
    """Reseeds ``random``, and NumPy's global generator, from the OS where they are imported: an
    interpreter restored from a memory snapshot or forked from the zygote starts with their
    random state (NumPy's is drawn when ``numpy.random`` is imported, as ``--deps`` may have done
    before the fork), and interpreters must never share a sequence."""
    if "random" in sys.modules:
        sys.modules["random"].seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # a NumPy without the legacy global generator has nothing to reseed
            pass


def import_distributions(names_json):
    """Imports the top-level modules of the installed distributions named in ``names_json`` (a
    JSON list; ``--deps`` as an interpreter boots, so that its calls find them imported).
    Answers the JSON list of the modules that failed to import, each with its error."""
    wanted = {_canonical(name) for name in json.loads(names_json)}
    if not wanted:
        # A call's install imports nothing: no scan of every installed distribution.
        return "[]"
    modules = sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if module.isidentifier() and any(_canonical(d) in wanted for d in dists)
    )
    failed = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as e:  # a module that needs what is missing stays for the call to import
            failed.append(f"{module}: {type(e).__name__}: {_clean(str(e))}")
    return json.dumps(failed)


def _canonical(name):
    """A distribution name normalized as PEP 503 says (``Foo.Bar_baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


_reseed_pending = False

# Code mode: ``mcp_tools``'s source (runtime/python/mcp_tools.py, put here by the JavaScript runner as
# the helper is made), the catalog of tools it is built from (src/code_mode/catalog.rs's JSON,
# given by the front with a run when it changed; ``None`` without ``--tools-config``) and the
# runner's host call that makes a tool call.
_tools_source = None
_tools_catalog = None
# The HTTP bridge (runtime/python/http_bridge.py as a module, `_mcp_http`), set by
# runtime/js/runner.js as it makes this helper, and by runtime/python/scientific.py.
_http = None
_ask = None
# The launcher's host functions (``code_sandbox(functions=...)``), by name: globals of every
# run.
_function_globals = {}


class FunctionError(Exception):
    """A host function raised in the process that launched the server; the message is its
    exception's type and text."""


FunctionError.__module__ = "mcp_run_python"
# ``mcp_run_python`` inside the sandbox: where ``FunctionError`` is found.
_SANDBOX_MODULE = type(sys)("mcp_run_python", "mcp-run-python's names inside the sandbox: FunctionError, which a failing host function raises.")
_SANDBOX_MODULE.FunctionError = FunctionError


def _host_function(spec):
    """The async function sandboxed code awaits for host function ``spec`` (its name,
    signature and docstring)."""
    name = spec["name"]

    async def function(*args, **kwargs):
        try:
            request = json.dumps({"function": name, "args": list(args), "kwargs": kwargs})
        except (TypeError, ValueError) as e:
            raise TypeError(f"the arguments of {name}() are not JSON: {e}") from None
        answer = json.loads(_ask("function", request)[0])
        if answer["kind"] == "error":
            raise FunctionError(answer["message"])
        return answer["value"]

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"{name}{spec['signature']}\n\n{spec['doc']}".strip()
    function.__module__ = "mcp_run_python"
    return function


class _ToolsFinder:
    """Finds ``mcp_tools``: a module built from the current catalog when it is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "mcp_tools":
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if _tools_catalog is None:
            raise ModuleNotFoundError(
                "No module named 'mcp_tools': this server calls no MCP tools (its operator names them with --tools-config)",
                name="mcp_tools",
            )
        module.__file__ = "/lib/mcp_tools.py"
        exec(compile(_tools_source, module.__file__, "exec"), module.__dict__)
        module._build(_tools_catalog, _ask)
        del module._build


def _set_tools(tools_json):
    """A run brought a new catalog: the next ``import mcp_tools`` builds from it."""
    global _tools_catalog, _function_globals
    _tools_catalog = json.loads(tools_json)
    sys.modules.pop("mcp_tools", None)
    _function_globals = {spec["name"]: _host_function(spec) for spec in _tools_catalog["functions"]}


def reseed_before_next_run():
    """Called in the zygote before it forks: every forked interpreter reseeds at the start of
    its first run, before any user code (in the same call, which is cheaper in a fresh fork
    than a call of its own)."""
    global _reseed_pending
    _reseed_pending = True


def find_imports(code):
    """Top-level imported names of ``code``, minus the standard library and the interpreter's
    own modules (uploaded, written, or an operator's ``--mount`` on ``sys.path``): a JSON
    list."""
    try:
        names = _find_imports(code)
    except SyntaxError:
        return "[]"
    wanted = []
    for full_name in names:
        name = full_name.split(".")[0]
        if name in sys.stdlib_module_names or name in _BUILTIN or name in sys.builtin_module_names:
            continue
        if _local(name):
            continue
        if name not in wanted:
            wanted.append(name)
    return json.dumps(wanted)


def _local(name):
    """Whether top-level module ``name`` is the interpreter's own and not a package's: found
    (without importing it) outside ``site-packages``, as a module the session uploaded or wrote
    or an operator's ``--mount`` folder on ``sys.path`` is. An installed package is not local:
    its name stays in the list (the drop-in shows it under ``<dependencies>``)."""
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return False
    if spec is None:
        return False
    places = [spec.origin or "", *(spec.submodule_search_locations or [])]
    return not any("site-packages" in place for place in places)


class _Capture:
    """Counts output bytes for one call, stops forwarding past the cap, and sends lines to the
    host in batches: a line written after a quiet spell (50 ms) goes out at once, so output
    streams as it happens, while a flood of lines costs one host message per 256 lines."""

    QUIET = 0.05
    BATCH = 256

    def __init__(self, cap):
        self.cap = cap
        self.used = 0
        self.truncated = False
        self.pending = []
        self.last_sent = 0.0

    def line(self, stream, text):
        if self.truncated:
            return
        size = len(text.encode("utf-8", "backslashreplace")) + 1
        if self.used + size > self.cap:
            self.truncated = True
            self.pending.append((stream, f"[output truncated: more than {self.cap} bytes were written]"))
            self.flush()
            # From now on output is dropped; a C-level null stream makes print floods cheap.
            sys.stdout = sys.stderr = _null_stream()
            return
        self.used += size
        self.pending.append((stream, _clean(text)))
        now = time.monotonic()
        if len(self.pending) >= self.BATCH or now - self.last_sent > self.QUIET:
            self.flush(now)

    def flush(self, now=None):
        if self.pending:
            _emit(json.dumps(self.pending))
            self.pending = []
        self.last_sent = now if now is not None else time.monotonic()


_NULL = None


def _null_stream():
    global _NULL
    if _NULL is None:
        _NULL = open("/dev/null", "w", buffering=1 << 16)
    return _NULL


class _Stream(io.TextIOBase):
    """A text stream that forwards whole lines to the capture as they are completed."""

    def __init__(self, name, capture):
        self.name = name
        self._capture = capture
        self._buf = []

    def writable(self):
        return True

    @property
    def encoding(self):
        return "utf-8"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if self._capture.truncated:
            return len(s)
        if "\n" in s:
            head, *middle, tail = s.split("\n")
            self._capture.line(self.name, "".join(self._buf) + head)
            for line in middle:
                self._capture.line(self.name, line)
            self._buf = [tail] if tail else []
        elif s:
            self._buf.append(s)
        return len(s)

    def flush(self):
        self._capture.flush()

    def finish(self):
        if self._buf:
            self._capture.line(self.name, "".join(self._buf))
            self._buf = []


def _default(value):
    """JSON fallback for values json cannot hold (numpy-like, JsProxy, pydantic, dataclasses)."""
    for attr in ("tolist", "item", "to_py"):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                return fn()
            except Exception:
                pass
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise _NotJson


class _NotJson(Exception):
    pass


def _return_value(value):
    """(text, kind): the value as JSON text (indent 2), a ``str`` as is, else its repr."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return _clean(value), "str"
    try:
        return json.dumps(value, indent=2, default=_default), "json"
    except (_NotJson, ValueError, TypeError, RecursionError):
        return _clean(repr(value)), "repr"


def _is_internal(filename):
    return (
        "/_pyodide/" in filename
        or "/pyodide/" in filename
        or filename.endswith("/_mcp_runner.py")
        or filename.startswith("/lib/python3") and "/asyncio/" in filename
    )


def _format_error(exc):
    """The traceback of ``exc`` with Pyodide-internal frames removed, as CPython prints it
    (final newline kept, as the original shows it; a ``SyntaxError`` without a header)."""
    te = traceback.TracebackException.from_exception(exc)
    for t in _chain(te):
        t.stack = traceback.StackSummary.from_list(
            [f for f in t.stack if not _is_internal(f.filename)]
        )
    return "".join(te.format())


def _chain(te):
    seen = []
    while te is not None and te not in seen:
        seen.append(te)
        te = te.__cause__ or te.__context__
    return seen


def _compile(code, filename):
    """``(body, last)``: the code objects Pyodide's ``eval_code_async`` would run for ``code``
    (the Deno original's semantics): the source dedented, the value of a last expression
    statement returned unless the source ends with a semicolon. ``body`` is every statement
    before that expression (``None`` when there is none), ``last`` the expression (``None``
    when there is nothing to return). Both are compiled before either runs, so a
    ``SyntaxError`` anywhere runs nothing. Pyodide instead rewrites the last statement into a
    ``raise`` of a deep-copied AST template and compiles one module: the same result, at about
    four times the cost of a trivial call."""
    source = textwrap.dedent(code)
    tree = compile(source, filename, "exec", _COMPILE_FLAGS | ast.PyCF_ONLY_AST)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        # The tokenizer only runs when a semicolon could end the source.
        if ";" not in source or not should_quiet(source):
            expression = ast.Expression(tree.body.pop().value)
            last = compile(expression, filename, "eval", _COMPILE_FLAGS)
    body = compile(tree, filename, "exec", _COMPILE_FLAGS) if tree.body else None
    return body, last


def _awaits(code):
    """Whether running ``code`` (a code object, or ``None``) gives a coroutine to await: the
    source used top-level ``await``."""
    return code is not None and bool(code.co_flags & _CO_COROUTINE)


# Images a ``keep_globals`` run created or changed in the working directory are handed to the
# front (``image`` content): these file name endings, at most this many per call, and of the
# files under the working directory at most this many are looked at.
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")
_MAX_IMAGES = _CONSTANTS["max_images"]
_MAX_SCANNED = _CONSTANTS["max_listed_files"]
# The session's working directory: the code's current directory when the interpreter starts
# (Pyodide's home), wherever the code moves to later.
WORKDIR = _CONSTANTS["workdir"]


def _scan():
    """``{path relative to WORKDIR: (size, mtime_ns)}`` of the regular files under it (symbolic
    links not followed), at most ``_MAX_SCANNED`` of them."""
    found = {}
    root = WORKDIR
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if (st.st_mode & 0o170000) == 0o100000:
                found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
                if len(found) >= _MAX_SCANNED:
                    return found
    return found


# The host's ``files_changed`` (``setup``), or ``None`` when it cannot tell.
_files_changed = None
# The working directory's listing (``_scan``'s shape) as last made, current while no file may
# have changed since: made by a ``keep_globals`` run, or by the zygote before it forks
# (``prime_listing``), so that a fork's first such run lists it only after a change.
_listed = None


def forget_runs():
    """Called in the zygote after its warm-up, before it forks: forgets what the warm-up's
    ``keep_globals`` runs and catalogs left (the kept globals, the run count and their sources
    for tracebacks, the listings, the catalog and host functions), so that a fork's first run
    is its interpreter's first, as in a new one. The kept globals are emptied first: a warm-up
    function refers to them, a cycle the collector no longer sees once frozen."""
    global _kept_globals, _kept_runs, _last_scan, _listed, _tools_catalog, _function_globals
    for number in range(1, _kept_runs + 1):
        linecache.cache.pop(f"call_{number}.py", None)
    if _kept_globals is not None:
        _kept_globals.clear()
    _kept_globals, _kept_runs, _last_scan, _listed = None, 0, None, None
    _tools_catalog, _function_globals = None, {}
    sys.modules.pop("mcp_tools", None)


def prime_listing():
    """Lists the working directory and marks the listing current (the zygote, once warm,
    before it forks: its forks inherit both, and their first ``keep_globals`` run need not
    list the directory unless a file changed since, an upload or a restore)."""
    global _listed
    _files_may_have_changed()
    _listed = _scan()


def _files_may_have_changed():
    """Whether a file may have changed since this was last asked: the host says so, or it
    cannot tell."""
    if _files_changed is None:
        return True
    try:
        return bool(_files_changed())
    except Exception:  # code that broke Pyodide's bridge: it can no longer tell
        return True


def _save_figures(call_number):
    """Saves every matplotlib figure left open (``plt.show()`` included) as
    ``figure_{call_number}_{figure number}.png`` in the working directory, then closes them:
    the run's images. A failure is reported on the call's stderr, never raised."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for number in plt.get_fignums():
            path = os.path.join(WORKDIR, f"figure_{call_number}_{number}.png")
            plt.figure(number).savefig(path, format="png")
        plt.close("all")
    except Exception as exc:  # the code's own matplotlib state may be broken
        print(f"mcp-run-python: could not save the open matplotlib figures: {exc!r}", file=sys.stderr)


# The globals that runs with ``keep_globals`` share (``--stateful``: one MCP session's state),
# and how many such runs there were: each is ``call_N.py`` in tracebacks, so that a function
# defined by an earlier call is quoted from that call's source.
_kept_globals = None
_kept_runs = 0
# The working directory as the last ``keep_globals`` run left it (``_scan``'s shape), to tell
# the front which files changed since it last looked, even between runs (an upload, a task the
# code left running): it keeps a copy of each to restore them into a new interpreter.
_last_scan = None


# Microseconds in a second.
_MICROS = 1_000_000

def _fresh_globals():
    return {"__name__": "__main__", "__builtins__": builtins}


class _Call:
    """One run's state: its output capture (installed as ``sys.stdout``/``sys.stderr`` from
    creation to ``close``), its globals (fresh, or the kept ones) and its caps."""

    def __init__(self, code, globals_json, output_cap, result_cap, keep_globals):
        global _kept_globals, _kept_runs
        global _reseed_pending
        if _reseed_pending:
            # The first run of an interpreter forked from the zygote: a random state of its
            # own before any user code runs.
            _reseed_pending = False
            reseed()
        self.result_cap = int(result_cap)
        self.capture = _Capture(int(output_cap))
        self.out = _Stream("stdout", self.capture)
        self.err = _Stream("stderr", self.capture)
        # The working directory's files before the run, to find the images it makes: as last
        # listed unless a file may have changed since.
        self.files_before = None
        if keep_globals:
            global _listed
            changed = _files_may_have_changed()
            self.files_before = _scan() if changed or _listed is None else _listed
            _listed = self.files_before
            if _kept_globals is None:
                _kept_globals = _fresh_globals()
            self.globals = _kept_globals
            _kept_runs += 1
            self.filename = f"call_{_kept_runs}.py"
        else:
            self.globals = _fresh_globals()
            self.filename = USER_FILENAME
        self.globals.update(_function_globals)
        self.globals.update(json.loads(globals_json))
        # Let tracebacks quote the user's source lines.
        linecache.cache[self.filename] = (len(code), None, code.splitlines(True), self.filename)
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.out, self.err
        # The code's own time starts here, once its globals are set (src/protocol/messages.rs
        # `RunOutcome.code_us`, the per-call timing line).
        self.started = time.perf_counter()

    def success(self, value):
        """The result for ``value``; may raise (a user ``__repr__``), which is then the error."""
        text, kind = _return_value(value)
        size = len(text.encode("utf-8")) if text is not None else 0
        if size > self.result_cap:
            return {
                "status": "run-error",
                "error": f"ValueError: the return value is {size} bytes as text, more than the limit of {self.result_cap} bytes",
            }
        return {"status": "success", "return_value": None if text is None else {"kind": kind, "text": text}}

    def failure(self, exc):
        """The result for an exception of the code (``SystemExit`` and ``KeyboardInterrupt``
        too)."""
        try:
            error = _clean(_format_error(exc))
        except BaseException:  # a hostile exception can break its own formatting
            error = "Error: the code raised an exception that could not be formatted"
        if len(error) > self.result_cap:
            error = error[: self.result_cap] + f"\n[error text truncated at {self.result_cap} characters]"
        return {"status": "run-error", "error": error}

    def close(self, result):
        """Saves open figures (``keep_globals``), flushes the output, puts the streams back
        and returns ``result`` as JSON text."""
        result["code_us"] = int((time.perf_counter() - self.started) * _MICROS)
        if self.files_before is not None:
            _save_figures(_kept_runs)
        try:
            self.out.finish()
            self.err.finish()
            self.capture.flush()
        finally:
            sys.stdout, sys.stderr = self.saved
        result["truncated"] = self.capture.truncated
        if self.files_before is not None:
            global _last_scan, _listed
            try:
                after = _scan() if _files_may_have_changed() else self.files_before
            except OSError:  # the code removed its own working directory
                after = {}
            _listed = after
            # A new interpreter's first run: its files (restored by the front) are current.
            last = self.files_before if _last_scan is None else _last_scan
            _last_scan = after
            listed = sorted(after.items())
            result["files"] = [[path, size] for path, (size, _) in listed]
            written = [path for path, seen in listed if self.files_before.get(path) != seen]
            result["written"] = written
            result["refresh"] = [path for path, seen in listed if last.get(path) != seen]
            result["images"] = [path for path in written if path.lower().endswith(_IMAGE_SUFFIXES)][:_MAX_IMAGES]
        return json.dumps(result)


def run(code, globals_json, output_cap, result_cap, keep_globals=False, tools_json=None, network_json=None):
    """Runs ``code`` with fresh globals (or, with ``keep_globals``, in the globals earlier such
    runs left); returns the result as one JSON object's text:
    ``{"status", "return_value": {"kind", "text"} | null, "error", "truncated"}``, or, when
    the code uses top-level ``await`` and suspends, an asyncio task that returns that text. A
    return value whose text is longer than ``result_cap`` bytes becomes an error. With
    ``keep_globals`` it also has the working directory's ``files`` (``[path, size]``), those
    the run ``written`` (created or changed), those changed since the last such run
    (``refresh``) and the ``images`` among the written.

    Code without top-level ``await`` runs here and now rather than in an asyncio task: the
    task, its future and the promise around it cost more than the rest of a trivial call.

    ``tools_json``: code mode's tool catalog, when it changed since the last run.
    ``network_json``: what the code may do on the network (src/protocol/messages.rs
    ``RunNetwork``): names and values to set in ``os.environ`` first (``--secret``'s
    placeholders, never a secret's value) and the requests it may make at once."""
    if tools_json is not None:
        _set_tools(tools_json)
    if network_json is not None:
        network = json.loads(network_json)
        os.environ.update(dict(network["environment"]))
        _http.concurrency = network["concurrency"]
    call = _Call(code, globals_json, output_cap, result_cap, keep_globals)
    try:
        body, last = _compile(code, call.filename)
        if _awaits(body) or _awaits(last):
            # The coroutine closes the call when it ends.
            return _start_async(_run_async(call, body, last))
        if body is not None:
            eval(body, call.globals)
        result = call.success(None if last is None else eval(last, call.globals))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are results too
        result = call.failure(exc)
    return call.close(result)


def _start_async(coroutine):
    """Runs ``coroutine`` (``_run_async``'s) as an eager asyncio task (Python 3.12+): it starts
    here and now, and code that never suspends (FastMCP's code mode without a tool call, an
    ``await`` of something already done) ends before this returns: its text is returned,
    without a task step through the event loop and a promise, ~0.6 ms of such a call.
    Otherwise returns the task, which the event loop drives to the text. Without a running
    loop (the scientific runtime, which runs the coroutine itself) returns ``coroutine``."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return coroutine
    task = asyncio.Task(coroutine, loop=loop, eager_start=True)
    return task.result() if task.done() else task


async def _run_async(call, body, last):
    """``run`` for code that uses top-level ``await``."""
    try:
        if body is not None:
            ran = eval(body, call.globals)
            if _awaits(body):
                await ran
        value = None
        if last is not None:
            value = eval(last, call.globals)
            if _awaits(last):
                value = await value
        result = call.success(value)
    except BaseException as exc:
        result = call.failure(exc)
    return call.close(result)
