// OpenAI's Responses API (/v1/responses) through the official openai client's
// responses.create: the response object, the streamed events (in order, with sequence
// numbers, the streamed response equal to the created one), reasoning on and off, refusals of
// a stateless server, and a function-call round trip on the trained model (lily-tiny):
// function_call -> function_call_output -> answer, the arguments streamed in pieces that add up
// to the created call's arguments, byte for byte.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { client, modelId, startServer } from './lib.mjs';

const openai = client();
const GREEDY = { model: 'test', temperature: 0 };

async function collect(stream) {
  const events = [];
  for await (const e of stream) events.push(e);
  return events;
}

// The events of a stream, checked: sequence numbers 0, 1, ...; created and in_progress first,
// completed (or incomplete) last; every item added before its deltas and done after them.
function checkOrder(events) {
  events.forEach((e, i) => assert.equal(e.sequence_number, i, e.type));
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type), events.at(-1).type);
  const open = new Map();  // output_index -> item id
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') open.set(e.output_index, e.item.id);
    else if (e.type === 'response.output_item.done') {
      assert.equal(open.get(e.output_index), e.item.id);
      open.delete(e.output_index);
    } else {
      assert.equal(open.get(e.output_index), e.item_id, `${e.type} outside its item`);
    }
  }
  assert.equal(open.size, 0);
}

// The output without the item ids (each response makes its own).
function withoutIds(output) {
  return output.map(({ id, ...rest }) => rest);
}

test('responses.create: the response object, reasoning on and off', async () => {
  const on = await openai.responses.create({ ...GREEDY, input: 'Hello, how are you?', max_output_tokens: 12 });
  assert.match(on.id, /^resp_/);
  assert.equal(on.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(on.status));
  if (on.status === 'incomplete') assert.equal(on.incomplete_details.reason, 'max_output_tokens');
  assert.equal(on.store, false);
  assert.equal(on.max_output_tokens, 12);
  // The random test model never closes its reasoning: all of it is a reasoning item.
  assert.equal(on.output[0].type, 'reasoning');
  assert.equal(on.output[0].content[0].type, 'reasoning_text');
  assert.equal(on.usage.output_tokens_details.reasoning_tokens, on.usage.output_tokens);
  assert.equal(on.usage.total_tokens, on.usage.input_tokens + on.usage.output_tokens);
  assert.equal(typeof on.usage.input_tokens_details.cached_tokens, 'number');

  const off = await openai.responses.create({
    ...GREEDY, input: [{ role: 'user', content: 'Hello, how are you?' }], instructions: 'Be brief.',
    max_output_tokens: 12, reasoning: { effort: 'none' },
  });
  assert.ok(!off.output.some((item) => item.type === 'reasoning'));
  assert.equal(off.output[0].type, 'message');
  assert.equal(off.output[0].role, 'assistant');
  assert.equal(off.output[0].content[0].type, 'output_text');
  assert.deepEqual(off.output[0].content[0].annotations, []);
  assert.equal(off.output_text, off.output[0].content[0].text);
  assert.equal(off.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(off.instructions, 'Be brief.');
});

test('streamed: events in order with sequence numbers, the same response as create', async () => {
  for (const reasoning of [{ effort: 'none' }, { effort: 'medium' }]) {
    const params = { ...GREEDY, input: 'Tell me about Oslo.', max_output_tokens: 16, reasoning };
    const whole = await openai.responses.create(params);
    const events = await collect(await openai.responses.create({ ...params, stream: true }));
    checkOrder(events);
    const done = events.at(-1).response;
    assert.deepEqual(withoutIds(done.output), withoutIds(whole.output));
    assert.deepEqual(done.usage.output_tokens, whole.usage.output_tokens);
    const deltas = (type) => events.filter((e) => e.type === type).map((e) => e.delta).join('');
    const text = whole.output.find((item) => item.type === 'message')?.content[0].text ?? '';
    assert.equal(deltas('response.output_text.delta'), text);
    const thought = whole.output.find((item) => item.type === 'reasoning')?.content[0]?.text ?? '';
    assert.equal(deltas('response.reasoning_text.delta'), thought);
  }
});

// text.format json_schema: the reply is held to the schema by constrained decoding (issue 18), as
// response_format on chat completions; streamed and not, the output text parses and fits.
test('text.format json_schema holds the output text to the schema', async () => {
  const schema = {
    type: 'object', additionalProperties: false, required: ['unit', 'days'],
    properties: { unit: { enum: ['C', 'F'] }, days: { type: 'array', items: { enum: [1, 2, 3] }, minItems: 1, maxItems: 3 } },
  };
  const params = {
    ...GREEDY, input: 'Weather for the next days?', max_output_tokens: 200, reasoning: { effort: 'none' },
    text: { format: { type: 'json_schema', name: 'forecast', strict: true, schema } },
  };
  const check = (text) => {
    const value = JSON.parse(text);
    assert.deepEqual(Object.keys(value).sort(), ['days', 'unit']);
    assert.ok(['C', 'F'].includes(value.unit), text);
    assert.ok(value.days.length >= 1 && value.days.length <= 3 && value.days.every((d) => [1, 2, 3].includes(d)), text);
  };
  const whole = await openai.responses.create(params);
  assert.equal(whole.status, 'completed');
  assert.equal(whole.text.format.type, 'json_schema');
  check(whole.output_text);
  const events = [];
  for await (const e of await openai.responses.create({ ...params, stream: true })) events.push(e);
  const streamed = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  check(streamed);
  assert.equal(streamed, whole.output_text);
});

test('a stateless server refuses what needs a store', async () => {
  const cases = [
    [{ previous_response_id: 'resp_0123' }, /previous_response_id/],
    [{ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'string', pattern: 'a+' } } } },
      /text.format: json_schema: unsupported keyword 'pattern'/],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, /item_reference/],
    [{ tools: [{ type: 'web_search' }] }, /hosted tool/],
  ];
  for (const [extra, message] of cases) {
    await assert.rejects(openai.responses.create({ ...GREEDY, input: 'x', ...extra }), (e) => {
      assert.equal(e.status, 400, e.message);
      assert.equal(e.error.type, 'invalid_request_error');
      assert.match(e.message, message);
      return true;
    });
  }
});

// ---- function calls on the trained model ----

let tiny = null;
let tinyClient = null;

before(async () => {
  if ((await modelId()) === 'lily-tiny') {
    tinyClient = openai;
  } else {
    tiny = await startServer([], { defaultModel: true });
    tinyClient = client(tiny.url);
  }
});

after(async () => { if (tiny) await tiny.stop(); });

const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const TOOLS = [
  { type: 'function', name: 'get_weather', description: 'Get the current weather in a city', parameters: city, strict: false },
  { type: 'function', name: 'get_time', description: 'Get the local time in a city', parameters: city, strict: false },
];

test('lily-tiny: a function-call round trip, streamed and not', async () => {
  const params = { model: 'lily-tiny', temperature: 0, max_output_tokens: 320, tools: TOOLS };
  const input = [{ role: 'user', content: "What's the weather in Windhoek?" }];
  const first = await tinyClient.responses.create({ ...params, input });
  assert.equal(first.status, 'completed');
  const call = first.output.find((item) => item.type === 'function_call');
  assert.ok(call, JSON.stringify(first.output));
  assert.match(call.call_id, /^call_/);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(Object.keys(JSON.parse(call.arguments)), ['city']);
  assert.equal(first.output[0].type, 'reasoning');

  const events = await collect(await tinyClient.responses.create({ ...params, input, stream: true }));
  checkOrder(events);
  const pieces = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta);
  assert.ok(pieces.length > 1, `the arguments came in ${pieces.length} piece(s)`);
  assert.equal(pieces.join(''), call.arguments);  // the same bytes
  assert.equal(events.find((e) => e.type === 'response.function_call_arguments.done').arguments, call.arguments);

  const answer = await tinyClient.responses.create({
    ...params,
    input: [...input, ...first.output, { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 31, "sky": "clear"}' }],
  });
  assert.equal(answer.status, 'completed');
  assert.ok(!answer.output.some((item) => item.type === 'function_call'), JSON.stringify(answer.output));
  assert.ok(answer.output_text.length > 0, JSON.stringify(answer.output));
  console.log(`  lily-tiny via /v1/responses: get_weather(${call.arguments}) -> ${JSON.stringify(answer.output_text)}`);
});
