// Chat completions through the official openai client: shapes, streaming, thinking switch,
// stop strings, logprobs, tools, and the /v1/completions and /v1/models endpoints.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, GREEDY, modelId, userTurn } from './lib.mjs';

const openai = client();

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

function joined(chunks, field) {
  return chunks.map((c) => c.choices[0]?.delta?.[field] ?? '').join('');
}

test('non-streaming chat completion has the OpenAI shape', async () => {
  const r = await openai.chat.completions.create({ ...GREEDY, messages: userTurn('Hello, how are you?'), max_tokens: 8 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.created, 'number');
  assert.equal(typeof r.model, 'string');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.equal(typeof (c.message.content ?? ''), 'string');
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
});

test('streaming gives the same answer as non-streaming, role first, usage last', async () => {
  const params = { ...GREEDY, messages: userTurn('Tell me about Paris.'), max_completion_tokens: 12 };
  const whole = await openai.chat.completions.create(params);
  const chunks = await collect(await openai.chat.completions.create({
    ...params, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks[0].object, 'chat.completion.chunk');
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.usage.prompt_tokens, whole.usage.prompt_tokens);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
  const finish = chunks.at(-2).choices[0];
  assert.equal(finish.finish_reason, whole.choices[0].finish_reason);
  for (const c of chunks.slice(0, -2)) assert.equal(c.choices[0].finish_reason, null);
  assert.equal(joined(chunks, 'reasoning_content'), whole.choices[0].message.reasoning_content ?? '');
  assert.equal(joined(chunks, 'content'), whole.choices[0].message.content ?? '');
});

test('without include_usage there is no usage chunk', async () => {
  const chunks = await collect(await openai.chat.completions.create({
    ...GREEDY, messages: userTurn('Hi'), max_tokens: 4, stream: true,
  }));
  assert.ok(chunks.every((c) => c.choices.length === 1 && c.usage === undefined));
});

test('reasoning_effort none and enable_thinking false turn thinking off', async () => {
  const base = { ...GREEDY, messages: userTurn('What is two plus two?'), max_tokens: 10 };
  const a = await openai.chat.completions.create({ ...base, reasoning_effort: 'none' });
  const b = await openai.chat.completions.create({ ...base, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(a.choices[0].message.reasoning_content, undefined);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const on = await openai.chat.completions.create(base);
  assert.ok(on.usage.prompt_tokens < a.usage.prompt_tokens, 'the thinking-off prompt closes an empty think block');
});

// Issue 18 (6): completion_tokens_details.reasoning_tokens, and `reasoning` beside
// `reasoning_content` (vLLM's and OpenRouter's name), streamed and not.
test('reasoning tokens are counted, and reasoning is also sent as `reasoning`', async () => {
  const base = { ...GREEDY, messages: userTurn('What is two plus two?'), max_tokens: 10 };
  const on = await openai.chat.completions.create(base);
  const message = on.choices[0].message;
  assert.ok(message.reasoning_content.length > 0);
  assert.equal(message.reasoning, message.reasoning_content);
  // The random test model never closes its reasoning: every token is a reasoning token.
  assert.equal(on.usage.completion_tokens_details.reasoning_tokens, on.usage.completion_tokens);
  const off = await openai.chat.completions.create({ ...base, reasoning_effort: 'none' });
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
  assert.equal(off.choices[0].message.reasoning, undefined);

  const chunks = await collect(await openai.chat.completions.create({
    ...base, stream: true, stream_options: { include_usage: true },
  }));
  assert.equal(joined(chunks, 'reasoning'), message.reasoning_content);
  for (const c of chunks) {
    const d = c.choices[0]?.delta;
    if (d?.reasoning_content !== undefined) assert.equal(d.reasoning, d.reasoning_content);
  }
  assert.deepEqual(chunks.at(-1).usage.completion_tokens_details, on.usage.completion_tokens_details);
});

test('a stop string ends the answer and never shows, streamed or not', async () => {
  const base = { ...GREEDY, messages: userTurn('Count to ten.'), max_tokens: 40, reasoning_effort: 'none' };
  const full = (await openai.chat.completions.create(base)).choices[0].message.content;
  assert.ok(full.length >= 8, `answer too short to cut: ${JSON.stringify(full)}`);
  const stop = full.slice(4, 7);
  const expected = full.slice(0, full.indexOf(stop));
  const cut = await openai.chat.completions.create({ ...base, stop });
  assert.equal(cut.choices[0].message.content, expected);
  assert.equal(cut.choices[0].finish_reason, 'stop');
  const chunks = await collect(await openai.chat.completions.create({ ...base, stop: [stop, 'never-seen'], stream: true }));
  assert.equal(joined(chunks, 'content'), expected);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
});

test('logprobs and top_logprobs', async () => {
  const r = await openai.chat.completions.create({
    ...GREEDY, messages: userTurn('Hi'), max_tokens: 5, logprobs: true, top_logprobs: 3, reasoning_effort: 'none',
  });
  const lp = r.choices[0].logprobs.content;
  assert.ok(lp.length >= 1 && lp.length <= 5);
  for (const t of lp) {
    assert.equal(typeof t.token, 'string');
    assert.ok(t.logprob <= 0);
    assert.ok(Array.isArray(t.bytes));
    assert.equal(t.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5);
  }
});

// city bounded: under tool_choice required / named the grammar writes the call, and a random
// model ends a bounded string (an unbounded one it may not end within max_tokens).
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] },
  },
};

// A call cut off by max_tokens (the random model never closes one) ends with "length".
function checkToolCalls(message, finishReason) {
  assert.ok(['tool_calls', 'length'].includes(finishReason), finishReason);
  for (const call of message.tool_calls) {
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');
  }
}

test('tools with tool_choice auto, none, required and a named function', async () => {
  const trained = (await modelId()) === 'lily-tiny';
  const messages = userTurn('What is the weather in Oslo?');
  for (const tool_choice of ['auto', 'none', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await openai.chat.completions.create({
      ...GREEDY, messages, tools: [weatherTool], tool_choice, max_tokens: 150, reasoning_effort: 'none',
      parallel_tool_calls: false,  // one call: a random model given more would call on to max_tokens
    });
    const { message, finish_reason } = r.choices[0];
    if (tool_choice === 'none') {
      assert.equal(message.tool_calls, undefined);
      assert.ok(!message.content.includes('<tool_call>'));
    } else if (message.tool_calls) {
      checkToolCalls(message, finish_reason);
      if (trained) assert.equal(finish_reason, 'tool_calls');
      if (typeof tool_choice === 'object') assert.equal(message.tool_calls[0].function.name, 'get_weather');
    } else {
      // required / named: the grammar writes a call whatever the model (structured_output.test.mjs).
      assert.ok(!trained && tool_choice === 'auto', `no tool call with tool_choice ${JSON.stringify(tool_choice)}`);
    }
  }
});

// Issue 18 (2): the arguments stream as the model writes them, and add up to the same bytes as
// the call returned whole.
test('streamed tool calls: a header delta with id and name, then the arguments in pieces', async () => {
  const params = {
    ...GREEDY, messages: userTurn('What is the weather in Oslo?'), tools: [weatherTool],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 150, reasoning_effort: 'none',
  };
  const whole = await openai.chat.completions.create(params);
  const chunks = await collect(await openai.chat.completions.create({ ...params, stream: true }));
  const calls = [];
  let pieces = 0;
  for (const c of chunks) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.type, 'function');
        assert.equal(d.function.arguments, '');
        calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
      } else {
        calls[d.index].arguments += d.function.arguments;
        pieces += 1;
      }
    }
  }
  const expected = whole.choices[0].message.tool_calls ?? [];
  assert.equal(expected.length, 1, 'the named choice makes one call');
  assert.equal(calls.length, expected.length);
  assert.ok(pieces >= 2, 'the arguments open when the call starts and close when it ends');
  calls.forEach((c, i) => {
    assert.equal(c.name, expected[i].function.name);
    assert.equal(c.arguments, expected[i].function.arguments);
  });
  assert.equal(joined(chunks, 'content'), whole.choices[0].message.content ?? '');
  assert.equal(chunks.at(-1).choices[0].finish_reason, whole.choices[0].finish_reason);
});

test('unknown fields are ignored', async () => {
  const r = await openai.chat.completions.create({
    ...GREEDY, messages: userTurn('Hi'), max_tokens: 2, user: 'someone', store: false, metadata: { a: 'b' },
    service_tier: 'auto', prompt_cache_key: 'k', some_future_field: { x: 1 },
  });
  assert.equal(r.choices.length, 1);
});

test('n > 1 is refused with a 400 that says so', async () => {
  await assert.rejects(
    openai.chat.completions.create({ ...GREEDY, messages: userTurn('Hi'), n: 2 }),
    (e) => e.status === 400 && e.param === 'n' && /one choice/.test(e.message),
  );
});

test('/v1/completions: raw prompt, token ids, streaming', async () => {
  const r = await openai.completions.create({ ...GREEDY, prompt: 'Once upon a time', max_tokens: 6 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  const ids = await openai.completions.create({ ...GREEDY, prompt: [72, 101, 108, 108, 111], max_tokens: 3 });
  assert.equal(ids.usage.prompt_tokens, 5);
  let text = '';
  const stream = await openai.completions.create({ ...GREEDY, prompt: 'Once upon a time', max_tokens: 6, stream: true });
  for await (const c of stream) text += c.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
  const lp = await openai.completions.create({ ...GREEDY, prompt: 'Hello', max_tokens: 3, logprobs: 2 });
  assert.equal(lp.choices[0].logprobs.top_logprobs[0] && Object.keys(lp.choices[0].logprobs.top_logprobs[0]).length <= 2, true);
});

test('/v1/models lists the model', async () => {
  const models = await openai.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
  const one = await openai.models.retrieve(models.data[0].id);
  assert.equal(one.id, models.data[0].id);
});
