// Issue 17, hostile request content: every case gets its documented 4xx answer and the server
// keeps serving (each test ends with a well-formed request that must still be answered).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, client, GREEDY, modelId, postJson, startServer, userTurn } from './lib.mjs';

function assertError(r, status, param, message) {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(r.json.error.type, 'invalid_request_error', r.text);
  if (param !== undefined) assert.equal(r.json.error.param, param, r.text);
  if (message !== undefined) assert.match(r.json.error.message, message, r.text);
}

// The server is alive and answers a normal request correctly.
async function stillServing(base = BASE) {
  const health = await fetch(`${base}/health`);
  assert.equal(health.status, 200);
  const r = await client(base).chat.completions.create({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 2 });
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
}

const nested = (levels) => '['.repeat(levels) + ']'.repeat(levels);

test('JSON nested 25,000 levels deep is a 400, not a crash (issue 17, 1)', async () => {
  // ~50 KB: inside tools[].function.parameters ...
  const inTools = `{"model": "test", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"p": {"default": ${nested(25000)}}}}}}]}`;
  assertError(await postJson('/v1/chat/completions', inTools), 400, null, /nests JSON deeper than 128 levels/);
  // ... inside tool_calls[].function.arguments, a JSON string the template parses ...
  const args = `{"a": ${nested(25000)}}`;
  const inArguments = {
    model: 'test', max_tokens: 2,
    messages: [
      { role: 'user', content: 'x' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: args } }] },
      { role: 'tool', tool_call_id: 'c', content: 'ok' },
    ],
  };
  assertError(await postJson('/v1/chat/completions', inArguments), 400, 'messages',
    /messages\[1\]\.tool_calls\[0\]\.function\.arguments nests JSON deeper than 128 levels/);
  // ... and on /v1/completions.
  assertError(await postJson('/v1/completions', `{"prompt": "x", "extra": ${nested(25000)}}`), 400, null,
    /nests JSON deeper/);
  // A realistic schema, a few dozen levels deep, is fine.
  let schema = { type: 'string' };
  for (let i = 0; i < 30; ++i) schema = { type: 'array', items: schema };
  const ok = await postJson('/v1/chat/completions', {
    ...GREEDY, max_tokens: 2, messages: userTurn('x'),
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { p: schema } } } }],
  });
  assert.equal(ok.status, 200, ok.text);
  await stillServing();
});

test('a number beyond a double is a 400 wherever it is (issue 17, 9)', async () => {
  const bodies = [
    '{"model": "test", "messages": [{"role": "user", "content": "x"}], "temperature": 1e309}',
    '{"model": "test", "messages": [{"role": "user", "content": "x", "name": [1, -1e400]}], "max_tokens": 2}',
    '{"model": "test", "messages": [{"role": "user", "content": "x"}], "metadata": {"n": 1E999}, "max_tokens": 2}',
    `{"model": "test", "messages": [{"role": "user", "content": "x"}], "seed": 1${'0'.repeat(400)}}`,
  ];
  for (const body of bodies) {
    assertError(await postJson('/v1/chat/completions', body), 400, null, /number out of range/);
  }
  assertError(await postJson('/v1/completions', '{"prompt": "x", "top_p": -1e309}'), 400, null, /number out of range/);
  await stillServing();
});

test('image and audio parts are refused: lily has no vision or audio encoder (issue 17, 8)', async () => {
  const image = { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } };
  let r = await postJson('/v1/chat/completions', {
    model: 'test', max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, image] }],
  });
  assertError(r, 400, 'messages', /^lily has no vision encoder: image inputs are refused/);
  assert.match(r.json.error.message, /messages\[0\]\.content\[1\]/);
  // The openai client sees a BadRequestError, not a 200 that never looked at the image.
  await assert.rejects(
    client().chat.completions.create({ ...GREEDY, max_tokens: 2, messages: [{ role: 'user', content: [image] }] }),
    (e) => e.status === 400 && /no vision encoder/.test(e.message));
  r = await postJson('/v1/chat/completions', {
    model: 'test', max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }] }],
  });
  assertError(r, 400, 'messages', /^lily has no audio encoder: audio inputs are refused/);
  await stillServing();
});

test('an unknown role is a 400 naming it, best_of > 1 on chat is refused (issue 17, 12)', async () => {
  let r = await postJson('/v1/chat/completions', { model: 'test', messages: [{ role: 'narrator', content: 'x' }] });
  assertError(r, 400, 'messages', /messages\[0\]\.role "narrator" is not a role lily knows/);
  r = await postJson('/v1/chat/completions', { model: 'test', messages: userTurn('x'), best_of: 2 });
  assertError(r, 400, 'best_of', /best_of must be 1/);
  r = await postJson('/v1/chat/completions', { ...GREEDY, messages: userTurn('x'), best_of: 1, max_tokens: 2 });
  assert.equal(r.status, 200, r.text);
  await stillServing();
});

// The trained model writes real calls. With several tools, tool_choice "required" used to force
// "<tool_call>\n<function=" (a lone "=" token) and got "_currency" back, a function not in tools.
// Under the tool-call grammar (issue 18) the reply is always a call to one of them.
test('tool_choice "required" with several tools returns only functions in tools (issue 17, 4)', async () => {
  const server = (await modelId()) === 'lily-tiny' ? null : await startServer([], { defaultModel: true });
  try {
    const base = server ? server.url : BASE;
    const model = await modelId(base);
    const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
    const tools = ['get_weather', 'get_time', 'convert_currency'].map((name) => (
      { type: 'function', function: { name, description: name.replace('_', ' '), parameters: city } }));
    const names = new Set(tools.map((t) => t.function.name));
    for (const question of ['Convert 20 euros to dollars', "What's the weather in Lima?", 'What time is it in Oslo?']) {
      for (const thinking of [false, true]) {
        const r = await client(base).chat.completions.create({
          model, temperature: 0, max_tokens: 160, tools, tool_choice: 'required',
          chat_template_kwargs: { enable_thinking: thinking }, messages: userTurn(question),
        });
        const { message, finish_reason } = r.choices[0];
        assert.ok(message.tool_calls?.length > 0, `${question}, thinking ${thinking}: no call: ${message.content}`);
        for (const call of message.tool_calls) {
          assert.ok(names.has(call.function.name), `${question}: a call to ${call.function.name}, not in tools`);
          assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');
        }
        assert.equal(finish_reason, 'tool_calls');
        console.log(`  required, thinking ${thinking}: ${question} -> ` +
          `${(message.tool_calls ?? []).map((c) => c.function.name).join(', ') || JSON.stringify(message.content)}`);
      }
    }
    await stillServing(base);
  } finally {
    if (server) await server.stop();
  }
});
