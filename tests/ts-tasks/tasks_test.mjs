// The official TypeScript tasks client (@modelcontextprotocol/ext-tasks, on the v2 SDK client
// @modelcontextprotocol/client; both pinned in package.json) against the real binary over
// streamable HTTP at protocol revision 2026-07-28: a long `run_python_code` becomes a task that
// settles with its result, a task is cancelled through ext-tasks, and a quick call answers at
// once. Exits non-zero on any failure.
//
//   MCP_RUN_PYTHON_BIN=target/debug/mcp-run-python node tests/ts-tasks/tasks_test.mjs

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient, resultFromTaskOutcome } from '@modelcontextprotocol/ext-tasks/client';

import { BINARY, CACHE, runtimeDir, serverEnv, withHttpServer } from '../shared/real_binary.mjs';

// Generous: the first worker boot of a debug build without a snapshot takes 10-15 s.
const START_TIMEOUT_MS = 60_000;
const CALL_TIMEOUT_MS = 120_000;

const PROTOCOL_VERSION = '2026-07-28';
const TASKS = 'io.modelcontextprotocol/tasks';
const TOOL = 'run_python_code';
const CLIENT_INFO = { name: 'mcp-run-python-ts-tasks-test', version: '1.0.0' };
const CLIENT_CAPABILITIES = {};

// This run's own runtime directory (0700), where the server finds or starts its zygote service;
// the service there is stopped at the end, even after a failure.
const RUNTIME_DIR = runtimeDir('mcp-run-python-ts-tasks-runtime-');

// The server while it runs, so that even a crash of this script (an exception nothing catches,
// the watchdog) kills it and stops the zygote service on the way out.
let liveServer = null;
let cleanedUp = false;

function stopZygoteService() {
  return spawnSync(BINARY, ['zygote', 'stop', '--cache-dir', CACHE], { env: serverEnv(RUNTIME_DIR), encoding: 'utf8' });
}

process.on('exit', () => {
  if (cleanedUp) return;
  liveServer?.kill('SIGKILL');
  stopZygoteService();
  fs.rmSync(RUNTIME_DIR, { recursive: true, force: true });
});

/** Runs `body(url)` against `mcp-run-python streamable-http` with the two limits, kept in
 * `liveServer` while it runs so that a crash of this script still kills it. */
function withServer(body) {
  const limits = ['--timeout', '2', '--task-timeout', '120'];
  return withHttpServer('streamable-http', limits, RUNTIME_DIR, body, (proc) => {
    liveServer = proc;
    proc.once('exit', () => { liveServer = null; });
  });
}

/**
 * The host request coordinator ext-tasks needs for a 2026-07-28 Tasks server (`rawDispatch`):
 * the SDK client's own request path decodes only `complete` and `input_required` results, so a
 * `tools/call` answered with `resultType: "task"` and the `tasks/*` requests go through this
 * instead. It owns its request ids (strings, `raw:N`) and matches each response to its request;
 * it sends over an SDK streamable HTTP transport of its own, which puts the SEP-2243 headers
 * (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) on each POST from the request's `_meta`
 * and body. Requests that the adapter frames already carry the 2026-07-28 `_meta` envelope.
 */
class RawCoordinator {
  constructor(url) {
    // What each POST carried: its JSON-RPC method, its `Mcp-Name` header and its body's taskId.
    this.sent = [];
    const recordingFetch = (input, init) => {
      const body = typeof init?.body === 'string' ? JSON.parse(init.body) : {};
      const mcpName = new Headers(init?.headers).get('mcp-name');
      this.sent.push({ method: body.method, mcpName, taskId: body.params?.taskId });
      return fetch(input, init);
    };
    this.transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch });
    this.pending = new Map();
    this.nextId = 0;
    this.transport.onmessage = (message) => {
      if (!('id' in message) || !this.pending.has(message.id)) return;
      if (!('result' in message) && !('error' in message)) return;
      const settle = this.pending.get(message.id);
      this.pending.delete(message.id);
      settle.resolve('error' in message
        ? { kind: 'error', error: message.error }
        : { kind: 'result', result: message.result });
    };
    this.transport.onerror = () => {};
    this.dispatch = this.dispatch.bind(this);
  }

  async start() {
    await this.transport.start();
  }

  async close() {
    for (const settle of this.pending.values()) settle.reject(new Error('the coordinator closed'));
    this.pending.clear();
    await this.transport.close();
  }

  /** `RawClientDispatch`: one JSON-RPC request to its response (`{kind: 'result' | 'error'}`). */
  async dispatch(request, options = {}) {
    const id = `raw:${++this.nextId}`;
    const timeoutMs = options.context?.requestTimeoutMs ?? CALL_TIMEOUT_MS;
    const answer = new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
    // It may be rejected (timeout, abort, close) while the POST is still being sent.
    answer.catch(() => {});
    const timer = setTimeout(() => {
      this.pending.get(id)?.reject(new Error(`${request.method} timed out after ${timeoutMs} ms`));
      this.pending.delete(id);
    }, timeoutMs);
    const onAbort = () => {
      this.pending.get(id)?.reject(options.signal.reason ?? new Error('aborted'));
      this.pending.delete(id);
    };
    options.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      await this.transport.send({ jsonrpc: '2.0', id, ...request }, {
        headers: options.context?.headers,
        requestSignal: options.signal,
      });
      return await answer;
    } catch (error) {
      this.pending.delete(id);
      throw error;
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
    }
  }
}

/** A v2 SDK client connected at 2026-07-28, its raw coordinator and an ext-tasks session. */
async function connect(url) {
  const client = new Client(CLIENT_INFO, {
    capabilities: CLIENT_CAPABILITIES,
    versionNegotiation: { mode: { pin: PROTOCOL_VERSION } },
  });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)), { timeout: START_TIMEOUT_MS });
  assert.equal(client.getProtocolEra(), 'modern');
  assert.equal(client.getNegotiatedProtocolVersion(), PROTOCOL_VERSION);
  assert.deepEqual(client.getServerCapabilities()?.extensions?.[TASKS], {}, 'the server offers the tasks extension');
  const raw = new RawCoordinator(url);
  await raw.start();
  const session = createTaskSessionFromClient(client, {
    endpointId: url,
    rawDispatch: raw.dispatch,
    v2RequestFraming: {
      protocolVersion: PROTOCOL_VERSION,
      clientInfo: CLIENT_INFO,
      clientCapabilities: CLIENT_CAPABILITIES,
    },
    onError: (error) => console.error('ext-tasks background error:', error),
  });
  // Only a V2 (2026-07-28) task session takes input responses and cancels without a capability.
  assert.deepEqual(session.capabilities, {
    inventory: 'known-handles', execution: true, cancellation: true, inputResponses: true, requestedRetention: false,
  });
  return {
    session,
    raw,
    async close() {
      await session.close();
      await raw.close();
      await client.close();
    },
  };
}

function text(result) {
  assert.ok(Array.isArray(result?.content), JSON.stringify(result));
  return result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');
}

/** The `tasks/*` requests ext-tasks sent for `taskId`, each named in `Mcp-Name` as the extension
 * asks of clients over streamable HTTP (the server does not have to fill it in). */
function tasksRequestsOf(raw, taskId) {
  const sent = raw.sent.filter((r) => r.method?.startsWith('tasks/') && r.taskId === taskId);
  for (const r of sent) assert.equal(r.mcpName, taskId, `${r.method} names its task in Mcp-Name`);
  return sent.map((r) => r.method);
}

/** A call of ~6 s is task-backed and settles completed with its result. */
async function longCallSettles(session, raw) {
  const code = 'import time\ntime.sleep(6)\n"slept " + str(6 * 7)';
  const execution = await session.callTool(TOOL, { python_code: code }, { requestTimeoutMs: CALL_TIMEOUT_MS });
  assert.equal(execution.kind, 'task', `a ~6 s call is task-backed, not ${execution.kind}`);
  assert.match(execution.handle.taskId, /^task_[0-9a-f]{32}$/);
  const { outcome } = await execution.settle();
  assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
  const body = text(resultFromTaskOutcome(outcome));
  assert.ok(body.includes('<status>success</status>'), body);
  assert.ok(body.includes('slept 42'), body);
  const polls = tasksRequestsOf(raw, execution.handle.taskId);
  assert.ok(polls.length >= 2 && polls.every((m) => m === 'tasks/get'), polls.join(', '));
}

/** A long task cancelled through ext-tasks ends cancelled (and the server says so too). */
async function longCallCancelled(session, raw) {
  const code = 'import time\ntime.sleep(60)\n"never"';
  const started = Date.now();
  const execution = await session.callTool(TOOL, { python_code: code }, { requestTimeoutMs: CALL_TIMEOUT_MS });
  assert.equal(execution.kind, 'task', `a 60 s call is task-backed, not ${execution.kind}`);
  await execution.cancel();
  const { outcome } = await execution.settle();
  assert.equal(outcome.status, 'cancelled', JSON.stringify(outcome));
  // The server's own view, through ext-tasks' stand-alone task controller.
  const seen = await session.task(execution.handle.taskId).snapshot();
  assert.equal(seen.status, 'cancelled', JSON.stringify(seen));
  assert.ok(Date.now() - started < 30_000, 'cancelling did not wait for the code');
  assert.ok(tasksRequestsOf(raw, execution.handle.taskId).includes('tasks/cancel'));
}

/** A quick call answers at once: no task. */
async function quickCall(session) {
  const execution = await session.callTool(TOOL, { python_code: '1+1' }, { requestTimeoutMs: CALL_TIMEOUT_MS });
  assert.equal(execution.kind, 'immediate', `a quick call answers at once, not as a ${execution.kind}`);
  const { outcome } = await execution.settle();
  assert.equal(outcome.status, 'completed', JSON.stringify(outcome));
  const body = text(resultFromTaskOutcome(outcome));
  assert.ok(body.includes('<return_value>\n2\n</return_value>'), body);
}

// In this order: with `--workers 1`, the quick call comes when the interpreter booted during the
// long call is ready; right after a cancelled task it would wait for a new one to boot (~2 s),
// longer than the second after which a call becomes a task.
const cases = [
  ['a long call is a task that settles with its result', longCallSettles],
  ['a quick call settles at once with its result', quickCall],
  ['a task cancelled through ext-tasks ends cancelled', longCallCancelled],
];

// A stuck client or server fails the run instead of hanging it.
const watchdog = setTimeout(() => {
  console.error('tasks_test.mjs: timed out');
  process.exit(1);
}, 5 * 60_000);
watchdog.unref();

let passed = 0;
let failed = 0;
try {
  await withServer(async (url) => {
    const connection = await connect(url);
    try {
      for (const [name, run] of cases) {
        const started = Date.now();
        try {
          await run(connection.session, connection.raw);
          passed += 1;
          console.log(`ok ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
        } catch (error) {
          failed += 1;
          console.error(`FAILED ${name}:`, error);
        }
      }
    } finally {
      await connection.close();
    }
  });
} catch (error) {
  failed += 1;
  console.error('FAILED:', error);
} finally {
  const stopped = stopZygoteService();
  if (stopped.status !== 0) {
    failed += 1;
    console.error('FAILED stopping the zygote service:', stopped.stdout, stopped.stderr);
  }
  fs.rmSync(RUNTIME_DIR, { recursive: true, force: true });
  cleanedUp = true;
}
console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
