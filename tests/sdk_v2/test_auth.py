"""Authentication (README "Running many replicas"): the server as an OAuth 2.1 resource server (MCP spec 2025-11-25,
authorization). The tests make their own RSA key, publish its public half as a JWK set file
(`--auth-jwks`) and mint tokens with it: a request without a token, with an expired one, one for
another audience or one signed by another key gets 401 with `WWW-Authenticate` naming the
protected resource metadata (RFC 9728), which is served; a sandbox belongs to the principal that
made it, and another token's call with its handle gets the same "does not exist" answer as an
unknown handle. `--auth-token-file` accepts one static token."""

import json
import time
import urllib.error
import urllib.request

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.shared.exceptions import MCPError

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, http_server

pytestmark = pytest.mark.anyio

AUDIENCE = "https://mcp.test/mcp"
ISSUER = "https://issuer.test"
KID = "test-key"
GONE = "does not exist or has expired"
# Seconds a test token lives (and how long ago an expired one ended).
TOKEN_LIFETIME = 600
METADATA = "/.well-known/oauth-protected-resource"


def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key():
    return rsa_key()


@pytest.fixture(scope="module")
def jwks_file(key, tmp_path_factory):
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    public.update({"kid": KID, "alg": "RS256", "use": "sig"})
    path = tmp_path_factory.mktemp("keys") / "jwks.json"
    path.write_text(json.dumps({"keys": [public]}))
    return path


def token(key, sub, audience=AUDIENCE, expires_in=TOKEN_LIFETIME, kid=KID):
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": sub, "aud": audience, "iat": now, "exp": now + expires_in}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


@pytest.fixture(scope="module")
def server(jwks_file):
    with http_server("streamable-http", "--stateful", "--workers", "1", "--auth-jwks", str(jwks_file),
                     "--auth-audience", AUDIENCE, "--auth-server", ISSUER) as base:
        yield base


def post(base, bearer=None):
    """(status, headers, body) of an `initialize` POST with `bearer`."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if bearer:
        headers["Authorization"] = f"Bearer {bearer}"
    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                          "clientInfo": {"name": "raw", "version": "1"}}}
    request = urllib.request.Request(f"{base}/mcp", data=json.dumps(message).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def client_for(base, bearer):
    transport = StreamableHttpTransport(f"{base}/mcp", headers={"Authorization": f"Bearer {bearer}"})
    return Client(transport, init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def test_requests_without_a_valid_token_get_401_naming_the_metadata(server, key):
    metadata_url = f"{server}{METADATA}"
    for bearer, invalid in [(None, False), (token(key, "alice", expires_in=-TOKEN_LIFETIME), True),
                            (token(key, "alice", audience="https://other.test/mcp"), True),
                            (token(rsa_key(), "alice"), True), (token(key, "alice", kid="unknown"), True),
                            ("not-a-jwt", True)]:
        status, headers, body = post(server, bearer)
        assert status == 401, (bearer, body)
        challenge = headers["WWW-Authenticate"]
        assert challenge.startswith(f'Bearer resource_metadata="{metadata_url}"'), challenge
        assert ('error="invalid_token"' in challenge) == invalid, challenge
        assert json.loads(body)["error"]["message"].startswith("Unauthorized"), body
    assert post(server, token(key, "alice"))[0] == 200
    with urllib.request.urlopen(metadata_url, timeout=CALL_TIMEOUT) as r:
        metadata = json.loads(r.read())
    assert metadata == {"resource": f"{server}/mcp", "authorization_servers": [ISSUER],
                        "bearer_methods_supported": ["header"]}
    # The probes need no token.
    with urllib.request.urlopen(f"{server}/healthz", timeout=CALL_TIMEOUT) as r:
        assert r.status == 200


async def test_a_sandbox_belongs_to_the_principal_that_made_it(server, key):
    async with client_for(server, token(key, "alice")) as alice, client_for(server, token(key, "bob")) as bob:
        await alice.list_tools()
        await bob.list_tools()
        sandbox = (await alice.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await alice.call_tool(TOOL, {"python_code": "secret = 'alice'\nopen('a.txt', 'w').write('a')",
                                     "sandbox_id": sandbox})
        stolen = await bob.call_tool(TOOL, {"python_code": "secret", "sandbox_id": sandbox}, raise_on_error=False)
        unknown = await bob.call_tool(TOOL, {"python_code": "1", "sandbox_id": "sbx_" + "A" * 22},
                                      raise_on_error=False)
        assert stolen.is_error and unknown.is_error
        words = [r.content[0].text.replace(h[:10], "<id>") for r, h in ((stolen, sandbox), (unknown, "sbx_" + "A" * 22))]
        assert words[0] == words[1] and GONE in words[0], words
        with pytest.raises(MCPError, match=GONE):
            await bob.read_resource(f"sandbox://{sandbox}/a.txt")
        destroyed = await bob.call_tool("destroy_sandbox", {"sandbox_id": sandbox}, raise_on_error=False)
        assert destroyed.is_error and GONE in destroyed.content[0].text
        mine = await alice.call_tool(TOOL, {"python_code": "secret", "sandbox_id": sandbox})
        assert mine.structured_content["return_value"] == "alice"


async def test_another_principals_sandbox_cannot_be_forked(server, key):
    """fork_sandbox (checkpoints, docs/architecture.md §3.4) opens its source as every tool does: bob gets for alice's handle
    the answer of an unknown one, and alice's fork is alice's alone."""
    async with client_for(server, token(key, "alice")) as alice, client_for(server, token(key, "bob")) as bob:
        await alice.list_tools()
        await bob.list_tools()
        sandbox = (await alice.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await alice.call_tool("upload_file", {"name": "a.txt", "text": "alice's", "sandbox_id": sandbox})
        unknown = "sbx_" + "A" * 22
        stolen = await bob.call_tool("fork_sandbox", {"sandbox_id": sandbox}, raise_on_error=False)
        missing = await bob.call_tool("fork_sandbox", {"sandbox_id": unknown}, raise_on_error=False)
        assert stolen.is_error and missing.is_error and stolen.structured_content is None
        words = [r.content[0].text.replace(h[:10], "<id>") for r, h in ((stolen, sandbox), (missing, unknown))]
        assert words[0] == words[1] and GONE in words[0], words
        fork = (await alice.call_tool("fork_sandbox", {"sandbox_id": sandbox})).structured_content["sandbox_id"]
        theirs = await bob.call_tool(TOOL, {"python_code": "open('a.txt').read()", "sandbox_id": fork},
                                     raise_on_error=False)
        assert theirs.is_error and GONE in theirs.content[0].text, theirs
        mine = await alice.call_tool(TOOL, {"python_code": "open('a.txt').read()", "sandbox_id": fork})
        assert mine.structured_content["return_value"] == "alice's", mine


async def test_the_keys_may_come_from_a_url(key, jwks_file):
    """`--auth-jwks` with an http(s) URL: fetched at start from a real local HTTP server."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(jwks_file.parent))
    keys = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=keys.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{keys.server_address[1]}/{jwks_file.name}"
        with http_server("streamable-http", "--auth-jwks", url, "--auth-audience", AUDIENCE) as base:
            assert post(base, token(key, "alice"))[0] == 200
            assert post(base, token(rsa_key(), "alice"))[0] == 401
    finally:
        keys.shutdown()


async def test_a_static_token_from_a_file(tmp_path):
    (tmp_path / "token").write_text("s3cret-static-token\n")
    with http_server("streamable-http", "--auth-token-file", str(tmp_path / "token")) as base:
        assert post(base, "wrong")[0] == 401
        assert post(base)[0] == 401
        assert post(base, "s3cret-static-token")[0] == 200
        async with client_for(base, "s3cret-static-token") as client:
            result = await client.call_tool(TOOL, {"python_code": "6 * 7"})
            assert "42" in result.content[0].text
