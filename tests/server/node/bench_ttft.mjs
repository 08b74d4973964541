// bench_ttft.mjs: time to first token of the second turn of a long conversation, warm (session
// reuse) against cold (cache_prompt: false), measured by the client on a streamed request.
// Usage: LILY_URL=http://127.0.0.1:PORT node bench_ttft.mjs [first-turn words] (default 3000)
import OpenAI from 'openai';

const openai = new OpenAI({ baseURL: `${process.env.LILY_URL}/v1`, apiKey: 'unused', maxRetries: 0 });
const words = Number(process.argv[2] ?? 3000);
const vocabulary = ['weather', 'city', 'river', 'the', 'of', 'function', 'answer', 'question', 'Paris', 'Oslo'];
const long = Array.from({ length: words }, (_, i) => vocabulary[(i * 7) % vocabulary.length]).join(' ');

async function timed(params) {
  const t0 = performance.now();
  let first = null;
  let usage = null;
  const stream = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  for await (const c of stream) {
    const d = c.choices[0]?.delta;
    if (first === null && (d?.content || d?.reasoning_content)) first = performance.now() - t0;
    if (c.usage) usage = c.usage;
  }
  return { ttft_ms: first, usage };
}

const base = { model: 'bench', temperature: 0, max_tokens: 8, ignore_eos: true };
const messages = [{ role: 'user', content: `Read this and remember it: ${long}` }];
const turn1 = await openai.chat.completions.create({ ...base, messages });
messages.push({ role: 'assistant', content: turn1.choices[0].message.content ?? '',
  reasoning_content: turn1.choices[0].message.reasoning_content });
messages.push({ role: 'user', content: 'What was the first word?' });
const cold = await timed({ ...base, messages, cache_prompt: false });
const warm = await timed({ ...base, messages });
const line = (name, r) => `${name}: TTFT ${r.ttft_ms.toFixed(1)} ms, prompt ${r.usage.prompt_tokens} tokens, ` +
  `cached ${r.usage.prompt_tokens_details.cached_tokens}, computed ${r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens}`;
console.log(`turn 1 prompt: ${turn1.usage.prompt_tokens} tokens`);
console.log(line('turn 2 cold', cold));
console.log(line('turn 2 warm', warm));
console.log(`speed-up: ${(cold.ttft_ms / warm.ttft_ms).toFixed(1)}x`);
