// Session reuse: the later turns of a conversation compute only their new tokens, and every
// answer is exactly the answer of a cold run (cache_prompt: false) of the same request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, GREEDY, metrics } from './lib.mjs';

const openai = client();

// Tokens of the generation prompt, where a turn's cached state ends (the next request renders
// the previous reply differently from there on: the Qwen template drops its reasoning).
async function generationPromptTokens() {
  const r = await openai.completions.create({ ...GREEDY, prompt: '<|im_start|>assistant\n<think>\n', max_tokens: 1 });
  return r.usage.prompt_tokens;
}

test('multi-turn conversation: later turns prefill only their new tokens and match cold runs', async () => {
  const before = await metrics();
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  const questions = ['Hello, how are you?', 'What is the weather in Paris?', 'And in Oslo?', 'Count to ten.'];
  const genPrompt = await generationPromptTokens();
  let previousPrompt = 0;
  let cachedSum = 0;
  for (const [turn, question] of questions.entries()) {
    messages.push({ role: 'user', content: question });
    const params = { ...GREEDY, messages, max_tokens: 16 };
    const warm = await openai.chat.completions.create(params);
    const cold = await openai.chat.completions.create({ ...params, cache_prompt: false });
    assert.equal(warm.choices[0].message.content, cold.choices[0].message.content, `turn ${turn}`);
    assert.equal(warm.choices[0].message.reasoning_content, cold.choices[0].message.reasoning_content, `turn ${turn}`);
    assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
    const cached = warm.usage.prompt_tokens_details.cached_tokens;
    if (turn > 0) {
      // Everything up to the previous generation prompt (<|im_start|>assistant\n<think>\n) is reused.
      assert.equal(cached, previousPrompt - genPrompt, `turn ${turn}: previous prompt ${previousPrompt}`);
      assert.ok(cached < warm.usage.prompt_tokens);
    }
    cachedSum += cached;
    previousPrompt = warm.usage.prompt_tokens;
    const m = warm.choices[0].message;
    messages.push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content });
  }
  const after = await metrics();
  assert.ok(after.lily_prompt_tokens_cached_total - before.lily_prompt_tokens_cached_total >= cachedSum);
});

test('a tool result continues from the end of the previous prompt', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }];
  const first = await openai.chat.completions.create({ ...GREEDY, messages, tools, max_tokens: 12 });
  const m = first.choices[0].message;
  messages.push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content,
    tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] });
  messages.push({ role: 'tool', tool_call_id: 'call_1', content: '{"temp": 3}' });
  const warm = await openai.chat.completions.create({ ...GREEDY, messages, tools, max_tokens: 12 });
  const cold = await openai.chat.completions.create({ ...GREEDY, messages, tools, max_tokens: 12, cache_prompt: false });
  assert.ok(warm.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens);
  assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
  assert.equal(warm.choices[0].message.reasoning_content, cold.choices[0].message.reasoning_content);
});

test('two conversations interleaved both keep their sessions', async () => {
  const a = [{ role: 'user', content: 'Hello from conversation A, a somewhat longer first message.' }];
  const b = [{ role: 'user', content: 'Conversation B starts here with different words.' }];
  const genPrompt = await generationPromptTokens();
  const ra = await openai.chat.completions.create({ ...GREEDY, messages: a, max_tokens: 6 });
  const rb = await openai.chat.completions.create({ ...GREEDY, messages: b, max_tokens: 6 });
  a.push({ role: 'assistant', content: ra.choices[0].message.content ?? '' }, { role: 'user', content: 'More A.' });
  b.push({ role: 'assistant', content: rb.choices[0].message.content ?? '' }, { role: 'user', content: 'More B.' });
  const ra2 = await openai.chat.completions.create({ ...GREEDY, messages: a, max_tokens: 6 });
  const rb2 = await openai.chat.completions.create({ ...GREEDY, messages: b, max_tokens: 6 });
  assert.equal(ra2.usage.prompt_tokens_details.cached_tokens, ra.usage.prompt_tokens - genPrompt);
  assert.equal(rb2.usage.prompt_tokens_details.cached_tokens, rb.usage.prompt_tokens - genPrompt);
});
