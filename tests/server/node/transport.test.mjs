// The HTTP transport under hostile or odd clients (issue 17): header limits (431), slow clients
// that must not starve /health, the read deadline (408), HTTP/1.0 streams, bounded and escaped
// /metrics labels, and a queued stream that starts at once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, GREEDY, metrics, rawExchange, rssKiB, startServer, userTurn } from './lib.mjs';

const statusLine = (data) => data.split('\r\n')[0];

async function timedHealth(base = BASE) {
  const t0 = Date.now();
  const r = await fetch(`${base}/health`, { signal: AbortSignal.timeout(5000) }).catch((e) => ({ status: e.name }));
  return { status: r.status, ms: Date.now() - t0 };
}

test('regression_header_count_17: more than 100 header fields is a 431', { timeout: 60_000 }, async () => {
  const fields = Array.from({ length: 150 }, (_, i) => `X-Field-${i}: ${i}\r\n`).join('');
  const r = await rawExchange(BASE, `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n${fields}\r\n`);
  assert.match(statusLine(r.data), /^HTTP\/1\.1 431 /, r.data.slice(0, 200));
  assert.match(r.data, /"error":\{"message":"the request has 15[0-9] header fields/);
  assert.ok(r.closed);
  assert.equal((await timedHealth()).status, 200);
});

test('regression_header_size_17: a header block over 32 KiB is a 431', { timeout: 60_000 }, async () => {
  const r = await rawExchange(BASE, `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(40 << 10)}\r\n\r\n`);
  assert.match(statusLine(r.data), /^HTTP\/1\.1 431 /, r.data.slice(0, 200));
  assert.equal((await timedHealth()).status, 200);
});

test('regression_header_memory_17: 64 MB of headers is refused at 32 KiB; memory stays put', { timeout: 60_000 }, async () => {
  const server = await startServer();
  try {
    await fetch(`${server.url}/health`);
    const before = rssKiB(server.proc.pid);
    for (let round = 0; round < 3; ++round) {
      const line = `X-Filler: ${'b'.repeat(1000)}\r\n`;
      const chunk = line.repeat(64);  // ~64 KB
      const r = await rawExchange(server.url, 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n', {
        timeout: 20_000,
        keepWriting: (socket) => {
          let sent = 0;
          let answered = false;
          socket.once('data', () => { answered = true; });  // as a client that reads while it sends
          const more = () => {
            while (sent < (64 << 20) && !socket.destroyed && !answered) {
              sent += chunk.length;
              if (!socket.write(chunk)) return socket.once('drain', more);
            }
          };
          more();
        },
      });
      assert.match(statusLine(r.data), /^HTTP\/1\.1 431 /, `round ${round}: ${r.data.slice(0, 200)}`);
    }
    const grown = rssKiB(server.proc.pid) - before;
    assert.ok(grown < 16 << 10, `resident memory grew by ${grown} KiB over 3 x 64 MB of headers`);
    assert.equal((await timedHealth(server.url)).status, 200);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test('regression_slow_clients_17: 24 slow clients do not starve /health; each is cut at 10 s with 408', { timeout: 60_000 }, async () => {
  // Each sends its request line, then one header line every 2 s: never a whole request.
  const slow = Array.from({ length: 24 }, () => rawExchange(BASE, 'GET /health HTTP/1.1\r\n', {
    timeout: 16_000,
    keepWriting: (socket) => {
      const timer = setInterval(() => { if (!socket.destroyed) socket.write('X-Slow: 1\r\n'); }, 2000);
      socket.on('close', () => clearInterval(timer));
    },
  }));
  await new Promise((r) => setTimeout(r, 500));
  const checks = [];
  for (let i = 0; i < 8; ++i) {
    checks.push(await timedHealth());
    await new Promise((r) => setTimeout(r, 1000));
  }
  for (const c of checks) assert.ok(c.status === 200 && c.ms < 1000, `/health: ${JSON.stringify(checks)}`);
  const results = await Promise.all(slow);
  for (const r of results) {
    assert.ok(r.closed, 'a slow client was still connected after 16 s');
    assert.ok(r.ms >= 9000 && r.ms < 13_000, `closed after ${r.ms} ms`);
    assert.match(statusLine(r.data), /^HTTP\/1\.1 408 /);
  }
});

test('regression_http10_stream_17: an HTTP/1.0 client gets a close-delimited stream, not chunks', { timeout: 60_000 }, async () => {
  const body = JSON.stringify({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 5, stream: true });
  const r = await rawExchange(BASE, 'POST /v1/chat/completions HTTP/1.0\r\nHost: 127.0.0.1\r\n' +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  assert.ok(r.closed);
  const [head, payload] = [r.data.slice(0, r.data.indexOf('\r\n\r\n')), r.data.slice(r.data.indexOf('\r\n\r\n') + 4)];
  assert.match(statusLine(head), /^HTTP\/1\.0 200 /);
  assert.doesNotMatch(head, /transfer-encoding/i);
  assert.match(head, /content-type: text\/event-stream/i);
  assert.match(payload, /^data: \{/);  // no chunk-size line in front
  assert.ok(payload.endsWith('data: [DONE]\n\n'), JSON.stringify(payload.slice(-80)));
});

test('regression_metrics_labels_17: /metrics labels are a bounded set of routes, escaped', { timeout: 60_000 }, async () => {
  await rawExchange(BASE, 'GET /x%0Alily_injected_total%201%0A HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
  await rawExchange(BASE, 'GET /a"b\\c HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
  for (let i = 0; i < 40; ++i) await fetch(`${BASE}/random/${Math.random().toString(36).slice(2)}`);
  await fetch(`${BASE}/v1/models/not-this-one`);
  const text = await (await fetch(`${BASE}/metrics`)).text();
  const known = new Set(['/v1/chat/completions', '/v1/completions', '/v1/models', '/v1/models/{id}', '/health', '/metrics',
    '/cache/clear', '/', 'OPTIONS', 'other']);
  const sample = /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? [-+0-9.eEaInNf]+$/;
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('# HELP ') || line.startsWith('# TYPE ')) continue;
    assert.match(line, sample);
    assert.ok(!line.startsWith('lily_injected'), line);
    const path = line.match(/path="((?:[^"\\]|\\.)*)"/);
    if (path) assert.ok(known.has(path[1]), `label path="${path[1]}"`);
  }
  const m = await metrics();
  assert.ok(m['lily_requests_total{path="other",status="404"}'] >= 42);
  assert.ok(m['lily_requests_total{path="/v1/models/{id}",status="404"}'] >= 1);
});

test('regression_queued_stream_17: a queued stream starts at once (role chunk, then comments)', { timeout: 60_000 }, async () => {
  const server = await startServer(['--parallel', '1']);  // one slot: the second request waits
  try {
    const long = new AbortController();
    const first = fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: long.signal,
      body: JSON.stringify({ ...GREEDY, messages: userTurn('A long one.'), max_tokens: 1900, ignore_eos: true, cache_prompt: false }),
    }).then((r) => r.text()).catch(() => 'aborted');
    let firstDone = false;
    first.then(() => { firstDone = true; });
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    const queued = new AbortController();
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: queued.signal,
      body: JSON.stringify({ ...GREEDY, messages: userTurn('Me next.'), max_tokens: 5, stream: true }),
    });
    const reader = res.body.getReader();
    let text = '';
    while (!text.includes('request ahead')) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
    const waited = Date.now() - t0;
    assert.ok(!firstDone, 'the queued stream got nothing until the running request had finished');
    assert.ok(waited < 2000, `the queued stream's first bytes came after ${waited} ms`);
    assert.match(text, /^data: \{.*"delta":\{"role":"assistant","content":""\}/);
    assert.match(text, /\n: waiting for 1 request ahead\n\n/);
    long.abort();
    while (true) {  // its turn comes once the first is gone: the rest of the stream as usual
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
    }
    assert.ok(text.endsWith('data: [DONE]\n\n'));
    await first;
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});
