"""`--stateful` (files, README "Sandboxes"): a session's globals last from one call to the next, never cross
sessions, and a result says when they were lost. Real binary, real `mcp` client, stdio and
streamable HTTP."""

import asyncio
import base64
import json
import os
import re
import subprocess

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError

from adversary import http_server, http_session, return_value, status_of, wait_until
from conftest import BINARY, SHARED_CACHE, child_pids, direct_child_pids, forked_session, mcp_session, run, server_env
from raw_http import call_message, rpc_result, sse_message, sse_session_by_hand, start_session

pytestmark = pytest.mark.anyio


SANDBOX_TOOLS = {"run_python_code", "create_sandbox", "fork_sandbox", "list_sandbox_files", "destroy_sandbox",
                 "upload_file", "delete_file", "reset_session"}
# A well-formed handle that no server minted.
UNKNOWN = "sbx_" + "A" * 22


def state_of(text):
    """The one-line `<state>` section of a result, or None."""
    found = re.search(r"^<state>(.*)</state>$", text, re.MULTILINE)
    return found and found[1]


async def test_state_lasts_within_a_session_and_says_when_it_was_lost():
    async with forked_session("--stateful", "--timeout", "5") as session:
        tools = await session.list_tools()
        assert "State persists between calls in the same sandbox" in tools.tools[0].description
        assert return_value(await run(session, "x = 42\nimport json\ndef double(v):\n    return v * 2")) is None
        assert return_value(await run(session, "double(x)")) == "84"
        assert return_value(await run(session, "json.dumps({'y': y, 'x': x})", y=1)) == '{"y": 1, "x": 42}'
        # A function of an earlier call is quoted from that call's source in a traceback.
        await run(session, "def boom():\n    raise ValueError('from call five')")
        text = await run(session, "boom()")
        assert status_of(text) == "run-error", text
        assert "raise ValueError('from call five')" in text, text
        assert "<state>" not in text, text

        # A timeout stops the interpreter: this result says what the call changed is gone, and
        # the next one runs in a new interpreter with the state of the last completed call
        # (checkpoints, docs/architecture.md §3.4: its checkpoint), and says so.
        text = await run(session, "x = 0\nwhile True:\n    pass")
        assert "timed out" in text, text
        assert state_of(text).startswith("lost:") and "last completed call" in state_of(text), text
        text = await run(session, "double(x)")
        assert return_value(text) == "84", text
        assert state_of(text).startswith("restored:") and "was stopped" in state_of(text), text
        text = await run(session, "x = 1\nx")
        assert return_value(text) == "1" and "<state>" not in text, text


# A new sandbox's calls after a first one that fails: what its interpreter holds. The zygote's
# warm-up runs calls in kept globals, with a catalog of one host function, and forgets them
# before it forks (runtime/python/runner.py `forget_runs`).
SECOND_CALL = """
import random
try:
    import mcp_tools
    tools = "imported"
except ModuleNotFoundError as e:
    tools = str(e)
[sorted(n for n in globals() if not n.startswith("__")), tools, random.getrandbits(64)]
"""
NO_TOOLS = "No module named 'mcp_tools': this server calls no MCP tools (its operator names them with --tools-config)"
# Seconds the server may take to fork its spare.
SPARE_WAIT = 60


async def test_each_new_sandbox_is_a_new_interpreter_and_a_warm_spare_waits_for_the_next():
    """Over stdio with `--stateful`, once a second sandbox is made, the server keeps one forked
    spare, warmed up, for the next `create_sandbox` (src/modes.rs `spare_counts`): sandboxes
    made one after another (code mode's) do not pay a fork's first call, and a client that
    keeps one sandbox pays for no spare."""
    async with forked_session("--stateful") as session:
        (server,) = [pid for pid in direct_child_pids(os.getpid())
                     if open(f"/proc/{pid}/cmdline", "rb").read().startswith(BINARY.encode())]
        draws = []
        for made in range(1, 3):
            created = await session.call_tool("create_sandbox", {})
            sandbox = created.structuredContent["sandbox_id"]
            failed = await session.call_tool("run_python_code", {"python_code": "1 / 0", "sandbox_id": sandbox})
            assert 'File "call_1.py", line 1' in failed.content[0].text, failed.content[0].text
            text = (await session.call_tool(
                "run_python_code", {"python_code": SECOND_CALL, "sandbox_id": sandbox})).content[0].text
            names, tools, draw = json.loads(re.search(r"<return_value>\n(.*)\n</return_value>", text, re.S)[1])
            assert names == ["random", "tools"] and tools == NO_TOOLS, text
            draws.append(draw)
            # The sandboxes made here, and from the second on one spare (the session's own
            # sandbox has run no call).
            workers = made + (made >= 2)
            assert await wait_until(lambda: len(child_pids(server)) == workers, SPARE_WAIT), child_pids(server)
        assert draws[0] != draws[1]


async def test_reset_session_clears_the_state():
    async with mcp_session("--stateful") as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == SANDBOX_TOOLS
        assert tools["reset_session"].annotations.destructiveHint is True
        await run(session, "x = 42")
        done = await session.call_tool("reset_session", {})
        assert not done.isError and "state was cleared" in done.content[0].text, done
        text = await run(session, "x")
        assert "NameError" in text and "<state>" not in text, text
        with pytest.raises(McpError, match="unknown field `hard`"):
            await session.call_tool("reset_session", {"hard": True})


async def test_without_the_flag_every_call_starts_from_fresh_globals():
    async with mcp_session() as session:
        tools = await session.list_tools()
        assert [t.name for t in tools.tools] == ["run_python_code"]
        assert "State persists" not in tools.tools[0].description
        await run(session, "x = 42")
        text = await run(session, "x")
        assert "NameError" in text and "<state>" not in text, text


async def test_state_is_the_sessions_own(tmp_path):
    with http_server("streamable_http", "--stateful", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            await run(a, "secret = 'A'")
            await run(b, "secret = 'B'")
            assert return_value(await run(a, "secret")) == "A"
            assert return_value(await run(b, "secret")) == "B"
        async with http_session(base) as c:
            text = await run(c, "secret")
            assert "NameError" in text, text


async def test_an_idle_session_expires_with_its_state(tmp_path):
    with http_server("streamable_http", "--stateful", "--session-idle-timeout", "2",
                     stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=120) as http:
            h = await start_session(http, base)
            r = await http.post(f"{base}/mcp", json=call_message(2, "x = 1\nx"), headers=h)
            assert "<return_value>\n1\n</return_value>" in rpc_result(r)["result"]["content"][0]["text"]
            # A client listening for notifications (a GET stream, as the `mcp` client opens)
            # sends no request: its session still expires.
            async with http.stream("GET", f"{base}/mcp", headers={**h, "Accept": "text/event-stream"}) as listening:
                assert listening.status_code == 200
                await asyncio.sleep(5)
            r = await http.post(f"{base}/mcp", json=call_message(3, "x"), headers=h)
            assert r.status_code == 404, r.text
            message = r.json()["error"]["message"]
            assert "--session-idle-timeout" in message and "state are gone" in message, message


async def test_an_idle_sse_session_expires_with_its_state(tmp_path):
    """The legacy SSE transport: a session with no message either way for
    --session-idle-timeout seconds ends: its stream closes, its interpreter is stopped, and a
    later POST gets 404 with the words."""
    with http_server("sse", "--stateful", "--session-idle-timeout", "2",
                     stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=120) as http:
            async with sse_session_by_hand(http, base) as (endpoint, events):
                r = await http.post(endpoint, json=call_message(2, "x = 1\nx"))
                assert r.status_code == 202, r.text
                answer = await sse_message(events, 2)
                assert answer, "the stream ended before the call's result"
                assert "<return_value>\n1\n</return_value>" in answer["result"]["content"][0]["text"], answer
                # The session's interpreter, among the spares kept ready.
                during = set(child_pids(base.pid))
                # The server ends the stream after the idle time (keep-alive comments are no
                # messages).
                async with asyncio.timeout(30):
                    async for _ in events:
                        pass
            r = await http.post(endpoint, json=call_message(3, "x"))
            assert r.status_code == 404, r.text
            message = r.json()["error"]["message"]
            assert "--session-idle-timeout" in message and "state are gone" in message, message
            # Spares stay until taken; the session's interpreter went with it.
            assert await wait_until(lambda: not during <= set(child_pids(base.pid)), 10), during


# A call that runs longer than the idle time of the two tests below (seconds).
LONGER_THAN_IDLE = "import time\ntime.sleep(5)\nx = 'after'\nx"


async def test_a_call_longer_than_the_idle_time_keeps_its_streamable_http_session(tmp_path):
    """The idle time counts from the last request's end: a session whose call runs past it
    gets the result, keeps its state, and expires once idle after it."""
    with http_server("streamable_http", "--stateful", "--session-idle-timeout", "2",
                     stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=120) as http:
            h = await start_session(http, base)
            r = await http.post(f"{base}/mcp", json=call_message(2, LONGER_THAN_IDLE), headers=h)
            assert return_value(rpc_result(r)["result"]["content"][0]["text"]) == "after", r.text
            r = await http.post(f"{base}/mcp", json=call_message(3, "x"), headers=h)
            assert return_value(rpc_result(r)["result"]["content"][0]["text"]) == "after", r.text
            await asyncio.sleep(5)
            r = await http.post(f"{base}/mcp", json=call_message(4, "x"), headers=h)
            assert r.status_code == 404, r.text


async def test_a_call_longer_than_the_idle_time_keeps_its_sse_session(tmp_path):
    """The same over the legacy SSE transport, where the idle time counts messages either way:
    a call in flight is no idle time."""
    with http_server("sse", "--stateful", "--session-idle-timeout", "2",
                     stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=120) as http:
            async with sse_session_by_hand(http, base) as (endpoint, events):
                r = await http.post(endpoint, json=call_message(2, LONGER_THAN_IDLE))
                assert r.status_code == 202, r.text
                answer = await sse_message(events, 2)
                assert answer, "the stream ended before the call's result"
                assert return_value(answer["result"]["content"][0]["text"]) == "after", answer
                async with asyncio.timeout(30):
                    async for _ in events:
                        pass
            r = await http.post(endpoint, json=call_message(3, "x"))
            assert r.status_code == 404, r.text


@pytest.mark.parametrize("args", [
    ["stdio", "--stateful", "--isolation", "call"],
    ["stdio", "--stateful", "--isolation", "shared"],
])
def test_stateful_needs_sessions_with_interpreters_of_their_own(args):
    done = subprocess.run([BINARY, *args, "--cache-dir", SHARED_CACHE], env=server_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--stateful" in done.stderr, done.stderr


# A 2x2 PNG made with zlib and struct only (no native package), written to the working
# directory, and its bytes returned as the call's value for comparison.
PNG_CODE = r'''
import struct, zlib
def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
raw = b"".join(b"\x00" + bytes([255, 0, 0] * 2) for _ in range(2))
png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
with open("plot.png", "wb") as f:
    f.write(png)
with open("notes.txt", "w") as f:
    f.write("not an image")
png.hex()
'''


def split_content(result):
    """A result's text, its `image` items and its `resource_link` items (in that order)."""
    text, *rest = result.content
    assert text.type == "text", result.content
    images = [c for c in rest if c.type == "image"]
    links = [c for c in rest if c.type == "resource_link"]
    assert rest == images + links, result.content
    return text.text, images, links


async def test_an_image_the_code_writes_comes_back_as_image_content():
    async with mcp_session("--stateful") as session:
        result = await session.call_tool("run_python_code", {"python_code": PNG_CODE})
        text, images, links = split_content(result)
        png = bytes.fromhex(return_value(text))
        assert [(i.type, i.mimeType) for i in images] == [("image", "image/png")], result.content
        assert base64.b64decode(images[0].data) == png
        # The text is the drop-in's; an unchanged image is not sent again; a rewritten one is.
        assert re.match(r"<status>success</status>\n<sandbox_id>sbx_[\w-]{22}</sandbox_id>\n<return_value>\n", text), text
        again = await session.call_tool("run_python_code", {"python_code": "1"})
        assert len(again.content) == 1, again.content
        # Over the cap, or a file whose bytes are not an image: no image (a link only).
        fake = await session.call_tool("run_python_code", {"python_code": "open('fake.png', 'w').write('hello')"})
        assert split_content(fake)[1] == [], fake.content
    async with mcp_session("--stateful", "--max-image-bytes", "10") as session:
        result = await session.call_tool("run_python_code", {"python_code": PNG_CODE})
        assert split_content(result)[1] == [], result.content


async def test_files_a_call_writes_are_linked_in_its_result():
    async with mcp_session("--stateful") as session:
        result = await session.call_tool("run_python_code", {"python_code": PNG_CODE})
        text, images, links = split_content(result)
        assert [(l.name, l.mimeType, l.size) for l in links] == [
            ("notes.txt", "text/plain", len("not an image")),
            ("plot.png", "image/png", len(bytes.fromhex(return_value(text)))),
        ], links
        got = await session.read_resource(links[0].uri)
        assert got.contents[0].text == "not an image"
        # Only what the call itself created or changed is linked.
        result = await session.call_tool("run_python_code", {"python_code": "open('notes.txt', 'a').write('!')\n"
                                                                            "open('new.csv', 'w').write('a,b')"})
        assert [l.name for l in split_content(result)[2]] == ["new.csv", "notes.txt"], result.content
        assert len((await session.call_tool("run_python_code", {"python_code": "open('notes.txt').read()"})).content) == 1


CSV = "city,temp\nOslo,3\nRome,17\n"


# Code that writes through a shared memory map, and the map's flush (msync).
MMAP_CODE = """import mmap
with open('m.bin', 'w+b') as f:
    f.write(b'0000')
    f.flush()
    m = mmap.mmap(f.fileno(), 4)
    m[:2] = b'xy'
    m.flush()
    m.close()
"""


async def test_every_kind_of_file_change_is_seen():
    """The working directory is listed again only after a file may have changed
    (runtime/js/runner.js `filesChanged`): every kind of change, by the code or by an upload
    between calls, is still in the call's links and the session's resources."""
    async with mcp_session("--stateful") as session:
        async def linked(code):
            result = await session.call_tool("run_python_code", {"python_code": code})
            text, _, links = split_content(result)
            assert status_of(text) == "success", text
            return [link.name for link in links]

        async def listed():
            return {r.name: r.size for r in (await session.list_resources()).resources}

        assert await linked("open('a.txt', 'w').write('abc')") == ["a.txt"]
        assert await linked("x = 1") == []
        assert await listed() == {"a.txt": 3}
        assert await linked("import os\nos.rename('a.txt', 'b.txt')") == ["b.txt"]
        assert await linked("import os\nos.truncate('b.txt', 1)") == ["b.txt"]
        assert await listed() == {"b.txt": 1}
        assert await linked("import os\nos.utime('b.txt', (0, 0))") == ["b.txt"]
        assert await linked("import os\nos.makedirs('d/e')\nopen('d/e/f.bin', 'wb').write(b'12')") == ["d/e/f.bin"]
        assert await linked(MMAP_CODE) == ["m.bin"]
        assert await linked("import os\nos.remove('b.txt')") == []
        assert await listed() == {"d/e/f.bin": 2, "m.bin": 4}
        assert await linked("import shutil\nshutil.rmtree('d')") == []
        assert await listed() == {"m.bin": 4}
        # An upload between calls: the next call, which changes nothing, keeps it listed.
        done = await session.call_tool("upload_file", {"name": "up.txt", "text": "hello"})
        assert not done.isError, done
        assert await linked("open('up.txt').read()") == []
        assert await listed() == {"m.bin": 4, "up.txt": 5}
        assert await linked("open('m.bin', 'rb').read()") == []
        assert await listed() == {"m.bin": 4, "up.txt": 5}


async def test_files_are_the_sessions_resources():
    """A written CSV is listed and read back byte for byte; a binary file comes back as a blob;
    the list's changes are notified; the template describes the URIs; a path out of the
    working directory names nothing."""
    changed = []

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ResourceListChangedNotification):
            changed.append(message.root)

    params = StdioServerParameters(command=BINARY, args=["stdio", "--stateful", "--cache-dir", SHARED_CACHE],
                                   env=server_env())
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
            init = await session.initialize()
            assert init.capabilities.resources is not None and init.capabilities.resources.listChanged
            assert (await session.list_resources()).resources == []
            await run(session, f"open('data.csv', 'w').write({CSV!r})\nimport os\nos.makedirs('out', exist_ok=True)\n"
                               "open('out/raw.bin', 'wb').write(bytes(range(256)))")
            assert await wait_until(lambda: changed, 10), "no resources/list_changed notification"
            listed = {r.name: r for r in (await session.list_resources()).resources}
            assert set(listed) == {"data.csv", "out/raw.bin"}, listed
            assert listed["data.csv"].mimeType == "text/csv" and listed["data.csv"].size == len(CSV)
            got = await session.read_resource(listed["data.csv"].uri)
            assert got.contents[0].text == CSV
            got = await session.read_resource(listed["out/raw.bin"].uri)
            assert base64.b64decode(got.contents[0].blob) == bytes(range(256))
            templates = (await session.list_resource_templates()).resourceTemplates
            assert [t.uriTemplate for t in templates] == ["sandbox://{sandbox_id}/{+path}"]
            sandbox = str(listed["data.csv"].uri).split("/")[2]
            for bad in (f"sandbox://{sandbox}/../etc/passwd", f"sandbox://{sandbox}/nope.txt",
                        f"sandbox://{UNKNOWN}/data.csv", "session://someone-else/data.csv"):
                with pytest.raises(McpError, match="not found"):
                    await session.read_resource(bad)
            with pytest.raises(McpError, match="no such file"):
                await session.read_resource(f"sandbox://{sandbox}/nope.txt")
            # Reading waits for nothing and changes nothing; a call that changes no file
            # notifies nothing.
            count = len(changed)
            await run(session, "1")
            assert len(changed) == count


async def test_one_session_cannot_find_anothers_files(tmp_path):
    """A session lists its own sandbox's files only. A file's URI carries its sandbox's handle,
    a bearer capability (SEP-2567) of 128 random bits: without it nothing is found."""
    with http_server("streamable_http", "--stateful", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            await run(a, "open('secret.txt', 'w').write('A only')")
            (resource,) = (await a.list_resources()).resources
            assert (await a.read_resource(resource.uri)).contents[0].text == "A only"
            assert (await b.list_resources()).resources == []
            with pytest.raises(McpError, match="not found"):
                await b.read_resource(f"sandbox://{UNKNOWN}/secret.txt")


async def test_uploaded_files_are_read_by_the_code_and_names_stay_inside():
    async with mcp_session("--stateful") as session:
        names = [t.name for t in (await session.list_tools()).tools]
        assert set(names) == SANDBOX_TOOLS
        done = await session.call_tool("upload_file", {"name": "in/data.csv", "text": CSV})
        assert not done.isError and "wrote in/data.csv" in done.content[0].text, done
        done = await session.call_tool("upload_file", {"name": "raw.bin", "base64": base64.b64encode(b"\0\1\2").decode()})
        assert not done.isError, done
        text = await run(session, "import csv\nrows = list(csv.DictReader(open('in/data.csv')))\n"
                                  "[r['city'] for r in rows if int(r['temp']) > 10], open('raw.bin', 'rb').read().hex()")
        assert return_value(text) == '[\n  [\n    "Rome"\n  ],\n  "000102"\n]', text
        assert {r.name for r in (await session.list_resources()).resources} == {"in/data.csv", "raw.bin"}
        for bad in ("../escape.txt", "/etc/passwd", "a/../../b", "nul\0name", "x" * 300, ""):
            refused = await session.call_tool("upload_file", {"name": bad, "text": "no"})
            assert refused.isError, (bad, refused)
        with pytest.raises(McpError, match="exactly one"):
            await session.call_tool("upload_file", {"name": "both.txt", "text": "a", "base64": "YQ=="})
        done = await session.call_tool("delete_file", {"name": "raw.bin"})
        assert not done.isError and "deleted raw.bin" in done.content[0].text, done
        missing = await session.call_tool("delete_file", {"name": "raw.bin"})
        assert missing.isError and "no such file" in missing.content[0].text, missing
        assert [r.name for r in (await session.list_resources()).resources] == ["in/data.csv"]
        text = await run(session, "import os\nos.path.exists('raw.bin')")
        assert return_value(text) == "false", text


async def test_files_outlive_a_stopped_interpreter():
    """Files (up to --max-session-file-bytes) are kept by the server when the interpreter is
    stopped, and written into the next one, with the Python objects of the last completed call
    (checkpoints, docs/architecture.md §3.4: its checkpoint); the notes say which files."""
    async with forked_session("--stateful", "--timeout", "5", "--max-session-file-bytes", "100000") as session:
        await run(session, f"open('data.csv', 'w').write({CSV!r})\nopen('big.bin', 'wb').write(bytes(200000))\nx = 1")
        done = await session.call_tool("upload_file", {"name": "up.txt", "text": "uploaded"})
        assert not done.isError, done
        text = await run(session, "open('data.csv', 'a').write('late,0\\n')\nwhile True:\n    pass")
        state = state_of(text)
        assert state.startswith("lost:") and "will be in the new interpreter: data.csv, up.txt" in state, text
        assert state.endswith("before they could be copied): big.bin"), text
        # Between interpreters, the resources are the kept copies.
        listed = {r.name: r for r in (await session.list_resources()).resources}
        assert set(listed) == {"data.csv", "up.txt"}, listed
        assert (await session.read_resource(listed["data.csv"].uri)).contents[0].text == CSV
        # The file as the last completed call left it, and the globals.
        text = await run(session, "open('data.csv').read(), open('up.txt').read(), 'x' in globals()")
        assert state_of(text).startswith("restored:") and state_of(text).endswith("restored: data.csv, up.txt"), text
        assert json.loads(return_value(text)) == [CSV, "uploaded", True], text
        # An upload into a stopped session's new interpreter restores the files and the state
        # too, and its next call still hears that the interpreter is new.
        await run(session, "while True:\n    pass")
        done = await session.call_tool("upload_file", {"name": "more.txt", "text": "more"})
        assert not done.isError, done
        text = await run(session, "sorted(__import__('os').listdir('.'))")
        assert state_of(text).startswith("restored:"), text
        assert json.loads(return_value(text)) == ["data.csv", "more.txt", "up.txt"], text


async def test_files_count_against_the_memory_limit(tmp_path):
    """Files live in the interpreter's memory: a session that writes past --memory gets a
    MemoryError and loses its interpreter; another session's state and files are untouched."""
    with http_server("streamable_http", "--stateful", "--memory", "600", "--timeout", "60",
                     stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            await run(b, "kept = 'B'\nopen('b.txt', 'w').write('B only')")
            text = await run(a, "for i in range(100):\n    open(f'f{i}.bin', 'wb').write(bytes(20 << 20))")
            assert status_of(text) == "run-error" and "MemoryError" in text and "memory limit" in text, text
            assert state_of(text).startswith("lost:"), text
            assert return_value(await run(a, "1 + 1")) == "2"
            assert return_value(await run(b, "kept, open('b.txt').read()")) == '[\n  "B",\n  "B only"\n]'
            assert [r.name for r in (await b.list_resources()).resources] == ["b.txt"]


# matplotlib is not on PyPI for Pyodide (only at the Pyodide CDN, which tests cannot reach), so
# this stand-in has the part of `matplotlib.pyplot` the server uses: get_fignums, figure(n),
# Figure.savefig(path, format="png") and close("all"). Each figure saves a 1x1 PNG.
PYPLOT_STANDIN = r'''
import struct, zlib
_open = {}

class Figure:
    def __init__(self, number):
        self.number = number

    def savefig(self, path, format=None):
        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
        raw = b"\x00" + bytes([self.number, 0, 0])
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

def figure(num=None):
    num = num if num is not None else max(_open, default=0) + 1
    return _open.setdefault(num, Figure(num))

def get_fignums():
    return sorted(_open)

def close(which="all"):
    _open.clear()

def show():
    pass
'''


async def test_open_matplotlib_figures_come_back_as_images():
    async with mcp_session("--stateful") as session:
        backend = await run(session, "import os, sys\n"
                                     "name = os.environ['MPLBACKEND'].removeprefix('module://')\n"
                                     "[name, any(os.path.exists(f'{p}/{name}.py') for p in sys.path if p)]")
        assert json.loads(return_value(backend)) == ["_mcp_matplotlib_backend", True], backend
        for name, text in (("matplotlib/__init__.py", ""), ("matplotlib/pyplot.py", PYPLOT_STANDIN)):
            done = await session.call_tool("upload_file", {"name": name, "text": text})
            assert not done.isError, done
        result = await session.call_tool("run_python_code", {"python_code": (
            "import matplotlib.pyplot as plt\nplt.figure()\nplt.figure()\nplt.show()")})
        text, images, links = split_content(result)
        assert status_of(text) == "success", text
        assert [i.mimeType for i in images] == ["image/png", "image/png"], result.content
        assert [l.name for l in links] == ["figure_2_1.png", "figure_2_2.png"], links
        # The figures were closed: the next call returns none.
        again = await session.call_tool("run_python_code", {"python_code": "plt.get_fignums()"})
        assert return_value(again.content[0].text) == "[]" and len(again.content) == 1, again.content
