// load.mjs [SECONDS] [CLIENTS] [PARALLEL]: a load test of `lily serve --parallel` (issue 38):
//   * CLIENTS clients (32 by default) for SECONDS (120), each asking greedy questions whose answers
//     are known (computed one at a time at the start, cold), mixed: streamed and not, and some of
//     them cancelling a stream after a few chunks or disconnecting from a request not streamed;
//   * every completed answer must be exactly the known one for its question (nothing mixed
//     between clients), every stream must end with its finish chunk and [DONE];
//   * a full line may answer 503 with Retry-After (the client then waits and asks again);
//   * at the end no slot is leaked (lily_slots_busy and lily_queue_depth back to 0) and the
//     resident memory after POST /cache/clear is within 10% (or 4 MiB) of the start's (after a
//     warm-up; not checked under the sanitizers);
//   * throughput and latency are printed: completions, tokens/s over the run, times to first token.
// Starts its own server (LILY_BINARY; LILY_TEST_MODEL, or the embedded lily-tiny without it);
// prints one JSON summary; exits 1 on any failure. By hand:
//   LILY_BINARY=build/lily node tests/server/node/load.mjs 120 32 4
process.env.LILY_URL ??= 'http://unused';  // lib.mjs wants one; this script starts its own server
const { rssKiB, startServer, metrics } = await import('./lib.mjs');

const seconds = Number(process.argv[2] ?? 120);
const clients = Number(process.argv[3] ?? 32);
const parallel = Number(process.argv[4] ?? 4);
const sanitized = process.env.LILY_SANITIZED === '1';
const failures = [];
const fail = (what) => { if (failures.length < 50) failures.push(what); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const counts = { whole: 0, streams: 0, cancelled: 0, disconnected: 0, busy_503: 0, tokens: 0 };
const ttfts = [];

const server = await startServer(['--parallel', String(parallel), '--queue', String(clients)],
  { defaultModel: !process.env.LILY_TEST_MODEL });
const base = server.url;
const json = { 'Content-Type': 'application/json' };

const QUESTIONS = ['Compute 947+377', 'What is 130 plus 240?', 'Subtract 990 from 630.', 'How much is 35+45?',
  'What is 206 minus 46?', 'Please add 997 to 707.', 'Compute 648+8', "What's the sum of 24 and 474?",
  'Tell me about cats.', 'Name three rivers.', 'Why is the sky blue?', 'Calculate 912 - 2.'];
const maxTokens = (i) => 40 + 24 * (i % 4);
const body = (i, extra = {}) => ({ model: 'lily', temperature: 0, max_tokens: maxTokens(i),
  messages: [{ role: 'user', content: QUESTIONS[i] }], ...extra });
const answer = (m) => (m.reasoning_content ?? '') + '\u0000' + (m.content ?? '');

async function post(b, signal) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: json, body: JSON.stringify(b), signal });
  return r;
}

// The known answers: one at a time, greedy, cold.
const known = [];
for (let i = 0; i < QUESTIONS.length; ++i) {
  const r = await post(body(i, { cache_prompt: false }));
  known.push(answer((await r.json()).choices[0].message));
}

// A 503 (the line full) is an answer the client may get: it waits Retry-After and asks again.
async function retried(fn) {
  for (let attempt = 0; attempt < 50; ++attempt) {
    const r = await fn();
    if (r !== 503) return;
    counts.busy_503++;
    await sleep(1000);
  }
  fail('50 answers of 503 in a row');
}

async function wholeOnce(i, disconnectAfterMs = 0) {
  const controller = new AbortController();
  const t0 = Date.now();
  const pending = post(body(i), controller.signal);
  if (disconnectAfterMs) {
    setTimeout(() => controller.abort(), disconnectAfterMs);
    const r = await pending.catch(() => null);
    if (r && r.status === 503) return 503;
    if (r) await r.text().catch(() => null);
    counts.disconnected++;
    return 0;
  }
  const r = await pending;
  if (r.status === 503) return (await r.text(), 503);
  if (r.status !== 200) return fail(`whole ${i}: status ${r.status} ${await r.text()}`);
  const out = await r.json();
  ttfts.push(Date.now() - t0);  // not streamed: the whole answer's time
  if (answer(out.choices[0].message) !== known[i]) fail(`whole ${i}: answer differs from the one alone`);
  counts.tokens += out.usage.completion_tokens;
  counts.whole++;
  return 0;
}

async function streamOnce(i, cancelAfter = 0) {
  const controller = new AbortController();
  const t0 = Date.now();
  const r = await post(body(i, { stream: true, stream_options: { include_usage: true } }), controller.signal);
  if (r.status === 503) return (await r.text(), 503);
  if (r.status !== 200) return fail(`stream ${i}: status ${r.status} ${await r.text()}`);
  let text = '', chunks = 0, first = 0;
  const reader = r.body.getReader();
  try {
    while (true) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      if (!first && text.includes('"reasoning_content"')) first = Date.now() - t0;
      if (cancelAfter && ++chunks >= cancelAfter) {
        controller.abort();
        counts.cancelled++;
        return 0;
      }
    }
  } catch (e) {
    if (!cancelAfter) fail(`stream ${i}: ${e.message}`);
    return 0;
  }
  const events = text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
  if (events.at(-1) !== '[DONE]') return fail(`stream ${i}: no [DONE]: ${text.slice(-200)}`);
  let reasoning = '', content = '', finish = null;
  for (const e of events.slice(0, -1)) {
    const c = JSON.parse(e);
    if (c.error) return fail(`stream ${i}: error event ${e}`);
    if (c.usage) counts.tokens += c.usage.completion_tokens;
    reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
    content += c.choices[0]?.delta?.content ?? '';
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  if (!finish) fail(`stream ${i}: no finish_reason`);
  if (reasoning + '\u0000' + content !== known[i]) fail(`stream ${i}: answer differs from the one alone`);
  if (first) ttfts.push(first);
  counts.streams++;
  return 0;
}

// Client c's n-th request: mostly whole answers and streams; every 7th a stream cancelled after
// a few chunks, every 11th a request not streamed whose client disconnects.
function requestOf(c, n) {
  const i = (c * 5 + n) % QUESTIONS.length;
  const k = c + n;
  if (k % 11 === 0) return () => wholeOnce(i, 100 + (k % 5) * 60);
  if (k % 7 === 0) return () => streamOnce(i, 2 + (k % 5));
  return k % 2 ? () => streamOnce(i) : () => wholeOnce(i);
}

// Warm-up (every kind once, CLIENTS at once), then the cache emptied: the start.
await Promise.all(Array.from({ length: clients }, (_, c) => retried(requestOf(c, 0))));
await sleep(300);
await fetch(`${base}/cache/clear`, { method: 'POST' });
const rssStart = rssKiB(server.proc.pid);
for (const k of Object.keys(counts)) counts[k] = 0;
ttfts.length = 0;

const t0 = Date.now();
const deadline = t0 + seconds * 1000;
await Promise.all(Array.from({ length: clients }, async (_, c) => {
  for (let n = 1; Date.now() < deadline; ++n) await retried(requestOf(c, n));
}));
const elapsed = (Date.now() - t0) / 1000;

// No slot leaked: the cancelled and disconnected ones left at their next step.
let m = await metrics(base);
for (let k = 0; k < 100 && (m.lily_slots_busy !== 0 || m.lily_queue_depth !== 0); ++k) {
  await sleep(50);
  m = await metrics(base);
}
if (m.lily_slots_busy !== 0 || m.lily_queue_depth !== 0) fail(`slots busy ${m.lily_slots_busy}, waiting ${m.lily_queue_depth} at the end`);
const cleared = await (await fetch(`${base}/cache/clear`, { method: 'POST' })).json();
await sleep(200);
const rssEnd = rssKiB(server.proc.pid);
const rssChange = (rssEnd - rssStart) / rssStart;
// Within 10%, or within 4 MiB on a server this small (lily-tiny: ~20 MiB): each of the threads
// that ran a request (CLIENTS + 2 workers, the scheduler) keeps up to glibc's trim threshold of
// freed memory in its arena (128 KiB, cmd_serve.cpp), ~4.6 MiB for 35 of them: not a leak.
if (!sanitized && Math.abs(rssChange) > 0.10 && Math.abs(rssEnd - rssStart) > 4096) {
  fail(`resident memory ${rssStart} KiB -> ${rssEnd} KiB after clearing the cache`);
}
if (server.proc.exitCode !== null) fail(`lily serve exited during the load: ${server.proc.exitCode}`);
const exit = await server.stop();
if (exit.code !== 0) fail(`lily serve stopped with ${JSON.stringify(exit)}`);
ttfts.sort((a, b) => a - b);
const pct = (p) => ttfts.length ? ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))] : null;
console.log(JSON.stringify({
  seconds, clients, parallel, ...counts, tokens_per_second: Number((counts.tokens / elapsed).toFixed(1)),
  first_token_ms: { p50: pct(0.5), p90: pct(0.9), max: ttfts.at(-1) ?? null },
  cancelled_total: m.lily_completions_cancelled_total, rss_start_kib: rssStart, rss_end_kib: rssEnd,
  rss_change_percent: Number((rssChange * 100).toFixed(1)), rss_checked: !sanitized, cleared, failures,
}));
process.exit(failures.length ? 1 : 0);
