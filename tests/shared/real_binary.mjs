// Starting the real binary, shared by the two TypeScript client tests: tests/ts (the v1 SDK)
// and tests/ts-tasks (the v2 client with @modelcontextprotocol/ext-tasks). Node's standard
// library only, so that either package imports it by its path; the twin of real_binary.py.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const BINARY = process.env.MCP_RUN_PYTHON_BIN || path.join(ROOT, 'target', 'debug', 'mcp-run-python');
// One download cache (and Pyodide memory snapshot) shared with the Python suites.
export const CACHE = process.env.MCP_RUN_PYTHON_TEST_CACHE || path.join(ROOT, 'target', 'test-cache');
// Milliseconds a server may take to listen, and to stop after SIGTERM.
const START_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 30_000;

/** A run's own runtime directory (0700, like a real one), where its servers find or start their
 * zygote service; the caller stops the services there and removes it at the end. */
export function runtimeDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** The environment of a server of the run whose runtime directory is `runtime`. */
export function serverEnv(runtime) {
  const env = { PATH: process.env.PATH || '/usr/bin:/bin', XDG_RUNTIME_DIR: runtime };
  if (process.env.RUST_LOG) env.RUST_LOG = process.env.RUST_LOG;
  return env;
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

function canConnect(port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    socket.once('connect', () => { socket.destroy(); resolve(true); });
    socket.once('error', () => resolve(false));
  });
}

/** Runs `body(url)` against `mcp-run-python <mode> … args` on a free loopback port, in the run's
 * runtime directory `runtime`; the server is stopped afterwards whatever happened, and must then
 * stop cleanly on SIGTERM. `onStart(proc)` is told of the process as soon as it is spawned. */
export async function withHttpServer(mode, args, runtime, body, onStart = () => {}) {
  const port = await freePort();
  const proc = spawn(BINARY, [mode, '--host', '127.0.0.1', '--port', String(port), '--workers', '1', '--cache-dir', CACHE, ...args], {
    env: serverEnv(runtime),
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  onStart(proc);
  const exited = new Promise((resolve) => {
    proc.once('exit', (code, signal) => resolve({ code, signal }));
    proc.once('error', (error) => resolve({ code: null, signal: null, error }));
  });
  let running = true;
  exited.then(() => { running = false; });
  try {
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (!(await canConnect(port))) {
      if (!running) throw new Error(`${mode} server exited before listening`);
      if (Date.now() > deadline) throw new Error(`${mode} server did not start`);
      await new Promise((r) => setTimeout(r, 100));
    }
    await body(`http://127.0.0.1:${port}/mcp`);
  } finally {
    if (running) proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), STOP_TIMEOUT_MS);
    const { code, signal, error } = await exited;
    clearTimeout(timer);
    if (error) throw error;
    assert.equal(code, 0, `${mode} server exited with ${code ?? signal} after SIGTERM`);
  }
}
