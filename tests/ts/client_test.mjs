// The official TypeScript MCP SDK client (@modelcontextprotocol/sdk, pinned in package.json)
// against the real binary: over stdio, and over streamable HTTP with and without sessions, each
// served by a server this script starts on a free loopback port. Exits non-zero on any failure.
//
//   MCP_RUN_PYTHON_BIN=target/debug/mcp-run-python node tests/ts/client_test.mjs

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { BINARY, CACHE, runtimeDir, serverEnv, withHttpServer } from '../shared/real_binary.mjs';

// Generous: the first worker boot of a debug build without a snapshot takes 10-15 s.
const INIT_TIMEOUT_MS = 60_000;
const CALL_TIMEOUT_MS = 300_000;

const TOOL = 'run_python_code';
const CODE = "print('hi')\n[1, 2]";
const EXPECTED = '<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n[\n  1,\n  2\n]\n</return_value>';

// This run's own runtime directory (0700), where the servers find or start their zygote service;
// every service there is stopped at the end, even after a failure.
const RUNTIME_DIR = runtimeDir('mcp-run-python-ts-runtime-');

/** Initialize (done by `connect`), list the tool, call it with good and failing code. */
async function exercise(client) {
  const server = client.getServerVersion();
  assert.equal(server?.name, 'mcp-run-python');
  assert.ok(client.getServerCapabilities()?.tools, 'the server advertises tools');

  const { tools } = await client.listTools(undefined, { timeout: INIT_TIMEOUT_MS });
  assert.deepEqual(tools.map((t) => t.name), [TOOL]);
  const schema = tools[0].inputSchema;
  assert.equal(schema.type, 'object');
  assert.deepEqual(Object.keys(schema.properties).sort(), ['global_variables', 'python_code']);
  assert.deepEqual(schema.required, ['python_code']);

  let result = await client.callTool({ name: TOOL, arguments: { python_code: CODE } }, undefined, { timeout: CALL_TIMEOUT_MS });
  assert.ok(!result.isError, JSON.stringify(result));
  assert.deepEqual(result.content.map((c) => c.type), ['text']);
  assert.equal(result.content[0].text, EXPECTED);

  result = await client.callTool({ name: TOOL, arguments: { python_code: '1/0' } }, undefined, { timeout: CALL_TIMEOUT_MS });
  assert.deepEqual(result.content.map((c) => c.type), ['text']);
  assert.ok(result.content[0].text.startsWith('<status>run-error</status>'), result.content[0].text);
}

function newClient() {
  return new Client({ name: 'mcp-run-python-ts-test', version: '1.0.0' });
}

async function overStdio() {
  const transport = new StdioClientTransport({
    command: BINARY,
    args: ['stdio', '--workers', '1', '--cache-dir', CACHE],
    env: serverEnv(RUNTIME_DIR),
    stderr: 'inherit',
  });
  const client = newClient();
  await client.connect(transport, { timeout: INIT_TIMEOUT_MS });
  try {
    await exercise(client);
  } finally {
    await client.close();
  }
}

async function overStreamableHttp(mode) {
  await withHttpServer(mode, [], RUNTIME_DIR, async (url) => {
    const transport = new StreamableHTTPClientTransport(new URL(url));
    const client = newClient();
    await client.connect(transport, { timeout: INIT_TIMEOUT_MS });
    try {
      assert.equal(transport.protocolVersion, '2025-11-25');
      await exercise(client);
      // What a well-behaved client does at the end: DELETE the session (a no-op without one).
      await transport.terminateSession();
    } finally {
      await client.close();
    }
  });
}

/** `--stateful` (sandboxes, docs/architecture.md §3.1): a sandbox made by one client keeps its state for another session
 * that holds its handle; the SDK validates every structured result against the tool's output
 * schema; a destroyed handle is a tool error. */
async function sandboxes() {
  await withHttpServer('streamable-http', ['--stateful'], RUNTIME_DIR, async (url) => {
    const connect = async () => {
      const client = newClient();
      await client.connect(new StreamableHTTPClientTransport(new URL(url)), { timeout: INIT_TIMEOUT_MS });
      // Listing caches the output schemas, which callTool then validates results against.
      const { tools } = await client.listTools(undefined, { timeout: INIT_TIMEOUT_MS });
      assert.equal(tools.find((t) => t.name === TOOL).inputSchema.properties.sandbox_id['x-mcp-header'], 'Sandbox-Id');
      return client;
    };
    const call = (client, name, args) => client.callTool({ name, arguments: args }, undefined, { timeout: CALL_TIMEOUT_MS });
    const first = await connect();
    const second = await connect();
    try {
      const made = await call(first, 'create_sandbox', {});
      const sandbox = made.structuredContent.sandbox_id;
      assert.match(sandbox, /^sbx_[A-Za-z0-9_-]{22}$/);
      let result = await call(first, TOOL, { python_code: 'x = 41', sandbox_id: sandbox });
      assert.equal(result.structuredContent.sandbox_id, sandbox);
      result = await call(second, TOOL, { python_code: 'x + 1', sandbox_id: sandbox });
      assert.equal(result.structuredContent.return_value, 42, JSON.stringify(result));
      assert.ok(result.content[0].text.includes(`<sandbox_id>${sandbox}</sandbox_id>`), result.content[0].text);
      await call(second, 'destroy_sandbox', { sandbox_id: sandbox });
      result = await call(first, TOOL, { python_code: 'x', sandbox_id: sandbox });
      assert.ok(result.isError && result.content[0].text.includes('does not exist or has expired'), JSON.stringify(result));
    } finally {
      await first.close();
      await second.close();
    }
  });
}

const cases = [
  ['stdio', overStdio],
  ['streamable-http', () => overStreamableHttp('streamable-http')],
  ['streamable-http-stateless', () => overStreamableHttp('streamable-http-stateless')],
  ['streamable-http --stateful sandboxes', sandboxes],
];

// A stuck client or server fails the run instead of hanging it.
const watchdog = setTimeout(() => {
  console.error('client_test.mjs: timed out');
  process.exit(1);
}, 10 * 60_000);
watchdog.unref();

let passed = 0;
let failed = 0;
for (const [name, run] of cases) {
  const started = Date.now();
  try {
    await run();
    passed += 1;
    console.log(`ok ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  } catch (error) {
    failed += 1;
    console.error(`FAILED ${name}:`, error);
  }
}
const stopped = spawnSync(BINARY, ['zygote', 'stop', '--cache-dir', CACHE], { env: serverEnv(RUNTIME_DIR), encoding: 'utf8' });
if (stopped.status !== 0) {
  failed += 1;
  console.error('FAILED stopping the zygote services:', stopped.stdout, stopped.stderr);
}
fs.rmSync(RUNTIME_DIR, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
