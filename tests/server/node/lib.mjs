// Helpers for the server tests: a client for the server run_node_tests.sh started, and a way to
// start extra servers (with --api-key, a short queue, ...).
import OpenAI from 'openai';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';

export const BASE = process.env.LILY_URL;
if (!BASE) throw new Error('LILY_URL is not set (run the tests through run_node_tests.sh)');

export function client(base = BASE, options = {}) {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000, ...options });
}

export const MODEL = 'test';
// Greedy, so a request's answer is a function of its prompt alone.
export const GREEDY = { model: MODEL, temperature: 0 };

// The trained test model (models/lily-tiny) writes real tool calls; the random-weight fixture cannot.
export async function modelId(base = BASE) {
  const models = await client(base).models.list();
  return models.data[0].id;
}

export async function postJson(path, body, { base = BASE, headers = {} } = {}) {
  const res = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, json, text };
}

// Prometheus text -> { name or name{labels}: number }.
export async function metrics(base = BASE) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Starts `lily serve` on LILY_TEST_MODEL, or with defaultModel on the embedded default model
// (no -m, LILY_MODEL cleared).
export async function startServer(args = [], { defaultModel = false } = {}) {
  const env = { ...process.env };
  if (defaultModel) delete env.LILY_MODEL;
  const model = defaultModel ? [] : ['-m', process.env.LILY_TEST_MODEL];
  const proc = spawn(process.env.LILY_BINARY, ['serve', ...model, '--port', '0', '--ctx-size', '2048', ...args],
    { stdio: ['ignore', 'pipe', 'pipe'], env });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) resolve(m[1]);
    });
    proc.on('exit', (code) => reject(new Error(`lily serve exited with ${code}: ${log}`)));
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    url,
    proc,
    exited,
    async stop() {
      if (proc.exitCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

export function userTurn(text) {
  return [{ role: 'user', content: text }];
}

// Starts `lily serve ARGS` (no model or port added) and collects its output until it exits:
// for the runs that must fail, or that are watched while they load.
export function spawnServe(args, { env = process.env } = {}) {
  const proc = spawn(process.env.LILY_BINARY, ['serve', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  const out = { stdout: '', stderr: '' };
  proc.stdout.on('data', (d) => { out.stdout += d; });
  proc.stderr.on('data', (d) => { out.stderr += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal, ...out })));
  return { proc, out, exited };
}

// Resolves once `predicate(text)` holds for the collected output, or rejects after `ms`.
export async function waitFor(predicate, ms, what) {
  const t0 = Date.now();
  while (!predicate()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// Sends `bytes` on a fresh TCP connection to `base` and reads until the server closes it (or
// `timeout` ms pass). { data, closed: whether the server closed, ms: when, error }.
export function rawExchange(base, bytes, { timeout = 10_000, keepWriting = null } = {}) {
  const u = new URL(base);
  return new Promise((resolve) => {
    const socket = net.connect(Number(u.port), u.hostname);
    const t0 = Date.now();
    let data = '', error = null, done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ data, closed, ms: Date.now() - t0, error });
    };
    const timer = setTimeout(() => finish(false), timeout);
    socket.on('data', (d) => { data += d.toString('latin1'); });
    socket.on('error', (e) => { error = e.code; });
    socket.on('close', () => finish(true));
    socket.on('connect', () => {
      if (bytes) socket.write(bytes, () => {});
      if (keepWriting) keepWriting(socket);
    });
  });
}

// Resident memory of a process, KiB.
export function rssKiB(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(status.match(/VmRSS:\s+(\d+)/)[1]);
}
