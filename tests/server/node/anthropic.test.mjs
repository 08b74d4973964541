// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official
// @anthropic-ai/sdk client: the message shape, streamed events in Anthropic's order (the
// streamed message equal to the created one), thinking on and off, stop sequences,
// count_tokens against a create's input, errors in Anthropic's shape (bad requests, --api-key
// through x-api-key), and a tool-use round trip on the trained model (lily-tiny): tool_use ->
// tool_result -> answer, its input streamed as input_json_delta pieces that add up to the
// created call's input.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { BASE, modelId, postJson, startServer } from './lib.mjs';

function anthropic(base = BASE, options = {}) {
  return new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60_000, ...options });
}

const claude = anthropic();
const MODEL = 'claude-test';
const GREEDY = { model: MODEL, temperature: 0 };
const user = (text) => [{ role: 'user', content: text }];

// The stream's events, checked against Anthropic's grammar: message_start, then blocks
// (content_block_start, deltas of the block's kind, content_block_stop) with indexes 0, 1, ...,
// message_delta, message_stop.
async function checkedEvents(stream) {
  const events = [];
  for await (const e of stream) events.push(e);
  assert.equal(events[0].type, 'message_start');
  assert.equal(events.at(-2).type, 'message_delta');
  assert.equal(events.at(-1).type, 'message_stop');
  let open = null, next = 0;
  const deltaKinds = { text: ['text_delta'], thinking: ['thinking_delta', 'signature_delta'], tool_use: ['input_json_delta'] };
  for (const e of events.slice(1, -2)) {
    if (e.type === 'content_block_start') {
      assert.equal(open, null, 'a block starts inside another');
      assert.equal(e.index, next++);
      open = e;
    } else if (e.type === 'content_block_delta') {
      assert.ok(open, 'a delta outside a block');
      assert.equal(e.index, open.index);
      assert.ok(deltaKinds[open.content_block.type].includes(e.delta.type), `${e.delta.type} in ${open.content_block.type}`);
    } else {
      assert.equal(e.type, 'content_block_stop', `unexpected ${e.type}`);
      assert.equal(e.index, open.index);
      open = null;
    }
  }
  assert.equal(open, null);
  return events;
}

test('create: an Anthropic message, thinking off by default', async () => {
  const r = await claude.messages.create({ ...GREEDY, max_tokens: 12, messages: user('Hello, how are you?') });
  assert.match(r.id, /^msg_/);
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(typeof r.model, 'string');
  assert.ok(['end_turn', 'max_tokens'].includes(r.stop_reason), r.stop_reason);
  assert.equal(r.stop_sequence, null);
  assert.ok(r.content.every((b) => b.type === 'text'), JSON.stringify(r.content));
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 12);
  assert.ok(r.usage.input_tokens + r.usage.cache_read_input_tokens > 0);
  assert.equal(r.usage.cache_creation_input_tokens, 0);
  if (r.stop_reason === 'max_tokens') assert.equal(r.usage.output_tokens, 12);
});

test('stream: events in Anthropic order, the same message as create', async () => {
  for (const thinking of [{ type: 'disabled' }, { type: 'enabled', budget_tokens: 1024 }]) {
    const params = { ...GREEDY, max_tokens: 16, messages: user('Tell me about Oslo.'), thinking, system: 'Be brief.' };
    const whole = await claude.messages.create(params);
    const stream = claude.messages.stream(params);
    const events = await checkedEvents(stream);
    const streamed = await stream.finalMessage();
    assert.deepEqual(streamed.content, whole.content);
    assert.equal(streamed.stop_reason, whole.stop_reason);
    assert.equal(streamed.usage.output_tokens, whole.usage.output_tokens);
    assert.equal(streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens,
      whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
    const kinds = whole.content.map((b) => b.type);
    if (thinking.type === 'enabled') {
      // The random test model never closes its thinking: one thinking block, with a signature.
      assert.equal(kinds[0], 'thinking', JSON.stringify(kinds));
      assert.match(whole.content[0].signature, /^lily-/);
      assert.ok(events.some((e) => e.delta?.type === 'signature_delta'));
    } else {
      assert.ok(!kinds.includes('thinking'), JSON.stringify(kinds));
    }
  }
});

test('stop_sequences: stop_reason stop_sequence, the text cut before it', async () => {
  const params = { ...GREEDY, max_tokens: 30, messages: user('Count to ten.') };
  const full = await claude.messages.create(params);
  const text = full.content.map((b) => b.text ?? '').join('');
  const chars = Array.from(text);  // whole characters
  assert.ok(chars.length >= 8, text);
  const stop = chars.slice(4, 7).join('');
  const r = await claude.messages.create({ ...params, stop_sequences: [stop] });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  // (trailing whitespace before the stop is trimmed, as at any end of the text)
  assert.equal(r.content.map((b) => b.text ?? '').join(''), text.slice(0, text.indexOf(stop)).trimEnd());
});

test('count_tokens equals the input of a create with the same fields', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  for (const thinking of [undefined, { type: 'enabled', budget_tokens: 2000 }]) {
    const params = { messages: user('What is the weather in Bergen today?'), system: 'You help.', tools, ...(thinking && { thinking }) };
    const counted = await claude.messages.countTokens({ model: MODEL, ...params });
    const r = await claude.messages.create({ ...GREEDY, max_tokens: 1, ...params });
    assert.equal(counted.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens);
  }
  const short = await claude.messages.countTokens({ model: MODEL, messages: user('Hi') });
  const long = await claude.messages.countTokens({ model: MODEL, messages: user('Hi there, how are you today?') });
  assert.ok(long.input_tokens > short.input_tokens);
});

test('errors come as Anthropic errors', async () => {
  const cases = [
    [{ model: MODEL, messages: user('x') }, /max_tokens is required/],
    [{ model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }, /vision/],
    [{ model: MODEL, max_tokens: 5, messages: user('x'), tools: [{ name: 'f', input_schema: { type: 'object' } }], tool_choice: { type: 'tool', name: 'g' } }, /not in tools/],
    [{ model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'tool_use', id: 't', name: 'f', input: {} }] }] }, /tool_use/],
  ];
  for (const [params, message] of cases) {
    await assert.rejects(claude.messages.create(params), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, `${e.constructor.name}: ${e.message}`);
      assert.equal(e.status, 400);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.match(e.error.error.message, message);
      return true;
    });
  }
  // Malformed JSON, an unknown route, the wrong method: Anthropic's shape too.
  const bad = await postJson('/v1/messages', '{"max_tokens": ');
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.type, 'invalid_request_error');
  const missing = await postJson('/v1/messages/nothing', {});
  assert.equal(missing.status, 404);
  assert.deepEqual(Object.keys(missing.json), ['type', 'error']);
  assert.equal(missing.json.error.type, 'not_found_error');
});

test('--api-key: the key from x-api-key; a wrong one is an authentication_error', async () => {
  const server = await startServer(['--api-key', 'sesame']);
  try {
    const params = { ...GREEDY, max_tokens: 2, messages: user('Hi') };
    await assert.rejects(anthropic(server.url, { apiKey: 'wrong' }).messages.create(params), (e) => {
      assert.ok(e instanceof Anthropic.AuthenticationError, e.constructor.name);
      assert.equal(e.error.error.type, 'authentication_error');
      return true;
    });
    await assert.rejects(anthropic(server.url, { apiKey: 'wrong' }).messages.countTokens({ model: MODEL, messages: user('Hi') }),
      Anthropic.AuthenticationError);
    const r = await anthropic(server.url, { apiKey: 'sesame' }).messages.create(params);
    assert.equal(r.type, 'message');
    const counted = await anthropic(server.url, { apiKey: 'sesame' }).messages.countTokens({ model: MODEL, messages: user('Hi') });
    assert.ok(counted.input_tokens > 0);
  } finally {
    await server.stop();
  }
});

// ---- tool use on the trained model ----

let tiny = null;  // the lily-tiny server this file started, if any
let tinyClient = null;

before(async () => {
  if ((await modelId()) === 'lily-tiny') {
    tinyClient = claude;
  } else {
    tiny = await startServer([], { defaultModel: true });
    tinyClient = anthropic(tiny.url);
  }
});

after(async () => { if (tiny) await tiny.stop(); });

const TOOLS = [
  { name: 'get_weather', description: 'Get the current weather in a city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  { name: 'get_time', description: 'Get the local time in a city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
];

test('lily-tiny: a tool-use round trip, tool_use -> tool_result -> answer, streamed and not', async () => {
  const question = user("What's the weather in Reykjavik?");
  const params = { ...GREEDY, max_tokens: 320, tools: TOOLS, thinking: { type: 'enabled', budget_tokens: 1024 } };
  const first = await tinyClient.messages.create({ ...params, messages: question });
  assert.equal(first.stop_reason, 'tool_use', JSON.stringify(first.content));
  const call = first.content.find((b) => b.type === 'tool_use');
  assert.match(call.id, /^toolu_/);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(Object.keys(call.input), ['city']);
  assert.equal(first.content[0].type, 'thinking');

  // Streamed: the input arrives in input_json_delta pieces that add up to the same input.
  const stream = tinyClient.messages.stream({ ...params, messages: question });
  const events = await checkedEvents(stream);
  const pieces = events.filter((e) => e.delta?.type === 'input_json_delta').map((e) => e.delta.partial_json);
  assert.ok(pieces.length > 1, `the input came in ${pieces.length} piece(s)`);
  assert.deepEqual(JSON.parse(pieces.join('')), call.input);
  const streamed = await stream.finalMessage();
  assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, call.input);
  assert.equal(streamed.stop_reason, 'tool_use');

  const answer = await tinyClient.messages.create({
    ...params,
    messages: [...question, { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: '{"temp": -3, "sky": "snow"}' }] }],
  });
  assert.equal(answer.stop_reason, 'end_turn', JSON.stringify(answer.content));
  const text = answer.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(text.length > 0, JSON.stringify(answer.content));
  assert.ok(!answer.content.some((b) => b.type === 'tool_use'));
  console.log(`  lily-tiny via /v1/messages: get_weather(${JSON.stringify(call.input)}) -> ${JSON.stringify(text)}`);
});

test('lily-tiny: tool_choice any and tool start a call; none never calls', async () => {
  const base = { ...GREEDY, max_tokens: 100, tools: TOOLS, messages: user('What time is it in Oslo?') };
  const any = await tinyClient.messages.create({ ...base, tool_choice: { type: 'any' } });
  for (const b of any.content.filter((b) => b.type === 'tool_use')) assert.ok(['get_weather', 'get_time'].includes(b.name));
  const named = await tinyClient.messages.create({ ...base, tool_choice: { type: 'tool', name: 'get_weather' } });
  assert.equal(named.content.find((b) => b.type === 'tool_use').name, 'get_weather');
  const none = await tinyClient.messages.create({ ...base, tool_choice: { type: 'none' } });
  assert.ok(!none.content.some((b) => b.type === 'tool_use'), JSON.stringify(none.content));
  assert.notEqual(none.stop_reason, 'tool_use');
});
