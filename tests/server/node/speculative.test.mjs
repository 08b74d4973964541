// Issue 37: `lily serve --speculate K` on lily-tiny (its trained MTP head; the server this file
// starts with --parallel 1, no -m: the embedded default model) says in each completion's usage what the drafts did,
// as OpenAI's Predicted Outputs fields completion_tokens_details.accepted_prediction_tokens /
// rejected_prediction_tokens (the Responses API: output_tokens_details), non-streamed and in the
// final usage chunk, and /metrics sums them (lily_speculative_*_tokens_total). A plain server's
// usage has no such field; the default --parallel 4 speculates too, each request its own steps.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { client, metrics, startServer, userTurn } from './lib.mjs';

let server = null;
let openai = null;
const GREEDY = { model: 'lily-tiny', temperature: 0 };
const QUESTION = { ...GREEDY, messages: userTurn('What is 487 + 356?'), max_tokens: 48 };

before(async () => {
  server = await startServer(['--speculate', '2', '--parallel', '1'], { defaultModel: true });
  openai = client(server.url);
});

after(async () => { if (server) await server.stop(); });

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

// The drafts of one usage: kept + refused = what /metrics counted for the completion.
function checkDrafts(details, completionTokens, drafted, accepted) {
  const a = details.accepted_prediction_tokens, r = details.rejected_prediction_tokens;
  assert.ok(Number.isInteger(a) && Number.isInteger(r), JSON.stringify(details));
  assert.equal(a + r, drafted, 'kept + refused = the drafts made');
  assert.equal(a, accepted);
  assert.ok(a > 0, "lily-tiny's head keeps some of its drafts");
  assert.ok(a <= completionTokens - 1, 'every kept draft is a completion token (the first one is not)');
}

test('a speculative chat completion counts its drafts, streamed and not, and /metrics sums them', async () => {
  const m0 = await metrics(server.url);
  const whole = await openai.chat.completions.create(QUESTION);
  const m1 = await metrics(server.url);
  const drafted = m1.lily_speculative_drafted_tokens_total - m0.lily_speculative_drafted_tokens_total;
  const accepted = m1.lily_speculative_accepted_tokens_total - m0.lily_speculative_accepted_tokens_total;
  checkDrafts(whole.usage.completion_tokens_details, whole.usage.completion_tokens, drafted, accepted);

  const chunks = await collect(await openai.chat.completions.create({
    ...QUESTION, stream: true, stream_options: { include_usage: true },
  }));
  const last = chunks.at(-1).usage;  // greedy: the same reply, the same drafts (the prompt now cached)
  assert.deepEqual(last.completion_tokens_details, whole.usage.completion_tokens_details);
  assert.equal(last.completion_tokens, whole.usage.completion_tokens);
});

test('the Responses API counts the drafts in output_tokens_details', async () => {
  const m0 = await metrics(server.url);
  const r = await openai.responses.create({ ...GREEDY, input: 'What is 487 + 356?', max_output_tokens: 48 });
  const m1 = await metrics(server.url);
  checkDrafts(r.usage.output_tokens_details, r.usage.output_tokens,
    m1.lily_speculative_drafted_tokens_total - m0.lily_speculative_drafted_tokens_total,
    m1.lily_speculative_accepted_tokens_total - m0.lily_speculative_accepted_tokens_total);
});

// No --speculate: no drafts counted. And --speculate with the default --parallel 4: each
// speculating request runs its own steps beside the batch, so the reply is the --parallel 1
// server's, with its drafts, also when two requests run at once.
test('a plain server counts no drafts; the default --parallel 4 speculates as --parallel 1 does', async () => {
  const plain = await startServer([], { defaultModel: true });
  let want = null;
  try {
    const r = await client(plain.url).chat.completions.create(QUESTION);
    assert.deepEqual(Object.keys(r.usage.completion_tokens_details), ['reasoning_tokens']);
    const m = await metrics(plain.url);
    assert.equal(m.lily_speculative_drafted_tokens_total, 0);
    assert.equal(m.lily_speculative_accepted_tokens_total, 0);
    want = r.choices[0].message.content;
  } finally {
    await plain.stop();
  }
  const alone = await openai.chat.completions.create(QUESTION);  // --parallel 1, speculating
  assert.equal(alone.choices[0].message.content, want, 'speculation changes no greedy answer');
  const parallel = await startServer(['--speculate', '2'], { defaultModel: true });
  try {
    const c = client(parallel.url);
    const other = { ...GREEDY, messages: userTurn('What is 12 + 30?'), max_tokens: 48 };
    const [a, b] = await Promise.all([c.chat.completions.create(QUESTION), c.chat.completions.create(other)]);
    assert.equal(a.choices[0].message.content, want);
    assert.deepEqual(a.usage.completion_tokens_details, alone.usage.completion_tokens_details);
    assert.ok(b.usage.completion_tokens_details.accepted_prediction_tokens > 0, JSON.stringify(b.usage));
    const m = await metrics(parallel.url);
    assert.ok(m.lily_speculative_drafted_tokens_total > 0);
  } finally {
    await parallel.stop();
  }
});
