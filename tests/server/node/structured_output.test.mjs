// Structured outputs through the official openai client (issue 18): response_format json_schema
// on 26 schemas, each at temperature 0 and 1, streamed and not, every reply parsed and validated
// by the small JSON-schema validator below (written for this test, apart from lily's grammar
// code); json_object; tool_choice "required" (several tools, many seeds and temperatures: always
// a call to one of them, arguments valid for its parameters), a named function, and "none"
// (never tool markup); refusals as 400s naming the keyword; /v1/completions with a
// response_format; unbounded integers, numbers and strings and json_object replies that end
// (issue 40), and replies cut by max_tokens. JSON runs on the server run_node_tests.sh started (the random-weight tiny-chat
// fixture, thinking off: it never closes its reasoning; the schemas bound every string and list
// so that a random model finishes them). The trained lily-tiny (models/lily-tiny, started here
// unless it is that server's model) writes real tool calls and closes its reasoning.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { client, modelId, postJson, startServer, userTurn } from './lib.mjs';

// ---- a small JSON-schema validator: the keywords the schemas below use, nothing else ----

const ANNOTATIONS = new Set(['title', 'description', 'format', 'default', 'examples', '$defs', '$schema']);
const KEYWORDS = new Set(['type', 'properties', 'required', 'additionalProperties', 'enum', 'const', 'items',
  'minItems', 'maxItems', 'anyOf', 'oneOf', '$ref', 'minLength', 'maxLength', 'minimum', 'maximum', 'exclusiveMinimum',
  'exclusiveMaximum', 'multipleOf', ...ANNOTATIONS]);

function deepEqual(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => Object.hasOwn(b, k) && deepEqual(a[k], b[k]));
}

function typeOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;  // boolean, number, string, object
}

function hasType(v, t) {
  if (t === 'integer') return Number.isInteger(v);
  return typeOf(v) === t;
}

function resolve(root, ref) {
  assert.ok(ref.startsWith('#/'), `the validator follows local $refs only: ${ref}`);
  return ref.slice(2).split('/').reduce((node, part) => node[part.replaceAll('~1', '/').replaceAll('~0', '~')], root);
}

// The errors of `value` under `schema` (empty: valid), JSON Schema 2020-12 semantics.
function validate(schema, value, root = schema, at = '$') {
  if (schema === true) return [];
  if (schema === false) return [`${at}: no value is allowed`];
  for (const k of Object.keys(schema)) assert.ok(KEYWORDS.has(k), `the validator does not know '${k}'`);
  const errors = [];
  const fail = (why) => errors.push(`${at}: ${why} (${JSON.stringify(value)})`);
  if (schema.$ref) errors.push(...validate(resolve(root, schema.$ref), value, root, at));
  if (schema.anyOf && !schema.anyOf.some((s) => validate(s, value, root, at).length === 0)) fail('matches no anyOf option');
  if (schema.oneOf) {
    const n = schema.oneOf.filter((s) => validate(s, value, root, at).length === 0).length;
    if (n !== 1) fail(`matches ${n} oneOf options`);
  }
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => hasType(value, t))) fail(`not of type ${types.join(' or ')}`);
  }
  if (schema.enum && !schema.enum.some((e) => deepEqual(e, value))) fail('not in enum');
  if ('const' in schema && !deepEqual(schema.const, value)) fail('not the const');
  if (typeof value === 'number') {  // as JavaScript reads numbers: doubles
    if (schema.minimum !== undefined && !(value >= schema.minimum)) fail(`below ${schema.minimum}`);
    if (schema.maximum !== undefined && !(value <= schema.maximum)) fail(`above ${schema.maximum}`);
    if (schema.exclusiveMinimum !== undefined && !(value > schema.exclusiveMinimum)) fail(`not above ${schema.exclusiveMinimum}`);
    if (schema.exclusiveMaximum !== undefined && !(value < schema.exclusiveMaximum)) fail(`not below ${schema.exclusiveMaximum}`);
    if (schema.multipleOf !== undefined && !Number.isInteger(value / schema.multipleOf)) fail(`not a multiple of ${schema.multipleOf}`);
  }
  if (typeof value === 'string') {
    const length = [...value].length;  // code points
    if (schema.minLength !== undefined && length < schema.minLength) fail(`shorter than ${schema.minLength}`);
    if (schema.maxLength !== undefined && length > schema.maxLength) fail(`longer than ${schema.maxLength}`);
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) fail(`fewer than ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) fail(`more than ${schema.maxItems} items`);
    if (schema.items !== undefined) value.forEach((v, i) => errors.push(...validate(schema.items, v, root, `${at}[${i}]`)));
  }
  if (typeOf(value) === 'object') {
    const props = schema.properties ?? {};
    for (const r of schema.required ?? []) if (!Object.hasOwn(value, r)) fail(`misses '${r}'`);
    for (const [k, v] of Object.entries(value)) {
      if (Object.hasOwn(props, k)) errors.push(...validate(props[k], v, root, `${at}.${k}`));
      else if (schema.additionalProperties !== undefined) errors.push(...validate(schema.additionalProperties, v, root, `${at}.${k}`));
    }
  }
  return errors;
}

test('the validator itself tells valid from invalid', () => {
  const s = { type: 'object', properties: { a: { enum: [1, 'x'] }, b: { type: 'array', items: { type: 'integer' }, maxItems: 2 } },
    required: ['a'], additionalProperties: false };
  assert.deepEqual(validate(s, { a: 'x', b: [1, 2] }), []);
  for (const bad of [{}, { a: 2 }, { a: 1, b: [1.5] }, { a: 1, b: [1, 2, 3] }, { a: 1, c: 0 }, [], 'x']) {
    assert.ok(validate(s, bad).length > 0, JSON.stringify(bad));
  }
  assert.ok(validate({ type: 'string', maxLength: 2 }, 'été').length > 0);
  assert.deepEqual(validate({ type: 'string', maxLength: 3 }, 'été'), []);
  assert.ok(validate({ oneOf: [{ type: 'integer' }, { type: 'number' }] }, 3).length > 0);  // both match
  const r = { type: 'number', minimum: 0.5, exclusiveMaximum: 1 };
  assert.deepEqual(validate(r, 0.5), []);
  for (const bad of [0.4999, 1, 1.0000000000000001, -1]) assert.ok(validate(r, bad).length > 0, String(bad));
  assert.ok(validate({ type: 'integer', multipleOf: 5 }, 12).length > 0);
  assert.deepEqual(validate({ type: 'integer', multipleOf: 5, exclusiveMinimum: 0 }, 15), []);
});

// ---- the schemas: bounded, so that a random model finishes every one ----

const SCHEMAS = {
  flag: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] },
  color: { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, shade: { type: 'string', maxLength: 4 } },
    required: ['color'] },
  int_list: { type: 'array', items: { type: 'integer' }, minItems: 2, maxItems: 4 },
  three_levels: { type: 'object', properties: { a: { type: 'object', properties: { b: { type: 'object',
    properties: { c: { const: 'deep' } }, required: ['c'] } }, required: ['b'] } }, required: ['a'] },
  null_or_object: { anyOf: [{ type: 'null' }, { type: 'object', properties: { n: { enum: [1, 2.5, -3] } }, required: ['n'] }] },
  defs: { $defs: { pt: { type: 'object', properties: { x: { enum: [0, 1] }, y: { enum: [0, 1] } }, required: ['x', 'y'] } },
    type: 'object', properties: { from: { $ref: '#/$defs/pt' }, to: { $ref: '#/$defs/pt' } }, required: ['from', 'to'] },
  lengths: { type: 'object', properties: { id: { type: 'string', minLength: 3, maxLength: 3 },
    tags: { type: 'array', items: { enum: ['x', 'y'] }, maxItems: 2 }, extra: { type: ['boolean', 'null'] } },
  required: ['id', 'tags'] },
  short_string: { type: 'string', minLength: 1, maxLength: 6 },
  mixed_enum: { enum: ['a', 1, true, null] },
  const_object: { const: { k: [1, 2], s: 'é"\n' } },
  numbers: { type: 'object', properties: { count: { type: 'integer' }, ratio: { type: 'number' },
    status: { enum: ['open', 'closed'] } }, required: ['count', 'ratio', 'status'] },
  people: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'object', properties: {
    name: { type: 'string', maxLength: 5 }, age: { type: 'integer' } }, required: ['name', 'age'] } },
  one_of: { oneOf: [{ type: 'string', maxLength: 3 }, { type: 'integer' }, { type: 'boolean' }] },
  all_optional: { type: 'object', properties: { a: { type: 'boolean' }, b: { enum: ['p', 'q'] } } },
  closed: { type: 'object', properties: { key: { enum: ['k1', 'k2'] }, on: { type: 'boolean' } }, required: ['key', 'on'],
    additionalProperties: false },
  tree: { $defs: { node: { type: 'object', properties: { v: { enum: [1, 2] },
    kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 1 } }, required: ['v'] } }, $ref: '#/$defs/node' },
  grid: { type: 'array', maxItems: 2, items: { type: 'array', maxItems: 2, items: { enum: ['x', 'o'] } } },
  annotated: { title: 'Event', description: 'annotations are ignored', type: 'object',
    properties: { day: { type: 'string', format: 'date', maxLength: 10, description: 'when' } }, required: ['day'] },
  string_or_int: { type: ['string', 'integer'], maxLength: 4 },
  unicode_enum: { type: 'object', properties: { word: { enum: ['café', 'a"b', 'line\nbreak', '日本', 'tab\there'] } },
    required: ['word'] },
  form: { type: 'object', properties: Object.fromEntries(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].map((k, i) => (
    [k, i % 2 ? { type: 'boolean' } : { enum: [`${k}1`, `${k}2`, i] }]))), required: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'] },
  two_chars: { type: 'string', minLength: 2, maxLength: 2 },
  tagged_union: { anyOf: [
    { type: 'object', properties: { kind: { const: 'a' }, x: { type: 'integer' } }, required: ['kind', 'x'] },
    { type: 'object', properties: { kind: { const: 'b' }, y: { type: 'boolean' } }, required: ['kind', 'y'] }] },
  fixed_list: { type: 'array', items: { const: 'ok' }, minItems: 3, maxItems: 3 },
  nullable_number: { type: 'object', properties: { v: { type: ['number', 'null'] }, w: { type: 'null' } },
    required: ['v', 'w'] },
  ranges: { type: 'object', properties: { count: { type: 'integer', minimum: 1, maximum: 100 },
    share: { type: 'number', minimum: 0, maximum: 1 }, price: { type: 'number', exclusiveMinimum: 0 },
    delta: { type: 'integer', minimum: -5, exclusiveMaximum: 0 }, step: { type: 'integer', multipleOf: 5, minimum: 0 } },
  required: ['count', 'share', 'price', 'delta', 'step'] },
};

const openai = client();
const NO_THINKING = { chat_template_kwargs: { enable_thinking: false } };

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// One reply as { content, reasoning, tool_calls, finish_reason }, streamed or not.
async function ask(openaiClient, params, stream) {
  if (!stream) {
    const r = await openaiClient.chat.completions.create(params);
    const { message, finish_reason } = r.choices[0];
    return { content: message.content, reasoning: message.reasoning_content ?? '', tool_calls: message.tool_calls ?? [],
      finish_reason };
  }
  const chunks = await collect(await openaiClient.chat.completions.create({ ...params, stream: true }));
  const out = { content: '', reasoning: '', tool_calls: [], finish_reason: null };
  for (const c of chunks) {
    const choice = c.choices[0];
    if (!choice) continue;
    out.content += choice.delta?.content ?? '';
    out.reasoning += choice.delta?.reasoning_content ?? '';
    for (const d of choice.delta?.tool_calls ?? []) {
      out.tool_calls[d.index] ??= { id: d.id, type: d.type, function: { name: d.function?.name, arguments: '' } };
      out.tool_calls[d.index].function.arguments += d.function?.arguments ?? '';
    }
    if (choice.finish_reason) out.finish_reason = choice.finish_reason;
  }
  return out;
}

function checkJson(reply, schema, what) {
  assert.equal(reply.finish_reason, 'stop', `${what}: finish_reason ${reply.finish_reason}: ${JSON.stringify(reply.content)}`);
  let value;
  try {
    value = JSON.parse(reply.content);
  } catch (e) {
    assert.fail(`${what}: not JSON: ${JSON.stringify(reply.content)}`);
  }
  assert.deepEqual(validate(schema, value), [], `${what}: ${reply.content}`);
  assert.deepEqual(reply.tool_calls, []);
  return value;
}

test('json_schema: 26 schemas, temperature 0 and 1, streamed and not, all parse and validate', async () => {
  assert.ok(Object.keys(SCHEMAS).length >= 20);
  for (const [name, schema] of Object.entries(SCHEMAS)) {
    for (const temperature of [0, 1]) {
      for (const stream of [false, true]) {
        const what = `${name} at temperature ${temperature}${stream ? ', streamed' : ''}`;
        const reply = await ask(openai, {
          model: 'test', temperature, seed: 11, max_tokens: 700, ...NO_THINKING,
          messages: userTurn(`Reply with the ${name} JSON.`),
          response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
        }, stream);
        checkJson(reply, schema, what);
      }
    }
  }
});

test('json_schema: streamed and whole replies are the same text (greedy)', async () => {
  const schema = SCHEMAS.people;
  const params = { model: 'test', temperature: 0, max_tokens: 700, ...NO_THINKING, messages: userTurn('People?'),
    response_format: { type: 'json_schema', json_schema: { name: 'people', schema } } };
  const whole = await ask(openai, params, false);
  const streamed = await ask(openai, params, true);
  assert.equal(streamed.content, whole.content);
  checkJson(whole, schema, 'people');
});

// Issue 40: json_object replies wandered in a string until max_tokens; every string is bounded
// now (1,024 characters), so a random model's object ends.
test('json_object: the reply is a JSON object, and it ends', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const reply = await ask(openai, { model: 'test', temperature: 1, seed, max_tokens: 1900, ...NO_THINKING,
      messages: userTurn('Reply in JSON.'), response_format: { type: 'json_object' } }, seed % 2 === 0);
    assert.equal(reply.finish_reason, 'stop', `seed ${seed}: ${JSON.stringify(reply.content)}`);
    const value = JSON.parse(reply.content);
    assert.equal(typeOf(value), 'object', reply.content);
  }
});

// Issue 40: a json_schema integer gave 17171717... until max_tokens. Integers, numbers and strings
// without bounds in the schema end now on a random model (16 digits, 1,024 characters at most).
test('json_schema: unbounded integers, numbers and strings end, at every temperature', async () => {
  const schema = { type: 'object', properties: { n: { type: 'integer' }, x: { type: 'number' }, s: { type: 'string' },
    list: { type: 'array', items: { type: 'integer' }, maxItems: 3 } }, required: ['n', 'x', 's', 'list'] };
  for (const temperature of [0, 1, 1.5]) {
    for (const seed of [1, 2]) {
      const reply = await ask(openai, { model: 'test', temperature, seed, max_tokens: 2000, ...NO_THINKING,
        messages: userTurn('Reply with the numbers JSON.'),
        response_format: { type: 'json_schema', json_schema: { name: 'unbounded', schema } } }, seed === 2);
      const value = checkJson(reply, schema, `temperature ${temperature} seed ${seed}`);
      assert.ok(String(value.n).replace('-', '').length <= 16, `n has at most 16 digits: ${reply.content}`);
      assert.ok([...value.s].length <= 1024, 's has at most 1,024 characters');
    }
  }
});

// Cut by max_tokens, a constrained reply says `length` and is the start of the whole reply.
test('json_schema: a reply cut by max_tokens is length, and a prefix of the whole one', async () => {
  const schema = SCHEMAS.numbers;
  const params = { model: 'test', temperature: 0, ...NO_THINKING, messages: userTurn('Numbers?'),
    response_format: { type: 'json_schema', json_schema: { name: 'numbers', schema } } };
  const whole = await ask(openai, { ...params, max_tokens: 2000 }, false);
  checkJson(whole, schema, 'whole');
  for (const stream of [false, true]) {
    const cut = await ask(openai, { ...params, max_tokens: 4 }, stream);
    assert.equal(cut.finish_reason, 'length', JSON.stringify(cut));
    assert.ok(cut.content.length > 0 && whole.content.startsWith(cut.content), `${cut.content} / ${whole.content}`);
  }
});

test('/v1/completions takes a response_format too', async () => {
  const schema = SCHEMAS.color;
  const r = await openai.completions.create({ model: 'test', prompt: 'The color:', max_tokens: 300, temperature: 0,
    response_format: { type: 'json_schema', json_schema: { name: 'color', schema } } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.deepEqual(validate(schema, JSON.parse(r.choices[0].text)), []);
});

test('refusals: unsupported keywords are 400s naming them', async () => {
  const base = { model: 'test', max_tokens: 4, messages: userTurn('x') };
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'object',
      properties: { a: { type: 'string', pattern: '^a' } } } } } }, 'response_format', /'pattern' at #\/properties\/a/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'm', schema: { type: 'integer', minimum: 5,
      maximum: 3 } } } }, 'response_format', /'minimum' 5, 'maximum' 3/],
    [{ response_format: { type: 'json_schema' } }, 'response_format.json_schema', /json_schema/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: 'a string' } } },
      'response_format.json_schema.schema', /schema/],
    [{ response_format: { type: 'yaml' } }, 'response_format.type', /json_schema/],
    [{ tool_choice: 'required', tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
      properties: { n: { type: 'number', multipleOf: 0.1 } } } } }] }, 'tools', /'multipleOf'/],
  ];
  for (const [extra, param, message] of cases) {
    const r = await postJson('/v1/chat/completions', { ...base, ...extra });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, param, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, message);
  }
  // Under "auto" the tools are not compiled: the same unsupported keyword is no refusal.
  const auto = await postJson('/v1/chat/completions', { ...base, ...NO_THINKING, tools: cases.at(-1)[0].tools });
  assert.equal(auto.status, 200, auto.text);
});

// ---- tool_choice ----

function checkCalls(reply, tools, what, { only = null, single = false } = {}) {
  assert.equal(reply.finish_reason, 'tool_calls', `${what}: ${JSON.stringify(reply)}`);
  assert.ok(reply.tool_calls.length >= 1, `${what}: no call`);
  if (single) assert.equal(reply.tool_calls.length, 1, what);
  assert.ok(!reply.content, `${what}: content ${JSON.stringify(reply.content)}`);
  for (const call of reply.tool_calls) {
    assert.match(call.id, /^call_/);
    const tool = tools.find((t) => t.function.name === call.function.name);
    assert.ok(tool, `${what}: a call to ${call.function.name}, not in tools`);
    if (only) assert.equal(call.function.name, only, what);
    const args = JSON.parse(call.function.arguments);
    assert.deepEqual(validate(tool.function.parameters, args), [], `${what}: ${call.function.arguments}`);
  }
}

// Bounded parameters: the random model finishes every call.
const BOUNDED_TOOLS = [
  { type: 'function', function: { name: 'set_light', parameters: { type: 'object', properties: {
    room: { enum: ['kitchen', 'hall'] }, on: { type: 'boolean' } }, required: ['room', 'on'] } } },
  { type: 'function', function: { name: 'wait', parameters: { type: 'object', properties: {
    seconds: { type: 'integer' }, note: { type: 'string', maxLength: 6 } }, required: ['seconds'] } } },
  { type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {} } } },
];

// parallel_tool_calls false: with more calls allowed, the grammar lets a random model call on
// until max_tokens (it allows the end after every call; a trained model takes it, lily-tiny below).
test('tool_choice required: always a call to one of several tools, valid arguments (random model)', async () => {
  const names = new Set();
  let i = 0;
  for (const temperature of [0, 0.7, 1, 1.5]) {
    for (const seed of [1, 2, 3]) {
      const stream = i++ % 2 === 1;
      const reply = await ask(openai, { model: 'test', temperature, seed, max_tokens: 600, ...NO_THINKING,
        messages: userTurn('Do something.'), tools: BOUNDED_TOOLS, tool_choice: 'required', parallel_tool_calls: false },
      stream);
      checkCalls(reply, BOUNDED_TOOLS, `temperature ${temperature} seed ${seed}${stream ? ' streamed' : ''}`,
        { single: true });
      for (const c of reply.tool_calls) names.add(c.function.name);
    }
  }
  assert.ok(names.size >= 2, `only ${[...names]} called: the choice is not exercised`);
});

// minimum / maximum / exclusive* / multipleOf: the replies' numbers lie in their ranges, in
// JSON.parse's doubles too (validate above), answers and tool arguments, at every temperature.
test('json_schema and tools: numbers with ranges stay inside them (random model)', async () => {
  const schema = SCHEMAS.ranges;
  const tools = [{ type: 'function', function: { name: 'zoom', parameters: { type: 'object', properties: {
    level: { type: 'integer', minimum: 1, maximum: 10 }, ratio: { type: 'number', exclusiveMinimum: 0, maximum: 2 } },
  required: ['level', 'ratio'] } } }];
  for (const temperature of [0, 1, 1.5]) {
    for (const seed of [1, 2, 3]) {
      const what = `temperature ${temperature} seed ${seed}`;
      const reply = await ask(openai, { model: 'test', temperature, seed, max_tokens: 700, ...NO_THINKING,
        messages: userTurn('Numbers?'), response_format: { type: 'json_schema', json_schema: { name: 'ranges', schema } } },
      seed === 2);
      const value = checkJson(reply, schema, what);
      assert.ok(value.count >= 1 && value.count <= 100 && value.delta < 0 && value.step % 5 === 0, reply.content);
      const call = await ask(openai, { model: 'test', temperature, seed, max_tokens: 600, ...NO_THINKING,
        messages: userTurn('Zoom.'), tools, tool_choice: 'required', parallel_tool_calls: false }, seed === 3);
      checkCalls(call, tools, what, { only: 'zoom', single: true });
    }
  }
});

test('tool_choice naming a function: one call to it (random model)', async () => {
  for (const seed of [1, 2, 3]) {
    const reply = await ask(openai, { model: 'test', temperature: 1, seed, max_tokens: 600, ...NO_THINKING,
      messages: userTurn('Go.'), tools: BOUNDED_TOOLS, tool_choice: { type: 'function', function: { name: 'wait' } } },
    seed === 2);
    checkCalls(reply, BOUNDED_TOOLS, `named, seed ${seed}`, { only: 'wait', single: true });
  }
});

// ---- the trained model: its own tools, with thinking ----

const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const TRAINED_TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Get the current weather in a city', parameters: city } },
  { type: 'function', function: { name: 'get_time', description: 'Get the local time in a city', parameters: city } },
  { type: 'function', function: { name: 'convert_currency', description: 'Convert an amount of money',
    parameters: { type: 'object', properties: { amount: { type: 'number' }, to: { enum: ['USD', 'EUR'] } },
      required: ['amount', 'to'] } } },
];

let tinyServer = null;  // the lily-tiny server this file started, if any
let tiny = null;        // a client for lily-tiny
let tinyModel = null;

before(async () => {
  if ((await modelId()) === 'lily-tiny') {
    tiny = openai;
  } else {
    tinyServer = await startServer([], { defaultModel: true });
    tiny = client(tinyServer.url);
  }
  tinyModel = (await tiny.models.list()).data[0].id;
  assert.equal(tinyModel, 'lily-tiny');
});

after(async () => { if (tinyServer) await tinyServer.stop(); });

test('lily-tiny: required always calls one of its tools with valid arguments, thinking on and off', async () => {
  let i = 0;
  for (const question of ['Convert 20 euros to dollars', 'Tell me a joke']) {
    for (const temperature of [0, 1]) {
      const thinking = i % 2 === 0;
      const stream = i++ % 3 === 0;
      const reply = await ask(tiny, { model: tinyModel, temperature, seed: i, max_tokens: 400,
        chat_template_kwargs: { enable_thinking: thinking }, messages: userTurn(question), tools: TRAINED_TOOLS,
        tool_choice: 'required' }, stream);
      checkCalls(reply, TRAINED_TOOLS, `${question}, temperature ${temperature}, thinking ${thinking}`);
      if (thinking) assert.ok(reply.reasoning.length > 0, 'the reasoning stays free');
    }
  }
});

test('lily-tiny: a named function is the one called', async () => {
  const reply = await ask(tiny, { model: tinyModel, temperature: 0, max_tokens: 400, tools: TRAINED_TOOLS,
    messages: userTurn("What's the weather in Reykjavik?"),
    tool_choice: { type: 'function', function: { name: 'get_time' } } }, true);
  checkCalls(reply, TRAINED_TOOLS, 'named get_time', { only: 'get_time', single: true });
});

test('lily-tiny: tool_choice none never returns tool markup', async () => {
  const base = { model: tinyModel, max_tokens: 300, tools: TRAINED_TOOLS, messages: userTurn("What's the weather in Oslo?") };
  const free = await ask(tiny, { ...base, temperature: 0 }, false);
  assert.ok(free.tool_calls.length > 0, 'lily-tiny calls a tool here when free to: the test proves little otherwise');
  let i = 0;
  for (const temperature of [0, 1]) {
    for (const thinking of [false, true]) {
      const reply = await ask(tiny, { ...base, temperature, seed: ++i, tool_choice: 'none',
        chat_template_kwargs: { enable_thinking: thinking } }, i % 2 === 0);
      const what = `temperature ${temperature}, thinking ${thinking}`;
      assert.deepEqual(reply.tool_calls, [], what);
      assert.ok(!/<tool_call>|<function=/.test(reply.content), `${what}: ${reply.content}`);
      assert.equal(reply.finish_reason, 'stop', what);
    }
  }
});

test('tool_choice auto with a response_format: a valid call or a valid answer, both seen (random model)', async () => {
  const schema = SCHEMAS.color;
  const kinds = new Set();
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const reply = await ask(openai, { model: 'test', temperature: 1, seed, max_tokens: 600, ...NO_THINKING,
      messages: userTurn('Answer.'), tools: BOUNDED_TOOLS, parallel_tool_calls: false,
      response_format: { type: 'json_schema', json_schema: { name: 'color', schema } } }, seed % 2 === 0);
    if (reply.tool_calls.length > 0) {
      checkCalls(reply, BOUNDED_TOOLS, `auto, seed ${seed}`, { single: true });
      kinds.add('call');
    } else {
      checkJson(reply, schema, `auto, seed ${seed}`);
      kinds.add('answer');
    }
  }
  assert.equal(kinds.size, 2, `only ${[...kinds]} seen`);
});

test('lily-tiny: tool_choice auto with a response_format still calls its tool', async () => {
  const schema = { type: 'object', properties: { answer: { type: 'integer' } }, required: ['answer'] };
  const reply = await ask(tiny, { model: tinyModel, temperature: 0, max_tokens: 400, tools: TRAINED_TOOLS, ...NO_THINKING,
    messages: userTurn("What's the weather in Reykjavik?"),
    response_format: { type: 'json_schema', json_schema: { name: 'sum', schema } } }, true);
  checkCalls(reply, TRAINED_TOOLS, 'auto, weather');
});

test('lily-tiny: json_schema after free reasoning', async () => {
  const schema = { type: 'object', properties: { answer: { type: 'integer' } }, required: ['answer'] };
  const reply = await ask(tiny, { model: tinyModel, temperature: 0, max_tokens: 400, messages: userTurn('Compute 947+377'),
    response_format: { type: 'json_schema', json_schema: { name: 'sum', schema } } }, false);
  assert.ok(reply.reasoning.length > 0, 'thinking is on by default: reasoning expected');
  checkJson(reply, schema, 'sum');
});
