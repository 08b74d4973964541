// soak.mjs [SECONDS]: a bounded, loopback soak of `lily serve` (issue 17, "Done when"):
//   * 8 streaming clients, each asking greedy questions whose answers are known (computed cold
//     at the start): every stream must end with its finish chunk and [DONE] and carry exactly the
//     known answer;
//   * hostile requests (malformed HTTP and JSON, limits, deep nesting, foreign Origin / Host,
//     wrong method / type), each with its documented status;
//   * streams aborted after a few chunks;
//   * slow clients (one header line every 2 s), kept at 6 at a time;
//   * /health polled every 250 ms: it must always answer 200 within 1 s;
//   * resident memory at the start (after a warm-up of each kind of request) and at the end,
//     each after POST /cache/clear: within 10%
//     (reported only under the sanitizers, whose allocator keeps freed memory on purpose);
//   * the server still alive at the end and stopping cleanly (exit 0) on SIGTERM.
// Starts its own server (LILY_BINARY, LILY_TEST_MODEL); prints one JSON summary; exits 1 on any
// failure. scripts/test.sh runs 20 s of it (CTest server_node_soak); the 2-minute run is by hand:
//   LILY_BINARY=build/lily LILY_TEST_MODEL=tests/server/fixtures/tiny-chat node soak.mjs 120
process.env.LILY_URL ??= 'http://unused';  // lib.mjs wants one; this script starts its own server
const { GREEDY, rawExchange, rssKiB, startServer, userTurn } = await import('./lib.mjs');

const seconds = Number(process.argv[2] ?? 120);
const sanitized = process.env.LILY_SANITIZED === '1';
const failures = [];
const fail = (what) => { if (failures.length < 50) failures.push(what); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const counts = { streams: 0, hostile: 0, aborted: 0, slow: 0, health: 0 };

const server = await startServer(['--queue', '32']);
const base = server.url;
const json = { 'Content-Type': 'application/json' };

async function post(body, headers = json) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: r.status, text: await r.text() };
}

// The known answers: greedy, cold (no session cache), not streamed.
const prompts = ['Tell me about cats.', 'What is 12 + 35?', 'Name three rivers.', 'Describe the sea.',
  'Why is the sky blue?', 'Write a haiku about snow.', 'List four colours.', 'What do birds eat?'];
const maxTokens = 24;
const known = [];
for (const p of prompts) {
  const r = await post({ ...GREEDY, messages: userTurn(p), max_tokens: maxTokens, cache_prompt: false });
  const m = JSON.parse(r.text).choices[0].message;
  known.push((m.reasoning_content ?? '') + '\u0000' + (m.content ?? ''));
}
const rssLoaded = rssKiB(server.proc.pid);
const deadline = Date.now() + seconds * 1000;
const running = () => Date.now() < deadline;

async function streamOnce(i, abortAfter = 0) {
  const controller = new AbortController();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: json, signal: controller.signal,
    body: JSON.stringify({ ...GREEDY, messages: userTurn(prompts[i]), max_tokens: maxTokens, stream: true }),
  });
  if (r.status !== 200) return fail(`stream ${i}: status ${r.status} ${await r.text()}`);
  let text = '', chunks = 0;
  const reader = r.body.getReader();
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      if (abortAfter && ++chunks >= abortAfter) {
        controller.abort();
        counts.aborted++;
        return;
      }
    }
  } catch (e) {
    if (!abortAfter) fail(`stream ${i}: ${e.message}`);
    return;
  }
  const events = text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
  if (events.at(-1) !== '[DONE]') return fail(`stream ${i}: no [DONE]: ${text.slice(-200)}`);
  let reasoning = '', content = '', finish = null;
  for (const e of events.slice(0, -1)) {
    const c = JSON.parse(e);
    if (c.error) return fail(`stream ${i}: error event ${e}`);
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    content += c.choices[0]?.delta?.content ?? '';
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  if (!finish) fail(`stream ${i}: no finish_reason`);
  if (reasoning + '\u0000' + content !== known[i]) fail(`stream ${i}: answer differs from the cold one`);
  counts.streams++;
}

const nested = (n) => '['.repeat(n) + ']'.repeat(n);
const longHeaders = Array.from({ length: 150 }, (_, k) => `X-F${k}: v\r\n`).join('');
// [name, raw HTTP request, expected status]
const hostile = [
  ['malformed JSON', 'POST', '{"messages": [}', json, 400],
  ['deep JSON', 'POST', `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":${nested(30000)}}}]}`, json, 400],
  ['number beyond a double', 'POST', '{"messages":[{"role":"user","content":"x"}],"temperature":1e309}', json, 400],
  ['form body', 'POST', 'messages=hi', { 'Content-Type': 'application/x-www-form-urlencoded' }, 415],
  ['text/plain body', 'POST', JSON.stringify({ messages: userTurn('x') }), { 'Content-Type': 'text/plain' }, 415],
  ['foreign Origin', 'POST', JSON.stringify({ messages: userTurn('x') }), { ...json, Origin: 'https://evil.example' }, 403],
  ['wrong method', 'GET', null, {}, 405],
  ['image input', 'POST', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } }] }] }), json, 400],
  ['oversized body', 'POST', `{"messages":[{"role":"user","content":"${'x'.repeat(9 << 20)}"}]}`, json, 413],
];
const rawHostile = [
  ['garbage request line', 'GARBAGE\r\n\r\n', /^HTTP\/1\.1 400 /],
  ['HTTP/9.9', 'GET /health HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n', /^HTTP\/1\.1 (400|505) /],
  ['150 header fields', `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n${longHeaders}\r\n`, /^HTTP\/1\.1 431 /],
  ['64 KiB header', `GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(64 << 10)}\r\n\r\n`, /^HTTP\/1\.1 431 /],
  ['foreign Host', 'GET /v1/models HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n', /^HTTP\/1\.1 403 /],
  ['newline in a path', 'GET /x%0Ainjected%201 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n', /^HTTP\/1\.1 404 /],
];

async function hostileOnce(k) {
  if (k % 2 === 0) {
    const [name, method, body, headers, status] = hostile[(k / 2) % hostile.length];
    const r = await fetch(`${base}/v1/chat/completions`, { method, headers, body: body ?? undefined })
      .then(async (x) => ({ status: x.status, text: await x.text() }), (e) => ({ status: e.message, text: '' }));
    if (r.status !== status) fail(`hostile ${name}: ${r.status}, not ${status}: ${r.text.slice(0, 200)}`);
  } else {
    const [name, bytes, pattern] = rawHostile[((k - 1) / 2) % rawHostile.length];
    const r = await rawExchange(base, bytes, { timeout: 10_000 });
    if (!pattern.test(r.data)) fail(`hostile ${name}: ${JSON.stringify(r.data.slice(0, 100))}`);
  }
  counts.hostile++;
}

async function slowOnce() {
  const r = await rawExchange(base, 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n', {
    timeout: 20_000,
    keepWriting: (socket) => {
      const timer = setInterval(() => { if (!socket.destroyed) socket.write('X-Slow: 1\r\n'); }, 2000);
      socket.on('close', () => clearInterval(timer));
    },
  });
  if (!r.closed || !/^HTTP\/1\.1 408 /.test(r.data)) fail(`slow client: ${r.closed} after ${r.ms} ms: ${r.data.slice(0, 60)}`);
  counts.slow++;
}

// Warm-up: every kind of request once, 8 streams at once (the threads, their malloc arenas and
// the transport's buffers come to their working size), then the cache emptied: the start.
await Promise.all(prompts.map((_, i) => streamOnce(i)));
for (let k = 0; k < 2 * Math.max(hostile.length, rawHostile.length); ++k) await hostileOnce(k);
await streamOnce(0, 3);
await sleep(300);
await fetch(`${base}/cache/clear`, { method: 'POST' });
const rssStart = rssKiB(server.proc.pid);
for (const k of Object.keys(counts)) counts[k] = 0;

let healthMax = 0;
async function healthLoop() {
  while (running()) {
    const t0 = Date.now();
    const status = await fetch(`${base}/health`, { signal: AbortSignal.timeout(1000) }).then((r) => r.status, (e) => e.name);
    const ms = Date.now() - t0;
    healthMax = Math.max(healthMax, ms);
    if (status !== 200 || ms > 1000) fail(`/health: ${status} after ${ms} ms`);
    counts.health++;
    await sleep(250);
  }
}

const loops = [healthLoop()];
for (let c = 0; c < 8; ++c) loops.push((async () => { for (let n = c; running(); n += 3) await streamOnce(n % prompts.length); })());
loops.push((async () => { for (let n = 0; running(); ++n) { await streamOnce(n % prompts.length, 2 + (n % 4)); await sleep(500); } })());
loops.push((async () => { for (let k = 0; running(); ++k) { await hostileOnce(k); await sleep(100); } })());
for (let s = 0; s < 6; ++s) loops.push((async () => { await sleep(s * 1500); while (running()) await slowOnce(); })());
await Promise.all(loops);

// Aborted streams stop at their next token: let the last one go, then empty the cache.
await sleep(500);
const cleared = await (await fetch(`${base}/cache/clear`, { method: 'POST' })).json();
await sleep(200);
const rssEnd = rssKiB(server.proc.pid);
const rssChange = (rssEnd - rssStart) / rssStart;
if (!sanitized && Math.abs(rssChange) > 0.10) fail(`resident memory ${rssStart} KiB -> ${rssEnd} KiB after clearing the cache`);
const alive = server.proc.exitCode === null;
if (!alive) fail(`lily serve exited during the soak: ${server.proc.exitCode}`);
const exit = await server.stop();
if (exit.code !== 0) fail(`lily serve stopped with ${JSON.stringify(exit)}`);
console.log(JSON.stringify({
  seconds, ...counts, health_max_ms: healthMax, rss_loaded_kib: rssLoaded, rss_start_kib: rssStart, rss_end_kib: rssEnd,
  rss_change_percent: Number((rssChange * 100).toFixed(1)), rss_checked: !sanitized, cleared, failures,
}));
process.exit(failures.length ? 1 : 0);
