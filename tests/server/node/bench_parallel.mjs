// bench_parallel.mjs [TOKENS] [STREAMS]: decode speed of `lily serve --parallel` (issue 38),
// measured through the HTTP API on the embedded lily-tiny (or LILY_TEST_MODEL):
//   * one stream of TOKENS (256) tokens: its decode tokens/s (first token to last);
//   * STREAMS (4) streams at once: their aggregate decode tokens/s (the tokens after each first
//     one, over the time from the first first token to the last last token), and each stream's
//     inter-token time;
//   * a request arriving while STREAMS - 1 stream: its time to first token, in steps of theirs;
// on a --parallel STREAMS server and, for the same STREAMS at once, on a --parallel 1 server (one
// after another). Prints one JSON line. Timing only: no pass or fail.
//   LILY_BINARY=build/lily node tests/server/node/bench_parallel.mjs 256 4
process.env.LILY_URL ??= 'http://unused';  // lib.mjs wants one; this script starts its own servers
const { startServer } = await import('./lib.mjs');

const tokens = Number(process.argv[2] ?? 256);
const streams = Number(process.argv[3] ?? 4);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One stream of `tokens` tokens: the times its chunks came (ms since `t0`), and its tokens.
async function stream(base, i, t0, max = tokens) {
  const sent = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'lily', temperature: 0, max_tokens: max, ignore_eos: true, cache_prompt: false,
      stream: true, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: `Stream ${i}: tell me a long story about the number ${i * 17}.` }] }),
  });
  const reader = r.body.getReader();
  const times = [];
  let text = '', usage = null;
  while (true) {
    const { value, done } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString();
    let end;
    while ((end = text.indexOf('\n\n')) >= 0) {
      const block = text.slice(0, end);
      text = text.slice(end + 2);
      if (!block.startsWith('data: {')) continue;
      const c = JSON.parse(block.slice(6));
      if (c.usage) usage = c.usage;
      const d = c.choices?.[0]?.delta;
      if (d && (d.reasoning_content || d.content)) times.push(performance.now() - t0);
    }
  }
  return { times, tokens: usage?.completion_tokens ?? times.length, ttft: times[0] + t0 - sent };
}

const rate = (s) => (s.tokens - 1) / ((s.times.at(-1) - s.times[0]) / 1000);

async function together(base, n) {
  const t0 = performance.now();
  const all = await Promise.all(Array.from({ length: n }, (_, i) => stream(base, i, t0)));
  const first = Math.min(...all.map((s) => s.times[0])), last = Math.max(...all.map((s) => s.times.at(-1)));
  const decoded = all.reduce((a, s) => a + s.tokens - 1, 0);
  const gaps = all.map((s) => (s.times.at(-1) - s.times[0]) / (s.tokens - 1));
  return { aggregate: decoded / ((last - first) / 1000), inter_token_ms: gaps.map((g) => Number(g.toFixed(2))) };
}

async function measure(parallel) {
  const server = await startServer(['--parallel', String(parallel)], { defaultModel: !process.env.LILY_TEST_MODEL });
  try {
    await stream(server.url, 99, performance.now(), 32);  // warm-up
    const alone = await stream(server.url, 0, performance.now());
    const many = await together(server.url, streams);
    // A request arriving while streams - 1 stream (after they are well under way).
    const t0 = performance.now();
    const running = Array.from({ length: streams - 1 }, (_, i) => stream(server.url, i + 1, t0));
    await sleep(1000);
    const late = await stream(server.url, 50, performance.now(), 8);
    const others = await Promise.all(running);
    const step = Math.max(...others.map((s) => (s.times.at(-1) - s.times[0]) / (s.tokens - 1)));
    return { parallel, one_stream: Number(rate(alone).toFixed(1)), aggregate: Number(many.aggregate.toFixed(1)),
      speedup: Number((many.aggregate / rate(alone)).toFixed(2)), inter_token_ms: many.inter_token_ms,
      late_ttft_ms: Number(late.ttft.toFixed(1)), step_ms: Number(step.toFixed(2)),
      late_ttft_in_steps: Number((late.ttft / step).toFixed(1)) };
  } finally {
    await server.stop();
  }
}

const results = [await measure(streams), await measure(1)];
console.log(JSON.stringify({ tokens, streams, results }));
