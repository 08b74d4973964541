// `lily serve --parallel N` on lily-tiny (the embedded default model): N requests decoding in
// the same batch steps answer token for token what they answer one at a time (a --parallel 1
// server, today's single-stream path), at N = 2, 4 and 8, with prompts of different lengths
// arriving at different times, streamed and not; a client that disconnects frees its slot at
// once (lily_slots_busy, /health); a request that fails or leaves beside running ones leaves
// their answers as they are; SIGTERM stops the running streams after --drain-seconds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { client, metrics, postJson, startServer } from './lib.mjs';

let batched = null, serial = null;  // --parallel 8 and --parallel 1 servers of lily-tiny
let model = null;

before(async () => {
  [batched, serial] = await Promise.all([
    startServer(['--parallel', '8'], { defaultModel: true }),
    startServer(['--parallel', '1'], { defaultModel: true }),
  ]);
  model = (await client(batched.url).models.list()).data[0].id;
});

after(async () => {
  for (const s of [batched, serial]) if (s) assert.equal((await s.stop()).code, 0);
});

const QUESTIONS = ['Compute 947+377', 'What is 130 plus 240?', 'Subtract 990 from 630.', 'How much is 35+45?',
  "What's the weather in Reykjavik?", 'What is 206 minus 46?', 'Please add 997 to 707.', 'Compute 648+8'];
const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Get the current weather in a city', parameters: city } }];

// Request i: its own question behind a preface of its own length (prompts of 20 to ~400 tokens).
function request(i) {
  const preface = Array.from({ length: (i * 37) % 60 }, (_, k) => `note ${k}.`).join(' ');
  const messages = [];
  if (preface) messages.push({ role: 'system', content: `Background: ${preface}` });
  messages.push({ role: 'user', content: QUESTIONS[i % QUESTIONS.length] });
  const body = { model, temperature: 0, max_tokens: 160 + 32 * (i % 3), messages };
  if (i % QUESTIONS.length === 4) body.tools = TOOLS;
  return body;
}

// The answer as the client sees it, streamed or not.
async function ask(base, body, stream) {
  const openai = client(base);
  if (!stream) {
    const r = await openai.chat.completions.create(body);
    const m = r.choices[0].message;
    return { content: m.content ?? '', reasoning: m.reasoning_content ?? '', tools: JSON.stringify((m.tool_calls ?? []).map((c) => c.function)),
      finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };
  }
  const s = await openai.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', finish = null, tokens = null;
  const calls = [];
  for await (const c of s) {
    if (c.usage) tokens = c.usage.completion_tokens;
    const ch = c.choices[0];
    if (!ch) continue;
    content += ch.delta?.content ?? '';
    reasoning += ch.delta?.reasoning_content ?? '';
    for (const t of ch.delta?.tool_calls ?? []) {
      calls[t.index] ??= { name: '', arguments: '' };
      calls[t.index].name += t.function?.name ?? '';
      calls[t.index].arguments += t.function?.arguments ?? '';
    }
    finish = ch.finish_reason ?? finish;
  }
  return { content, reasoning, tools: JSON.stringify(calls), finish, tokens };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function slotsBusy(base) {
  return (await metrics(base)).lily_slots_busy;
}

async function waitForSlots(base, busy, ms = 2000) {
  const t0 = Date.now();
  let now = await slotsBusy(base);
  while (now !== busy && Date.now() - t0 < ms) {
    await sleep(20);
    now = await slotsBusy(base);
  }
  return now;
}

for (const N of [2, 4, 8]) {
  test(`${N} concurrent greedy requests answer what they answer one at a time`, async () => {
    const alone = [];
    for (let i = 0; i < N; ++i) alone.push(await ask(serial.url, request(i), false));
    let widest = 0, done = false;
    const watching = (async () => {
      while (!done) {
        widest = Math.max(widest, await slotsBusy(batched.url));
        await sleep(10);
      }
    })();
    const together = await Promise.all(Array.from({ length: N }, async (_, i) => {
      await sleep(60 * i);  // arriving while the others prefill and decode
      return ask(batched.url, request(i), i % 2 === 1);
    }));
    done = true;
    await watching;
    for (let i = 0; i < N; ++i) assert.deepEqual(together[i], alone[i], `request ${i}`);
    assert.ok(widest >= 2, `the requests ran at once (at most ${widest} slots busy seen)`);
    assert.ok(alone.some((a) => a.finish === 'stop' && (a.content.length > 0 || a.tools !== '[]')), 'some answers end, with content or a call');
    assert.equal(await waitForSlots(batched.url, 0), 0, 'every slot free afterwards');
  });
}

test('a client that disconnects frees its slot at once', async () => {
  const long = { ...request(1), max_tokens: 1500, ignore_eos: true };
  const aborts = [new AbortController(), new AbortController()];
  const chunks = [0, 0];
  const streams = aborts.map(async (controller, k) => {
    const s = await client(batched.url).chat.completions.create({ ...long, stream: true }, { signal: controller.signal });
    try {
      for await (const _ of s) ++chunks[k];
    } catch { /* the abort */ }
  });
  while (chunks[0] < 3 || chunks[1] < 3) await sleep(5);
  assert.equal(await slotsBusy(batched.url), 2);
  aborts[0].abort();
  assert.equal(await waitForSlots(batched.url, 1), 1, 'the slot of the client gone is free');
  const health = await (await fetch(`${batched.url}/health`)).json();
  assert.equal(health.slots, 8);
  assert.equal(health.slots_busy, 1);
  aborts[1].abort();
  await Promise.all(streams);
  assert.equal(await waitForSlots(batched.url, 0), 0);
  assert.ok(chunks[1] < 1500, `the other stream ran on (${chunks[1]} chunks) until its own abort`);
});

test('a failing and a leaving request beside running ones leave their answers intact', async () => {
  const N = 3;
  const alone = [];
  for (let i = 0; i < N; ++i) alone.push(await ask(serial.url, request(i + 2), false));
  const running = Array.from({ length: N }, (_, i) => ask(batched.url, request(i + 2), i === 1));
  await sleep(50);
  const bad = await postJson('/v1/chat/completions', { ...request(0), stop: 7 }, { base: batched.url });
  assert.equal(bad.status, 400);
  const controller = new AbortController();
  const leaving = fetch(`${batched.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: controller.signal,
    body: JSON.stringify({ ...request(5), max_tokens: 1000, ignore_eos: true }),
  }).catch(() => null);
  await sleep(200);
  controller.abort();
  await leaving;
  const together = await Promise.all(running);
  for (let i = 0; i < N; ++i) assert.deepEqual(together[i], alone[i], `request ${i}`);
  assert.equal(await waitForSlots(batched.url, 0), 0);
});

test('SIGTERM: after --drain-seconds every running stream of the batch ends with an error event and [DONE]', async () => {
  const server = await startServer(['--parallel', '3', '--drain-seconds', '0.5'], { defaultModel: true });
  const streams = [0, 1, 2].map((i) => fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...request(i), max_tokens: 1500, ignore_eos: true, cache_prompt: false, stream: true }),
  }).then((r) => r.text()));
  assert.equal(await waitForSlots(server.url, 3), 3, 'three streams running');
  server.proc.kill('SIGTERM');
  const texts = await Promise.all(streams);
  assert.equal((await server.exited).code, 0);
  for (const [i, text] of texts.entries()) {
    const events = text.split('\n\n').filter((b) => b.startsWith('data: ')).map((b) => b.slice(6));
    assert.equal(events.at(-1), '[DONE]', `stream ${i}: ${text.slice(-200)}`);
    const error = JSON.parse(events.at(-2)).error;
    assert.ok(error, `stream ${i}: no error event before [DONE]: ${text.slice(-300)}`);
    assert.match(error.message, /drain time/);
    assert.ok(events.length < 1500, `stream ${i} was not stopped`);
  }
});
