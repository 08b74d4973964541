// The trained default model (models/lily-tiny) through `lily serve` and the official openai
// client, thinking on (the default), greedy: held-out arithmetic and held-out tool calls
// (a sample of models/lily-tiny/heldout.json, copied below). Runs on the server
// run_node_tests.sh started when that one serves lily-tiny (LILY_TEST_MODEL=models/lily-tiny);
// otherwise it starts `lily serve` without -m, which serves the embedded lily-tiny.
//
// Issue 5's bar: >= 80% held-out arithmetic, >= 2 of 3 exact held-out tool calls. The committed
// model measures 129/150 = 86% and 5/6 on all held-out questions (run_heldout_eval.sh); this
// sample of 12 must reach 75%, and 2 of these 3 tool calls must be exact.
// tests/e2e/test_lily_tiny.cpp does the same through the ChatService, on more questions.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { client, modelId, startServer } from './lib.mjs';

// [question, expected answer]: held-out pairs ((7a + 13b) % 10 == 0) from heldout.json, every
// 12.5th of its 150 thinking-on questions (spread over the file, like tests/e2e's sample).
const ARITHMETIC = [
  ['Compute 947+377', '1324'],
  ['Please add 997 to 707.', '1704'],
  ['Calculate 912 - 2.', '910'],
  ['How much is 9-739?', '-730'],
  ['What is 130 plus 240?', '370'],
  ['678 + 238 = ?', '916'],
  ['Compute 648+8', '656'],
  ['What is 125 plus 75?', '200'],
  ['Subtract 990 from 630.', '-360'],
  ['What is 206 minus 46?', '160'],
  ["What's the sum of 24 and 474?", '498'],
  ['How much is 35+45?', '80'],
];
const ARITHMETIC_FLOOR = 0.75;  // on these 12 (issue 5's bar on all 150 held-out questions: 0.8)

// [question, expected city]: cities never seen in training.
const TOOL_CALLS = [
  ["What's the weather in Reykjavik?", 'Reykjavik'],
  ['What is the weather like in Montevideo today?', 'Montevideo'],
  ["How's the weather in Windhoek?", 'Windhoek'],
];
const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Get the current weather in a city', parameters: city } },
  { type: 'function', function: { name: 'get_time', description: 'Get the local time in a city', parameters: city } },
];

let server = null;  // the lily-tiny server this file started, if any
let openai = null;
let model = null;

before(async () => {
  let base;
  if ((await modelId()) !== 'lily-tiny') {
    server = await startServer([], { defaultModel: true });
    base = server.url;
  }
  openai = base ? client(base) : client();
  model = await modelId(base);
  assert.equal(model, 'lily-tiny');
});

after(async () => { if (server) await server.stop(); });

function lastInteger(text) {
  const all = (text ?? '').match(/-?[0-9]+/g);
  return all ? all.at(-1) : null;
}

test('lily-tiny: held-out arithmetic with thinking on', async () => {
  let right = 0;
  for (const [question, expected] of ARITHMETIC) {
    const r = await openai.chat.completions.create({
      model, temperature: 0, max_tokens: 320, messages: [{ role: 'user', content: question }],
    });
    const { message, finish_reason } = r.choices[0];
    assert.equal(finish_reason, 'stop');
    assert.equal(message.role, 'assistant');
    assert.equal(typeof message.reasoning_content, 'string');
    assert.ok(message.reasoning_content.length > 0, 'thinking is on by default: reasoning expected');
    assert.ok(!/<\/?think>/.test(message.reasoning_content + message.content));
    assert.equal(message.tool_calls, undefined);
    const got = lastInteger(message.content);
    if (got === expected) right += 1;
    else console.log(`  wrong: ${question} expected ${expected}, content ${JSON.stringify(message.content)}`);
  }
  const accuracy = right / ARITHMETIC.length;
  console.log(`lily-tiny through lily serve + openai client: held-out arithmetic ${right}/${ARITHMETIC.length} = ` +
    `${(100 * accuracy).toFixed(1)}% (regression floor ${100 * ARITHMETIC_FLOOR}%; issue 5's bar 80%: ` +
    `${accuracy >= 0.8 ? 'met' : 'not met'})`);
  assert.ok(accuracy >= ARITHMETIC_FLOOR, `accuracy ${accuracy} below the regression floor ${ARITHMETIC_FLOOR}`);
});

test('lily-tiny: held-out tool calls with thinking on', async () => {
  let exact = 0;
  for (const [question, expectedCity] of TOOL_CALLS) {
    const r = await openai.chat.completions.create({
      model, temperature: 0, max_tokens: 320, tools: TOOLS, messages: [{ role: 'user', content: question }],
    });
    const { message, finish_reason } = r.choices[0];
    assert.equal(finish_reason, 'tool_calls', JSON.stringify(message));
    assert.ok(message.reasoning_content.length > 0);
    assert.equal(message.tool_calls.length, 1);
    const call = message.tool_calls[0];
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    const args = JSON.parse(call.function.arguments);
    assert.deepEqual(Object.keys(args), ['city']);
    assert.equal(typeof args.city, 'string');
    assert.ok(!(message.content ?? '').includes('<tool_call>'));
    if (args.city === expectedCity) exact += 1;
    console.log(`  ${question} -> get_weather(${call.function.arguments})` +
      `${args.city === expectedCity ? '' : ` expected ${expectedCity}`}`);
  }
  console.log(`lily-tiny through lily serve + openai client: held-out tool calls ${exact}/${TOOL_CALLS.length} exact ` +
    `(issue 5's bar: 2 of 3)`);
  assert.ok(3 * exact >= 2 * TOOL_CALLS.length, `${exact} of ${TOOL_CALLS.length} exact tool calls`);
});

// Issue 18 (2): a streamed call's arguments arrive as the model writes them, and add up to the
// bytes of the call returned whole.
test('lily-tiny: a streamed tool call, its arguments in pieces, the same bytes', async () => {
  const params = {
    model, temperature: 0, max_tokens: 320, tools: TOOLS, messages: [{ role: 'user', content: TOOL_CALLS[0][0] }],
  };
  const whole = (await openai.chat.completions.create(params)).choices[0].message.tool_calls;
  assert.equal(whole.length, 1);
  const stream = await openai.chat.completions.create({ ...params, stream: true });
  const pieces = [];
  for await (const chunk of stream) {
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      if (d.id) assert.equal(d.function.name, whole[0].function.name);
      else pieces.push(d.function.arguments);
    }
  }
  assert.ok(pieces.length > 3, `the arguments came in ${pieces.length} piece(s)`);
  assert.equal(pieces.join(''), whole[0].function.arguments);
});
