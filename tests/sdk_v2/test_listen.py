"""Telling clients that a list changed (README "Long runs: tasks"), with the Python `mcp` 2.x client, whose
`Client.listen()` opens a `subscriptions/listen` stream (MCP 2026-07-28, SEP-2575) and whose
`mode="legacy"` speaks 2025-11-25 (`initialize`, sessions):

- a 2026-07-28 listen stream hears `toolsListChanged` when an upstream server of code mode
  (`--tools-config`, upstream_server.py) adds a tool, which changes `run_python_code`'s
  description; the client's demux routes a notification to the stream only by the
  `subscriptionId` it carries, so hearing it shows the tag;
- a 2025-11-25 session (stateful streamable HTTP, stdio) gets `notifications/tools/list_changed`;
- a listener hears `resourcesListChanged` when its own principal's sandbox's files change and not
  when another principal's do (JWT principals, as in test_auth.py);
- `prompts/list` and `prompts/get` are unknown methods (-32601): the server has no prompts;
- a resource that is not found is named in the error's `data.uri` (SEP-2164);
- a drain (SIGTERM) ends a listen stream with its result rather than cutting it off."""

import contextlib
import json
import os
import secrets
import signal

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourcesListChanged, ToolsListChanged
from mcp_types import ToolListChangedNotification

from conftest import BINARY, CALL_TIMEOUT, SHARED_CACHE, TOOL, http_server, server_env
from test_auth import AUDIENCE, ISSUER, KID, rsa_key, token
from test_code_mode import upstream_server

pytestmark = pytest.mark.anyio

# Seconds a change may take to reach a listener: the upstream's notification, our front's new
# listing of its tools, then ours.
CHANGE_TIMEOUT = 30
# Seconds a listener is watched for a change it must not hear, after one it may hear was told
# to another listener at the same moment.
SILENCE = 2
METHOD_NOT_FOUND = -32601
# A resource that is not found: -32602 (invalid params) from 2026-07-28 on (SEP-2164), -32002
# before.
RESOURCE_NOT_FOUND = {"2026-07-28": -32602, "2025-11-25": -32002}


@pytest.fixture(scope="module")
def tools_config(tmp_path_factory):
    """A `--tools-config` naming one upstream_server.py (its own, so that the tools it grows
    are this module's); yields its path."""
    tmp = tmp_path_factory.mktemp("listen")
    log = tmp / "upstream.jsonl"
    log.touch()
    from test_code_mode import TOKEN

    with upstream_server(log) as upstream_url:
        config = tmp / "tools.json"
        config.write_text(json.dumps({"mcpServers": {"upstream": {
            "url": upstream_url, "headers": {"Authorization": f"Bearer {TOKEN}"},
            "allowedTools": ["sprout", "sprouted_*"],
        }}}))
        yield config


@pytest.fixture(scope="module")
def code_mode_url(tools_config):
    with http_server("streamable-http", "--workers", "1", "--tools-config", str(tools_config)) as base:
        yield f"{base}/mcp"


def new_tool():
    return f"sprouted_{secrets.token_hex(4)}"


async def sprout(client, name):
    """Has code in a sandbox of `client`'s server call the upstream's `sprout`, which adds the
    tool `name` and tells that server (only: FastMCP tells the session that called) that its
    tools changed."""
    code = f"import mcp_tools\nawait mcp_tools.upstream.sprout(name={name!r})"
    result = await client.call_tool(TOOL, {"python_code": code})
    assert f"sprouted {name}" in result.content[0].text, result


async def next_event(subscription, timeout=CHANGE_TIMEOUT):
    with anyio.fail_after(timeout):
        async for event in subscription:
            return event
    raise AssertionError("the listen stream ended")


async def description(client):
    return next(t for t in (await client.list_tools()).tools if t.name == TOOL).description


async def test_a_listen_stream_hears_that_an_upstream_added_a_tool(code_mode_url):
    name = new_tool()
    async with Client(code_mode_url, cache=None) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.tools.list_changed is True
        async with client.listen(tools_list_changed=True, prompts_list_changed=True) as subscription:
            # Only what it can tell of: it has no prompts.
            assert subscription.honored.tools_list_changed is True
            assert not subscription.honored.prompts_list_changed
            assert name not in await description(client)
            await sprout(client, name)
            assert await next_event(subscription) == ToolsListChanged()
        assert f"mcp_tools.upstream.{name}()" in await description(client)


async def test_a_drain_ends_a_listen_stream_with_its_result(tmp_path):
    """SIGTERM: the stream ends gracefully (its `subscriptions/listen` result), not cut off."""
    config = tmp_path / "tools.json"
    config.write_text('{"mcpServers": {}}')
    with http_server("streamable-http", "--workers", "1", "--tools-config", str(config)) as base:
        async with Client(f"{base}/mcp", cache=None) as client, client.listen(tools_list_changed=True) as subscription:
            os.kill(base.pid, signal.SIGTERM)
            with anyio.fail_after(CHANGE_TIMEOUT):
                # SubscriptionLost if it were cut off.
                assert [event async for event in subscription] == []


@contextlib.asynccontextmanager
async def legacy_client(server):
    """A 2025-11-25 client of `server` (a URL or stdio parameters); yields (client, an event set
    at its first `notifications/tools/list_changed`)."""
    heard = anyio.Event()

    async def on_message(message):
        if isinstance(message, ToolListChangedNotification):
            heard.set()

    async with Client(server, mode="legacy", message_handler=on_message, cache=None) as client:
        assert client.protocol_version == "2025-11-25"
        yield client, heard


@pytest.mark.parametrize("transport", ["streamable-http", "stdio"])
async def test_a_2025_session_gets_tools_list_changed(transport, code_mode_url, tools_config):
    name = new_tool()
    stdio = StdioServerParameters(command=BINARY, args=["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE,
                                                        "--tools-config", str(tools_config)], env=server_env())
    async with legacy_client(code_mode_url if transport == "streamable-http" else stdio) as (client, heard):
        assert client.server_capabilities.tools.list_changed is True
        await client.list_tools()
        await sprout(client, name)
        with anyio.fail_after(CHANGE_TIMEOUT):
            await heard.wait()
        assert f"mcp_tools.upstream.{name}()" in await description(client)


@pytest.fixture(scope="module")
def auth_key():
    return rsa_key()


@pytest.fixture(scope="module")
def auth_url(auth_key, tmp_path_factory):
    """`--stateful` with JWT principals (test_auth.py's setup)."""
    public = json.loads(__import__("jwt").algorithms.RSAAlgorithm.to_jwk(auth_key.public_key()))
    public.update({"kid": KID, "alg": "RS256", "use": "sig"})
    jwks = tmp_path_factory.mktemp("keys") / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public]}))
    with http_server("streamable-http", "--stateful", "--workers", "1", "--auth-jwks", str(jwks),
                     "--auth-audience", AUDIENCE, "--auth-server", ISSUER) as base:
        yield f"{base}/mcp"


@contextlib.asynccontextmanager
async def client_as(url, bearer, mode="auto"):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"},
                              timeout=httpx2.Timeout(CALL_TIMEOUT))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
        yield client


async def write_file(client):
    """Makes a sandbox and writes a file in it."""
    created = await client.call_tool("create_sandbox", {})
    sandbox = created.structured_content["sandbox_id"]
    result = await client.call_tool(TOOL, {"python_code": "open('out.txt', 'w').write('x')", "sandbox_id": sandbox})
    assert "<status>success</status>" in result.content[0].text, result


async def test_a_listener_hears_of_its_own_sandboxes_files_only(auth_url, auth_key):
    async with (client_as(auth_url, token(auth_key, "alice")) as alice,
                client_as(auth_url, token(auth_key, "bob")) as bob,
                alice.listen(resources_list_changed=True, tools_list_changed=True) as alice_hears,
                bob.listen(resources_list_changed=True) as bob_hears):
        assert alice.server_capabilities.resources.list_changed is True
        # Without code mode the tool list never changes: not acknowledged.
        assert alice_hears.honored.resources_list_changed is True
        assert not alice_hears.honored.tools_list_changed
        await write_file(bob)
        assert await next_event(bob_hears) == ResourcesListChanged()
        with anyio.move_on_after(SILENCE) as silent:
            await next_event(alice_hears, timeout=SILENCE * 2)
        assert silent.cancelled_caught, "alice heard of bob's sandbox"
        await write_file(alice)
        assert await next_event(alice_hears) == ResourcesListChanged()


@pytest.mark.parametrize("mode", ["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
async def test_prompts_are_unknown_methods(auth_url, auth_key, mode):
    async with client_as(auth_url, token(auth_key, "carol"), mode) as client:
        assert client.server_capabilities.prompts is None
        for ask in (client.list_prompts(), client.get_prompt("anything")):
            with pytest.raises(MCPError) as refused:
                await ask
            assert refused.value.code == METHOD_NOT_FOUND, refused.value


@pytest.mark.parametrize("mode", ["auto", "legacy"], ids=["2026-07-28", "2025-11-25"])
async def test_a_resource_not_found_names_its_uri(auth_url, auth_key, mode):
    async with client_as(auth_url, token(auth_key, "carol"), mode) as client:
        for uri in ("sandbox://sbx_" + "A" * 22 + "/a.txt", "sandbox://not-a-handle/a.txt", "test://nothing-here"):
            with pytest.raises(MCPError) as refused:
                await client.read_resource(uri)
            assert refused.value.code == RESOURCE_NOT_FOUND[client.protocol_version], refused.value
            assert refused.value.data == {"uri": uri}, refused.value
