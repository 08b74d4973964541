// Issue 5's measurement: lily-tiny's held-out tests (models/lily-tiny/heldout.json) through a
// running `lily serve` and the official openai client, greedy, thinking on (the default):
// every held-out arithmetic question (answer = the last integer of the content) and every
// held-out tool call (exact function name and arguments). Not part of `node --test`: run it
// with tests/server/run_heldout_eval.sh, which starts the server.
//   LILY_URL=http://127.0.0.1:PORT node heldout_eval.mjs path/to/heldout.json
import { readFileSync } from 'node:fs';
import { client, modelId } from './lib.mjs';

const file = process.argv[2];
if (!file) throw new Error('usage: node heldout_eval.mjs HELDOUT.json');
const heldout = JSON.parse(readFileSync(file, 'utf8'));
const openai = client(undefined, { timeout: 300_000 });
const model = await modelId();

function lastInteger(text) {
  const all = (text ?? '').match(/-?[0-9]+/g);
  return all ? all.at(-1) : null;
}

async function ask(t) {
  const request = { model, temperature: 0, max_tokens: 320, messages: t.messages };
  if (t.tools) request.tools = t.tools;
  return (await openai.chat.completions.create(request)).choices[0];
}

const tally = {};
function count(kind, ok, note) {
  tally[kind] ??= { right: 0, total: 0 };
  tally[kind].total += 1;
  if (ok) tally[kind].right += 1;
  else if (note) console.log(`  wrong (${kind}): ${note}`);
}

const started = Date.now();
for (const t of heldout.tests) {
  if (!t.enable_thinking) continue;
  if (t.kind === 'arith') {
    const { message } = await ask(t);
    const got = lastInteger(message.content);
    count('arithmetic', got === t.expected_answer,
      `${t.messages.at(-1).content} expected ${t.expected_answer}, content ${JSON.stringify(message.content)}`);
  } else if (t.kind === 'tool_call') {
    const { message, finish_reason } = await ask(t);
    const call = message.tool_calls?.[0];
    let args = null;
    try { args = call ? JSON.parse(call.function.arguments) : null; } catch { /* not JSON */ }
    const ok = finish_reason === 'tool_calls' && message.tool_calls.length === 1 &&
      call.function.name === t.expected_tool_call.name &&
      JSON.stringify(args) === JSON.stringify(t.expected_tool_call.arguments);
    count('tool call', ok, `${t.messages.at(-1).content} -> ${JSON.stringify(message.tool_calls ?? message.content)}`);
    if (ok) console.log(`  ${t.messages.at(-1).content} -> ${call.function.name}(${call.function.arguments})`);
  }
}
console.log(`lily-tiny through lily serve + the openai client (greedy, thinking on), ${((Date.now() - started) / 1000).toFixed(0)} s:`);
for (const [kind, { right, total }] of Object.entries(tally))
  console.log(`  held-out ${kind}: ${right}/${total} = ${(100 * right / total).toFixed(1)}%`);
