// Bad input always gets an OpenAI error object with a 4xx, never a crash or a 5xx.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, client, GREEDY, postJson, startServer, userTurn } from './lib.mjs';

function assertError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(typeof r.json.error.message, 'string');
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
}

const chat = (extra) => ({ model: 'test', messages: userTurn('Hi'), max_tokens: 2, ...extra });

test('malformed JSON and a body that is not an object', async () => {
  assertError(await postJson('/v1/chat/completions', '{"model": "x", "messages": ['), 400);
  assertError(await postJson('/v1/chat/completions', '[1, 2]'), 400);
  assertError(await postJson('/v1/chat/completions', ''), 400);
  assertError(await postJson('/v1/completions', 'not json'), 400);
});

test('each field of the wrong type is a 400 naming it', async () => {
  const cases = [
    [{ messages: 'hi' }, 'messages'],
    [{ messages: [] }, 'messages'],
    [{ messages: [{ content: 'no role' }] }, 'messages[0].role'],
    [{ temperature: 'hot' }, 'temperature'],
    [{ temperature: 3 }, 'temperature'],
    [{ top_p: 2 }, 'top_p'],
    [{ top_k: 'x' }, 'top_k'],
    [{ min_p: -1 }, 'min_p'],
    [{ presence_penalty: 5 }, 'presence_penalty'],
    [{ frequency_penalty: 'x' }, 'frequency_penalty'],
    [{ repetition_penalty: 0 }, 'repetition_penalty'],
    [{ max_tokens: 'x' }, 'max_tokens'],
    [{ max_tokens: 0 }, 'max_tokens'],
    [{ max_completion_tokens: 1.5 }, 'max_completion_tokens'],
    [{ seed: 1.5 }, 'seed'],
    [{ stop: 5 }, 'stop'],
    [{ stop: ['a', 1] }, 'stop'],
    [{ stream: 'yes' }, 'stream'],
    [{ stream_options: { include_usage: true } }, 'stream_options'],
    [{ stream: true, stream_options: { include_usage: 'yes' } }, 'stream_options.include_usage'],
    [{ logprobs: 'yes' }, 'logprobs'],
    [{ logprobs: true, top_logprobs: 50 }, 'top_logprobs'],
    [{ top_logprobs: 2 }, 'top_logprobs'],
    [{ tools: {} }, 'tools'],
    [{ tools: [{ type: 'function' }] }, 'tools[0].function'],
    [{ tools: [{ type: 'retrieval', function: { name: 'x' } }] }, 'tools[0].type'],
    [{ tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tool_choice: { type: 'function', function: { name: 'missing' } } }, 'tool_choice'],
    [{ chat_template_kwargs: 'x' }, 'chat_template_kwargs'],
    [{ chat_template_kwargs: { enable_thinking: 'no' } }, 'chat_template_kwargs'],
    [{ reasoning_effort: 'extreme' }, 'reasoning_effort'],
    [{ n: 2 }, 'n'],
    [{ logit_bias: { 1: 5 } }, 'logit_bias'],
    [{ response_format: { type: 'json_schema' } }, 'response_format.json_schema'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a' } } } },
      'response_format'],
    [{ messages: [{ role: 'user', content: 'x' }, { role: 'system', content: 'late' }] }, 'messages'],
    [{ messages: [{ role: 'assistant', content: 'x', tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{bad' } }] }, { role: 'user', content: 'y' }] }, 'messages'],
  ];
  for (const [extra, param] of cases) {
    assertError(await postJson('/v1/chat/completions', chat(extra)), 400, param);
  }
  const completions = [
    [{ prompt: 5 }, 'prompt'],
    [{ prompt: ['a', 'b'] }, 'prompt'],
    [{ prompt: 'x', echo: true }, 'echo'],
    [{ prompt: 'x', best_of: 3 }, 'best_of'],
    [{ prompt: 'x', logprobs: 9 }, 'logprobs'],
    [{ prompt: [1, 99999] }, 'prompt'],
  ];
  for (const [body, param] of completions) {
    assertError(await postJson('/v1/completions', { model: 'test', max_tokens: 2, ...body }), 400, param);
  }
});

test('the template refusing the messages is a 400', async () => {
  const r = await postJson('/v1/chat/completions', chat({ messages: [{ role: 'system', content: 'only a system prompt' }] }));
  assertError(r, 400, 'messages');
  assert.match(r.json.error.message, /No user query/);
});

test('a prompt plus max_tokens beyond the context is a 400, not a truncation', async () => {
  const r = await postJson('/v1/chat/completions', chat({ max_tokens: 100000 }));
  assertError(r, 400, 'max_tokens');
  assert.equal(r.json.error.code, 'context_length_exceeded');
  const long = 'word '.repeat(5000);
  const p = await postJson('/v1/chat/completions', chat({ messages: userTurn(long), max_tokens: undefined }));
  assertError(p, 400, 'messages');
  assert.equal(p.json.error.code, 'context_length_exceeded');
  const sdk = client();
  await assert.rejects(sdk.chat.completions.create({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 100000 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('an oversized body is a 413, an unknown route a 404, a wrong method a 405, an unknown model a 404', async () => {
  const big = JSON.stringify(chat({ messages: userTurn('x'.repeat(9 << 20)) }));
  const r = await postJson('/v1/chat/completions', big);
  assert.equal(r.status, 413);
  assertError(await postJson('/v1/nothing', {}), 404);
  const get = await fetch(`${BASE}/v1/chat/completions`);
  assert.equal(get.status, 405);
  assert.equal(get.headers.get('allow'), 'POST, OPTIONS');
  assert.ok((await get.json()).error);
  const m = await fetch(`${BASE}/v1/models/not-this-one`);
  assert.equal(m.status, 404);
  assert.equal((await m.json()).error.code, 'model_not_found');
});

test('--api-key: requests need the bearer key (401 otherwise); /health stays open', async () => {
  const server = await startServer(['--api-key', 'sekret']);
  try {
    await assert.rejects(client(server.url, { apiKey: 'wrong' }).models.list(), (e) => e.status === 401);
    const r = await postJson('/v1/chat/completions', chat({}), { base: server.url });
    assertError(r, 401);
    const ok = await client(server.url, { apiKey: 'sekret' }).chat.completions.create({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 2 });
    assert.equal(ok.choices.length, 1);
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
  } finally {
    const { code } = await server.stop();
    assert.equal(code, 0);
  }
});
