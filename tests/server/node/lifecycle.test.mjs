// The server's life (issue 17): binding (a port in use, a port out of range, the warning beyond
// loopback), /health while the model loads, the session cache cleared on request, and SIGTERM:
// stop accepting, let the running generation finish within --drain-seconds, then end every
// open stream with an error event and [DONE].
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GREEDY, metrics, spawnServe, startServer, userTurn, waitFor } from './lib.mjs';

const MODEL_DIR = process.env.LILY_TEST_MODEL;

// Exits (code), or is killed and fails the test after `ms`.
async function exitsWithin(run, ms) {
  const timer = setTimeout(() => run.proc.kill('SIGKILL'), ms);
  const r = await run.exited;
  clearTimeout(timer);
  assert.notEqual(r.signal, 'SIGKILL', `still running after ${ms} ms; stdout: ${r.stdout} stderr: ${r.stderr}`);
  return r;
}

// Reads an SSE response to its end: { events (parsed data lines, '[DONE]' as is), comments, text }.
async function readSse(res) {
  const text = await res.text();  // rejects if the body is cut (an unterminated chunked body)
  const events = [], comments = [];
  for (const block of text.split('\n\n')) {
    if (block.startsWith('data: ')) {
      const data = block.slice(6);
      events.push(data === '[DONE]' ? data : JSON.parse(data));
    } else if (block.startsWith(':')) {
      comments.push(block);
    }
  }
  return { events, comments, text };
}

function postStream(base, body) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...GREEDY, ...body, stream: true }),
  });
}

test('regression_port_in_use_17: a second lily serve on a port in use fails, it does not share it', { timeout: 60_000 }, async () => {
  const first = await startServer();
  try {
    const port = new URL(first.url).port;
    const second = spawnServe(['-m', MODEL_DIR, '--port', port]);
    const r = await exitsWithin(second, 15_000);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port}: the address is already in use`));
    assert.doesNotMatch(r.stdout, /listening/);
    assert.equal((await fetch(`${first.url}/health`)).status, 200);
  } finally {
    assert.equal((await first.stop()).code, 0);
  }
});

test('regression_port_range_17: --port beyond 65535 is refused', { timeout: 60_000 }, async () => {
  for (const port of ['99999', '65536', '-1']) {
    const r = await exitsWithin(spawnServe(['-m', MODEL_DIR, '--port', port]), 15_000);
    assert.notEqual(r.code, 0, `--port ${port}`);
    assert.match(r.stderr, /--port.*(not in range|65535)/, `--port ${port}: ${r.stderr}`);
    assert.doesNotMatch(r.stdout, /listening/);
  }
});

test('regression_public_bind_warning_17: beyond loopback without an API key, a warning', { timeout: 60_000 }, async () => {
  for (const [env, warned] of [[{}, true], [{ LILY_API_KEY: 'k' }, false]]) {
    const run = spawnServe(['-m', MODEL_DIR, '--host', '0.0.0.0', '--port', '0'], { env: { ...process.env, ...env } });
    await waitFor(() => /listening on/.test(run.out.stdout) || run.proc.exitCode !== null, 15_000, 'listening');
    run.proc.kill('SIGTERM');
    const r = await run.exited;
    assert.equal(r.code, 0, r.stderr);
    assert.equal(/warning: listening on 0\.0\.0\.0, beyond loopback, without an API key/.test(r.stderr), warned, r.stderr);
  }
});

test('regression_health_while_loading_17: /health answers 503 with the phase while the model loads', { timeout: 60_000 }, async () => {
  // config.json as a named pipe: loading waits until the test writes it.
  const dir = mkdtempSync(join(tmpdir(), 'lily-loading-'));
  let run = null;
  try {
    for (const f of readdirSync(MODEL_DIR)) {
      if (f !== 'config.json') symlinkSync(realpathSync(join(MODEL_DIR, f)), join(dir, f));
    }
    execFileSync('mkfifo', [join(dir, 'config.json')]);
    run = spawnServe(['-m', dir, '--port', '0', '--ctx-size', '2048']);
    await waitFor(() => /bound to http:\/\/\S+;/.test(run.out.stderr) || run.proc.exitCode !== null, 15_000, 'bound');
    const url = run.out.stderr.match(/bound to (http:\/\/\S+);/)[1];
    // The port is bound before the load starts: the first answers may still say 'starting'.
    let h, body;
    for (const t0 = Date.now(); ; ) {
      h = await fetch(`${url}/health`);
      body = await h.json();
      if (body.phase !== 'starting' || Date.now() - t0 > 15_000) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(h.status, 503);
    assert.equal(h.headers.get('retry-after'), '1');
    assert.equal(body.status, 'loading');
    assert.equal(body.phase, 'loading the model weights');
    assert.equal(typeof body.elapsed_seconds, 'number');
    const m = await fetch(`${url}/v1/models`);
    assert.equal(m.status, 503);
    assert.match((await m.json()).error.message, /the model is loading/);
    assert.match(await (await fetch(`${url}/metrics`)).text(), /\nlily_ready 0\n/);
    writeFileSync(join(dir, 'config.json'), readFileSync(join(MODEL_DIR, 'config.json')));
    await waitFor(() => /listening on/.test(run.out.stdout) || run.proc.exitCode !== null, 15_000, 'listening');
    assert.equal((await fetch(`${url}/health`)).status, 200);
    run.proc.kill('SIGTERM');
    assert.equal((await run.exited).code, 0);
  } finally {
    // A failed assertion leaves the server blocked on the pipe: without this kill it keeps the
    // test file (and CTest's group) running until the group's time limit.
    if (run && run.proc.exitCode === null && run.proc.signalCode === null) run.proc.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

test('POST /cache/clear empties the session cache', { timeout: 60_000 }, async () => {
  const server = await startServer();
  try {
    const r = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...GREEDY, messages: userTurn('Remember me.'), max_tokens: 3 }),
    });
    assert.equal(r.status, 200);
    assert.ok((await metrics(server.url)).lily_session_cache_sequences >= 1);
    const c = await fetch(`${server.url}/cache/clear`, { method: 'POST' });
    assert.equal(c.status, 200);
    const cleared = await c.json();
    assert.ok(cleared.cleared_sequences >= 1 && cleared.cleared_bytes > 0, JSON.stringify(cleared));
    const after = await metrics(server.url);
    assert.equal(after.lily_session_cache_sequences, 0);
    assert.equal(after.lily_session_cache_bytes, 0);
    assert.equal((await fetch(`${server.url}/cache/clear`)).status, 405);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test('regression_sigterm_drain_17: SIGTERM lets a running generation finish; new connections are refused', { timeout: 60_000 }, async () => {
  const server = await startServer(['--drain-seconds', '60']);
  const res = await postStream(server.url,
    { messages: userTurn('Go on.'), max_tokens: 600, ignore_eos: true, stream_options: { include_usage: true } });
  const reader = res.body.getReader();
  let text = Buffer.from((await reader.read()).value).toString();
  server.proc.kill('SIGTERM');
  let finished = false;
  const rest = (async () => {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
    finished = true;
  })();
  await new Promise((r) => setTimeout(r, 300));
  const probe = await fetch(`${server.url}/health`).then((r) => r.status, (e) => e.cause?.code ?? e.message);
  const probedWhileRunning = !finished;
  await rest;
  const { code } = await server.exited;
  assert.equal(code, 0);
  if (probedWhileRunning) assert.equal(probe, 'ECONNREFUSED');
  // The whole reply: its finish chunk, the usage chunk with all 600 tokens, [DONE].
  const events = text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  const usage = JSON.parse(events.at(-2));
  assert.equal(usage.usage?.completion_tokens, 600, events.at(-2));
  assert.equal(JSON.parse(events.at(-3)).choices[0].finish_reason, 'length', events.at(-3));
});

test('regression_sigterm_streams_17: after --drain-seconds every open stream ends with an error event and [DONE]', { timeout: 60_000 }, async () => {
  // One slot, so the second stream waits in the line (with more, it would run and end); a short
  // drain, as the 1900 tokens of the running one take under a second on an idle machine.
  const server = await startServer(['--drain-seconds', '0.2', '--parallel', '1']);
  const running = await postStream(server.url, { messages: userTurn('Go on and on.'), max_tokens: 1900, ignore_eos: true, cache_prompt: false });
  const runningRead = readSse(running);
  await new Promise((r) => setTimeout(r, 200));
  const queued = await postStream(server.url, { messages: userTurn('Me too.'), max_tokens: 5 });
  const queuedRead = readSse(queued);
  await new Promise((r) => setTimeout(r, 200));
  const t0 = Date.now();
  server.proc.kill('SIGTERM');
  const [a, b] = await Promise.all([runningRead, queuedRead]);
  const { code } = await server.exited;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 8000, `stopped after ${Date.now() - t0} ms`);
  for (const [name, r] of [['running', a], ['queued', b]]) {
    assert.equal(r.events.at(-1), '[DONE]', `${name}: ${r.text.slice(-300)}`);
    const error = r.events.at(-2).error;
    assert.ok(error, `${name}: no error event before [DONE]: ${r.text.slice(-300)}`);
    assert.equal(error.type, 'server_overloaded');
    assert.match(error.message, /shutting down/);
  }
  assert.match(a.events.at(-2).error.message, /drain time/);
  assert.ok(a.events.length < 1900, 'the running generation was not stopped');
});
