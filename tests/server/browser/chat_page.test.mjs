// The chat page at GET / (src/server/web/chat.html) in a real browser: Debian's Chromium,
// headless, driven by playwright-core, against `lily serve` on the trained lily-tiny (which
// answers "Compute 12+35"). Run by ../run_browser_test.sh, which starts two servers: LILY_URL
// (no key) and LILY_KEY_URL (--api-key LILY_KEY).
//
// What a person does with the page, checked through what the browser shows: a question typed
// and sent, the reply streamed in (several DOM updates, watched with a MutationObserver; a long
// answer seen growing update after update), the reasoning in a collapsed <details>, a second
// turn over the same conversation (the session cache reuses the first), stop in the middle of a
// long answer, a tool call shown, thinking switched off, the server's errors shown (a missing
// API key), and the key typed in. Every page must load with its Content-Security-Policy intact
// (no console error, no CSP report) and ask nothing of any origin but its own.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const BASE = process.env.LILY_URL;
const KEY_BASE = process.env.LILY_KEY_URL;
const KEY = process.env.LILY_KEY;
if (!BASE || !KEY_BASE || !KEY) throw new Error('LILY_URL, LILY_KEY_URL and LILY_KEY are not set (run run_browser_test.sh)');
// A generous bound for one reply: the whole file takes ~20 s in the plain build and ~40 s with
// the ASan + UBSan lily on the shared 2-core machine.
const REPLY_MS = 120_000;

let browser;
before(async () => {
  // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; /dev/shm is small in
  // containers.
  browser = await chromium.launch({
    executablePath: process.env.LILY_CHROMIUM, args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
});
after(async () => { if (browser) await browser.close(); });

// A fresh page on `base` (its own context: its own sessionStorage) that records the URL of every
// request it makes, the body of every chat request, and every console error or warning (a
// refused script, style or connection shows there).
async function openPage(base) {
  const context = await browser.newContext();
  const page = await context.newPage();
  const seen = { urls: [], chatBodies: [], problems: [] };
  page.on('request', (r) => {
    seen.urls.push(r.url());
    if (r.url().endsWith('/v1/chat/completions')) seen.chatBodies.push(JSON.parse(r.postData()));
  });
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') seen.problems.push(m.text()); });
  page.on('pageerror', (e) => seen.problems.push(`page error: ${e.message}`));
  const response = await page.goto(`${base}/`);
  assert.equal(response.status(), 200);
  assert.equal(response.headers()['content-type'], 'text/html; charset=utf-8');
  assert.match(response.headers()['content-security-policy'], /^default-src 'none'; script-src 'sha256-/);
  // A policy that does not match the page refuses its script or style as the page is parsed.
  const refusals = seen.problems.filter((p) => /Content Security Policy/.test(p));
  assert.deepEqual(refusals, [], 'the page broke its own Content-Security-Policy');
  return { page, seen, close: () => context.close() };
}

// Only the page's own origin was asked, and the browser reported nothing (a CSP refusal, a
// script error, a failed request) but what matches `expected`.
function assertOwnOriginOnly(base, seen, expected = null) {
  for (const url of seen.urls) {
    assert.ok(url.startsWith(`${base}/`) || url.startsWith('data:'), `the page asked another origin: ${url}`);
  }
  const problems = seen.problems.filter((p) => !(expected && expected.test(p)));
  assert.deepEqual(problems, [], 'console errors or warnings');
}

// Records the text of the newest assistant turn at each DOM change, to see the reply arrive in
// pieces. Playwright evaluates through the DevTools protocol, which the page's CSP does not govern.
async function watchUpdates(page) {
  await page.evaluate(() => {
    window.replyUpdates = [];
    const log = document.getElementById('log');
    new MutationObserver(() => {
      const box = [...log.querySelectorAll('.msg.assistant')].at(-1);
      if (!box) return;
      const now = { reasoning: box.querySelector('.reasoning-text').textContent, content: box.querySelector('.content').textContent };
      const last = window.replyUpdates.at(-1);
      if (!last || last.reasoning !== now.reasoning || last.content !== now.content) window.replyUpdates.push(now);
    }).observe(log, { subtree: true, childList: true, characterData: true });
  });
}

// How many different states the newest reply went through ({ all, answer: those of the answer
// text alone }), checking that each extends the one before: streamed text is appended, never
// replaced.
async function streamedUpdates(page) {
  const updates = await page.evaluate(() => window.replyUpdates);
  for (let i = 1; i < updates.length; ++i) {
    assert.ok(updates[i].reasoning.startsWith(updates[i - 1].reasoning), 'reasoning replaced while streaming');
    assert.ok(updates[i].content.startsWith(updates[i - 1].content), 'answer replaced while streaming');
  }
  return { all: updates.length, answer: new Set(updates.map((u) => u.content).filter(Boolean)).size };
}

async function sendMessage(page, text, { enter = false } = {}) {
  await page.fill('#input', text);
  if (enter) await page.press('#input', 'Enter');
  else await page.click('#send');
}

// What the page shows of assistant turn `index` once it reaches `states` (a final state by default).
async function reply(page, index, states = ['done', 'stopped', 'error']) {
  const selector = `#log article.msg.assistant:nth-of-type(${index + 1})`;  // user turns are divs
  await page.waitForSelector(states.map((s) => `${selector}[data-state="${s}"]`).join(', '), { timeout: REPLY_MS });
  return page.$eval(selector, (box) => {
    const details = box.querySelector('details.reasoning');
    return {
      state: box.dataset.state,
      content: box.querySelector('.content').textContent,
      reasoning: box.querySelector('.reasoning-text').textContent,
      reasoningShown: !details.hidden,
      reasoningOpen: details.open,
      tools: [...box.querySelectorAll('.tool-call')].map((t) => ({
        name: t.querySelector('.name').textContent, arguments: t.querySelector('.arguments').textContent,
      })),
      meta: box.querySelector('.meta').textContent,
      error: box.querySelector('.error')?.textContent ?? '',
    };
  });
}

async function metric(base, name) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return Number(line.split(' ')[1]);
}

// Greedy answers, so the checks below are about the page, not about sampling luck.
async function useGreedy(page) {
  await page.click('#settings summary');
  await page.fill('#temperature', '0');
}

test('a question is answered as a stream, reasoning collapsed, and a second turn reuses the first', { timeout: 4 * REPLY_MS }, async (t) => {
  const { page, seen, close } = await openPage(BASE);
  try {
    await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('lily-tiny'));
    await useGreedy(page);
    await watchUpdates(page);
    await sendMessage(page, 'Compute 12+35');
    const first = await reply(page, 0);
    assert.equal(first.state, 'done', first.error);
    assert.match(first.content, /\b47\b/);
    // The page shows what has come once per frame: the reasoning (~90 tokens) spans several.
    const updates = await streamedUpdates(page);
    t.diagnostic(`first reply: ${updates.all} DOM updates (${updates.answer} in the answer)`);
    assert.ok(updates.all > 1, `the reply arrived in ${updates.all} DOM update(s); streamed means several`);
    // Thinking is on by default: lily-tiny works the sum out column by column, in a <details>
    // that stays closed, apart from the answer.
    assert.ok(first.reasoningShown && first.reasoning.length > 0, 'reasoning expected');
    assert.equal(first.reasoningOpen, false);
    assert.equal(await page.isVisible('#log .msg.assistant .reasoning-text'), false);
    assert.match(first.meta, /prompt tokens \(0 cached\)/);
    assert.equal(seen.chatBodies[0].stream, true);
    assert.equal(seen.chatBodies[0].chat_template_kwargs.enable_thinking, true);

    await watchUpdates(page);
    await sendMessage(page, 'What is 130 plus 240?', { enter: true });
    const second = await reply(page, 1);
    assert.equal(second.state, 'done', second.error);
    assert.match(second.content, /\b370\b/);
    // The whole conversation went with the second turn, and the server's session cache found
    // the first turn's prefix.
    assert.deepEqual(seen.chatBodies[1].messages.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.equal(seen.chatBodies[1].messages[1].content, first.content);
    const cached = Number(second.meta.match(/\((\d+) cached\)/)[1]);
    assert.ok(cached > 0, `second turn: ${second.meta}`);
    assert.ok((await streamedUpdates(page)).all > 1);

    // New chat: an empty page, and the next question goes alone.
    await page.click('#new-chat');
    assert.equal(await page.locator('#log .msg').count(), 0);
    await sendMessage(page, 'Compute 12+35');
    assert.equal((await reply(page, 0)).state, 'done');
    assert.deepEqual(seen.chatBodies[2].messages.map((m) => m.role), ['user']);
    assertOwnOriginOnly(BASE, seen);
  } finally {
    await close();
  }
});

test('a long answer streams in, and stop ends it: the stream is cut, the server stops generating', { timeout: 2 * REPLY_MS }, async () => {
  const { page, seen, close } = await openPage(BASE);
  try {
    // A long answer on demand: the test adds ignore_eos, so lily-tiny goes on past its end of
    // turn until the context is full (about 2000 tokens), far longer than it takes to press stop.
    await page.route('**/v1/chat/completions', (route) => {
      const body = JSON.parse(route.request().postData());
      route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
    });
    const cancelledBefore = await metric(BASE, 'lily_completions_cancelled_total');
    await watchUpdates(page);
    await sendMessage(page, 'Compute 12+35');
    // The answer text itself grows on the page, update after update, while it streams.
    await page.waitForFunction(() => new Set(window.replyUpdates.map((u) => u.content).filter(Boolean)).size >= 3,
      null, { timeout: REPLY_MS });
    assert.ok((await streamedUpdates(page)).answer >= 3);
    assert.equal(await page.isVisible('#stop'), true);
    assert.equal(await page.isEnabled('#send'), false);
    await page.click('#stop');
    const stopped = await reply(page, 0);
    assert.equal(stopped.state, 'stopped');
    assert.match(stopped.meta, /^stopped/);
    assert.equal(await page.isVisible('#stop'), false);
    assert.equal(await page.isEnabled('#send'), true);
    // The server noticed the closed connection at its next token and counted the completion
    // cancelled.
    const t0 = Date.now();
    while (await metric(BASE, 'lily_completions_cancelled_total') === cancelledBefore) {
      assert.ok(Date.now() - t0 < 20_000, 'the server did not cancel the stopped completion within 20 s');
      await new Promise((r) => setTimeout(r, 100));
    }
    // Nothing more arrives on the page.
    const textAfter = await page.$eval('#log .msg.assistant', (b) => b.textContent);
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(await page.$eval('#log .msg.assistant', (b) => b.textContent), textAfter);
    assertOwnOriginOnly(BASE, seen);
  } finally {
    await close();
  }
});

test('a tool call the model writes is shown with its name and arguments', { timeout: 2 * REPLY_MS }, async () => {
  const { page, seen, close } = await openPage(BASE);
  try {
    // The page offers no tools of its own; the test adds one, as a client would, to make
    // lily-tiny write a call.
    const city = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Get the current weather in a city', parameters: city } }];
    await page.route('**/v1/chat/completions', (route) => {
      const body = JSON.parse(route.request().postData());
      route.continue({ postData: JSON.stringify({ ...body, tools }) });
    });
    await useGreedy(page);
    await sendMessage(page, "What's the weather in Paris?");
    const r = await reply(page, 0);
    assert.equal(r.state, 'done', r.error);
    assert.deepEqual(r.tools.map((t) => t.name), ['get_weather']);
    assert.equal(JSON.parse(r.tools[0].arguments).city, 'Paris');
    assertOwnOriginOnly(BASE, seen);
  } finally {
    await close();
  }
});

test('with an API key: the page loads without it, shows the 401, then works once it is typed; thinking off', { timeout: 3 * REPLY_MS }, async () => {
  const { page, seen, close } = await openPage(KEY_BASE);
  try {
    await page.waitForFunction(() => document.getElementById('status').textContent.includes('API key'));
    assert.equal(await page.$eval('#settings', (d) => d.open), true);
    await sendMessage(page, 'Compute 12+35');
    const refused = await reply(page, 0);
    assert.equal(refused.state, 'error');
    assert.match(refused.error, /^401: missing or wrong API key/);
    assert.equal(await page.inputValue('#input'), 'Compute 12+35', 'the refused text is given back');

    await page.fill('#api-key', KEY);
    await page.press('#api-key', 'Enter');  // change: the page checks the server again
    await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('lily-tiny'));
    assert.equal(await page.evaluate(() => sessionStorage.getItem('lily.apiKey')), KEY);
    await page.fill('#temperature', '0');
    await page.uncheck('#think');
    await page.click('#send');
    const answered = await reply(page, 1);
    assert.equal(answered.state, 'done', answered.error);
    assert.match(answered.content, /\b47\b/);
    assert.equal(answered.reasoningShown, false, 'thinking off: no reasoning');

    const body = seen.chatBodies.at(-1);
    assert.equal(body.chat_template_kwargs.enable_thinking, false);
    assert.deepEqual(body.messages.map((m) => m.role), ['user'], 'the refused turn is not sent again');
    // Chromium logs the refused request itself.
    assertOwnOriginOnly(KEY_BASE, seen, /status of 401/);
  } finally {
    await close();
  }
});
