// What a web page in the user's browser can do to a local lily serve (issue 17, item 7): by
// default nothing (no CORS header, foreign origins and Hosts refused, no browser-simple JSON
// requests); --cors-origin ORIGIN (repeatable) lets named pages in.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BASE, GREEDY, metrics, startServer, userTurn } from './lib.mjs';

const chatBody = JSON.stringify({ ...GREEDY, messages: userTurn('Hi'), max_tokens: 2 });

test('regression_cors_default_17: no CORS header and a 403 for a page of another origin', { timeout: 60_000 }, async () => {
  const before = await metrics();
  const plain = await fetch(`${BASE}/v1/models`);
  assert.equal(plain.status, 200);
  for (const [k] of plain.headers) assert.ok(!k.startsWith('access-control-'), `${k} sent by default`);
  const r = await fetch(`${BASE}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Origin: 'https://evil.example' }, body: chatBody,
  });
  assert.equal(r.status, 403);
  assert.equal(r.headers.get('access-control-allow-origin'), null);
  assert.match((await r.json()).error.message, /--cors-origin https:\/\/evil\.example/);
  const pre = await fetch(`${BASE}/v1/chat/completions`, {
    method: 'OPTIONS', headers: { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST' },
  });
  assert.equal(pre.status, 403);
  assert.equal(pre.headers.get('access-control-allow-origin'), null);
  assert.equal((await metrics()).lily_completions_total, before.lily_completions_total);
});

test('regression_simple_request_17: a browser-simple POST (text/plain, form) runs nothing', { timeout: 60_000 }, async () => {
  const before = await metrics();
  for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
    const r = await fetch(`${BASE}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': type }, body: chatBody });
    assert.equal(r.status, 415, type);
    assert.match((await r.json()).error.message, /Content-Type: application\/json/);
  }
  assert.equal((await metrics()).lily_completions_total, before.lily_completions_total);
});

test('regression_dns_rebinding_17: on a loopback bind a foreign Host is refused', { timeout: 60_000 }, async () => {
  // fetch() will not set Host; the raw checks are in run_curl_tests.sh. Here: what a rebinding
  // page's request looks like to the server, through node's http client.
  const http = await import('node:http');
  const u = new URL(BASE);
  const status = (host) => new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/models', headers: { Host: host } },
      (res) => { res.resume(); resolve(res.statusCode); });
    req.on('error', reject);
    req.end();
  });
  assert.equal(await status('attacker.example:8080'), 403);
  assert.equal(await status('127.0.0.1.nip.io'), 403);
  assert.equal(await status(`localhost:${u.port}`), 200);
  assert.equal(await status(`127.0.0.1:${u.port}`), 200);
});

test('--cors-origin: the named origins get CORS headers and preflights, others stay refused', { timeout: 60_000 }, async () => {
  const server = await startServer(['--cors-origin', 'http://localhost:3000', '--cors-origin', 'https://app.example']);
  try {
    for (const origin of ['http://localhost:3000', 'https://app.example']) {
      const pre = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'OPTIONS',
        headers: { Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type,authorization' },
      });
      assert.equal(pre.status, 204);
      assert.equal(pre.headers.get('access-control-allow-origin'), origin);
      assert.match(pre.headers.get('access-control-allow-headers'), /Content-Type/);
      assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
      const r = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json', Origin: origin }, body: chatBody,
      });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('access-control-allow-origin'), origin);
      assert.equal(r.headers.get('vary'), 'Origin');
    }
    const other = await fetch(`${server.url}/v1/models`, { headers: { Origin: 'http://localhost:3001' } });
    assert.equal(other.status, 403);
  } finally {
    assert.equal((await server.stop()).code, 0);
  }
});
