// Requests at once: a FIFO queue behind the slots (--parallel, 4 by default), nothing mixed up; a full queue is a
// 503 with Retry-After; a client that aborts stops its generation; SIGTERM shuts down cleanly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, client, GREEDY, metrics, postJson, startServer, userTurn } from './lib.mjs';

const openai = client();
const prompts = ['First question about cats.', 'Second, about dogs.', 'Third: birds?', 'Fourth - fish.', 'Fifth is on trees.', 'Sixth: the sea.'];

test('concurrent requests each get their own answer', async () => {
  const alone = [];
  for (const p of prompts) {
    alone.push((await openai.chat.completions.create({ ...GREEDY, messages: userTurn(p), max_tokens: 10 })).choices[0].message);
  }
  const together = await Promise.all(prompts.map(async (p, i) => {
    if (i % 2) {
      let reasoning = '', content = '';
      const stream = await openai.chat.completions.create({ ...GREEDY, messages: userTurn(p), max_tokens: 10, stream: true });
      for await (const c of stream) {
        reasoning += c.choices[0]?.delta?.reasoning_content ?? '';
        content += c.choices[0]?.delta?.content ?? '';
      }
      return { reasoning_content: reasoning || undefined, content };
    }
    return (await openai.chat.completions.create({ ...GREEDY, messages: userTurn(p), max_tokens: 10 })).choices[0].message;
  }));
  together.forEach((m, i) => {
    assert.equal(m.content ?? '', alone[i].content ?? '', `request ${i}`);
    assert.equal(m.reasoning_content, alone[i].reasoning_content, `request ${i}`);
  });
});

test('a full queue answers 503 with Retry-After, and every accepted request completes', async () => {
  const server = await startServer(['--queue', '1']);
  try {
    const body = { ...GREEDY, messages: userTurn('Tell me a long story.'), max_tokens: 300, ignore_eos: true, cache_prompt: false };
    const results = await Promise.all(Array.from({ length: 6 }, () => postJson('/v1/chat/completions', body, { base: server.url })));
    const busy = results.filter((r) => r.status === 503);
    const ok = results.filter((r) => r.status === 200);
    assert.ok(busy.length >= 1, `statuses: ${results.map((r) => r.status)}`);
    assert.ok(ok.length >= 2, `statuses: ${results.map((r) => r.status)}`);
    assert.equal(ok.length + busy.length, 6);
    for (const r of busy) {
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
      assert.equal(r.json.error.type, 'server_overloaded');
    }
    for (const r of ok) assert.equal(r.json.choices[0].message.reasoning_content, ok[0].json.choices[0].message.reasoning_content);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});

test('a client that aborts mid-stream stops its generation', async () => {
  const before = await metrics();
  const controller = new AbortController();
  const stream = await openai.chat.completions.create(
    { ...GREEDY, messages: userTurn('Write a very long essay.'), max_tokens: 1500, ignore_eos: true, stream: true },
    { signal: controller.signal });
  let chunks = 0;
  try {
    for await (const _ of stream) {
      if (++chunks === 3) controller.abort();
    }
  } catch { /* the abort */ }
  assert.ok(chunks >= 3 && chunks < 100, `${chunks} chunks`);
  // The next request is served at once, and the aborted one stopped long before 1500 tokens.
  const t0 = Date.now();
  await openai.chat.completions.create({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 2 });
  let after = await metrics();
  for (let i = 0; i < 50 && after.lily_completions_cancelled_total === before.lily_completions_cancelled_total; ++i) {
    await new Promise((r) => setTimeout(r, 100));
    after = await metrics();
  }
  assert.equal(after.lily_completions_cancelled_total, before.lily_completions_cancelled_total + 1);
  assert.ok(after.lily_generated_tokens_total - before.lily_generated_tokens_total < 200,
    `generated ${after.lily_generated_tokens_total - before.lily_generated_tokens_total} tokens`);
  assert.ok(Date.now() - t0 < 10_000);
});

test('a non-streaming client that goes away stops its generation too', async () => {
  const before = await metrics();
  const controller = new AbortController();
  const pending = fetch(`${BASE}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: controller.signal,
    body: JSON.stringify({ ...GREEDY, messages: userTurn('Another long essay, please.'), max_tokens: 1500, ignore_eos: true }),
  }).catch(() => null);
  await new Promise((r) => setTimeout(r, 300));
  controller.abort();
  await pending;
  let after = await metrics();
  for (let i = 0; i < 50 && after.lily_completions_total === before.lily_completions_total; ++i) {
    await new Promise((r) => setTimeout(r, 100));
    after = await metrics();
  }
  assert.equal(after.lily_completions_cancelled_total, before.lily_completions_cancelled_total + 1);
});

test('/metrics and /health', async () => {
  const m = await metrics();
  for (const name of ['lily_prompt_tokens_total', 'lily_generated_tokens_total', 'lily_prompt_tokens_cached_total',
    'lily_time_to_first_token_seconds', 'lily_prefill_tokens_per_second', 'lily_decode_tokens_per_second', 'lily_queue_depth']) {
    assert.ok(name in m, `${name} missing`);
  }
  assert.ok(Object.keys(m).some((k) => k.startsWith('lily_requests_total{path="/v1/chat/completions",status="200"}')));
  const h = await fetch(`${BASE}/health`);
  assert.equal(h.status, 200);
  const health = await h.json();
  assert.equal(health.status, 'ok');
  assert.equal(health.slots, 4, 'the default --parallel');
  assert.equal(health.slots_busy, 0);
  assert.equal(health.slots_idle, 4);
  assert.equal(health.waiting, 0);
  assert.equal(m.lily_slots, 4);
  assert.equal(m.lily_slots_busy, 0);
});

test('SIGTERM during a stream shuts the server down cleanly', async () => {
  const server = await startServer();
  const c = client(server.url);
  const stream = await c.chat.completions.create({ ...GREEDY, messages: userTurn('Go on and on.'), max_tokens: 1500, ignore_eos: true, stream: true });
  let chunks = 0;
  const reading = (async () => { for await (const _ of stream) { if (++chunks === 2) server.proc.kill('SIGTERM'); } })().catch(() => null);
  const t0 = Date.now();
  const { code } = await server.exited;
  await reading;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 8000);
});
