// Helpers for the server tests: a client for the server run_node_tests.sh started, and a way to
// start extra servers (with --api-key, a short queue, ...).
import OpenAI from 'openai';
import { spawn } from 'node:child_process';

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
      const m = out.match(/http:\/\/\S+/);
      if (m) resolve(m[0]);
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
