#!/usr/bin/env bash
# run_curl_tests.sh WORKDIR: HTTP-level checks of `lily serve` with curl and raw sockets:
# malformed requests get a 4xx (with an OpenAI error object where the server reads the
# request), and the server stays up.
# Env: LILY_BINARY (required), LILY_TEST_MODEL (default: tests/server/fixtures/tiny-chat).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run_curl_tests.sh WORKDIR}"
: "${LILY_BINARY:?set LILY_BINARY to the lily executable}"
export LILY_TEST_MODEL="${LILY_TEST_MODEL:-$here/fixtures/tiny-chat}"
command -v curl >/dev/null || { echo "FAIL: curl is not installed" >&2; exit 1; }
mkdir -p "$work"
source "$here/lib_server.sh"
trap stop_lily_server EXIT
start_lily_server "$work/curl-server.log" --max-body-mib 1 || exit 1
hostport="${LILY_URL#http://}"
host="${hostport%:*}"
port="${hostport##*:}"

failures=0
# expect NAME STATUS BODY_REGEX -- curl args...
expect() {
  local name="$1" status="$2" pattern="$3"; shift 4
  local out code body
  out=$(curl -s -o "$work/body" -w '%{http_code}' "$@")
  code="$out"
  body=$(cat "$work/body" 2>/dev/null)
  if [ "$code" != "$status" ] || ! grep -Eq -- "$pattern" <<<"$body"; then
    echo "FAIL $name: expected $status /$pattern/, got $code: ${body:0:300}"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}
# raw NAME STATUS_REGEX REQUEST: sends REQUEST bytes on a socket, checks the status line.
raw() {
  local name="$1" pattern="$2" request="$3" reply
  reply=$(exec 3<>"/dev/tcp/$host/$port"; printf '%b' "$request" >&3; timeout 5 head -c 2000 <&3; exec 3>&-)
  if ! grep -Eq -- "$pattern" <<<"$(head -1 <<<"$reply")"; then
    echo "FAIL $name: expected status /$pattern/, got: $(head -1 <<<"$reply")"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

err='"error":\{"message":".+","type":"[a-z_]+","param":.*,"code":'
json=(-H 'Content-Type: application/json')
expect "malformed JSON" 400 "$err" -- "$LILY_URL/v1/chat/completions" "${json[@]}" -d '{"messages": [}'
expect "truncated JSON" 400 "$err" -- "$LILY_URL/v1/chat/completions" "${json[@]}" -d '{"model":"x","messages":[{"role":"user","content":"hi"'
expect "empty body" 400 "$err" -- "$LILY_URL/v1/chat/completions" "${json[@]}" -d ''
expect "JSON array body" 400 "$err" -- "$LILY_URL/v1/completions" "${json[@]}" -d '[]'
expect "invalid UTF-8 in JSON" 400 "$err" -- "$LILY_URL/v1/chat/completions" "${json[@]}" --data-binary $'{"messages":[{"role":"user","content":"\xff\xfe"}]}'
expect "wrong type" 400 '"param":"temperature"' -- "$LILY_URL/v1/chat/completions" "${json[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"temperature":"x"}'
expect "charset parameter" 200 '"chat.completion"' -- "$LILY_URL/v1/chat/completions" -H 'Content-Type: Application/JSON; charset=utf-8' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
# Issue 17 (7, 12): the JSON endpoints take application/json only; what curl -d sends by default
# (a form) is a 415 that says how to send JSON, whatever its size (cpp-httplib: 413 beyond 8 KB).
expect "form-encoded body" 415 'Content-Type: application/json' -- "$LILY_URL/v1/chat/completions" -d 'messages=hi'
head -c 9000 /dev/zero | tr '\0' 'a' >"$work/form-9k"
expect "form-encoded body over 8 KB" 415 'Content-Type: application/json' -- "$LILY_URL/v1/chat/completions" --data-binary "@$work/form-9k"
expect "text/plain body" 415 "$err" -- "$LILY_URL/v1/completions" -H 'Content-Type: text/plain' -d '{"prompt":"hi"}'
expect "no Content-Type" 415 "$err" -- "$LILY_URL/v1/completions" -H 'Content-Type:' -d '{"prompt":"hi"}'
head -c 2000000 /dev/zero | tr '\0' 'a' >"$work/big-body"
expect "body over the limit" 413 "$err" -- "$LILY_URL/v1/chat/completions" "${json[@]}" --data-binary "@$work/big-body"
expect "unknown route" 404 "$err" -- "$LILY_URL/v2/whatever"
# Issue 17 (12): a known route with the wrong method is a 405 naming the methods it takes.
expect "GET on a POST route" 405 'takes POST' -- "$LILY_URL/v1/chat/completions"
expect "DELETE on a GET route" 405 'takes GET, HEAD' -- -X DELETE "$LILY_URL/v1/models"
allow=$(curl -s -o /dev/null -D - "$LILY_URL/v1/chat/completions" | tr -d '\r' | grep -i '^allow:' || true)
if [ "$allow" != "Allow: POST, OPTIONS" ]; then echo "FAIL 405 Allow header: '$allow'"; failures=$((failures + 1)); else echo "ok   405 Allow header"; fi
# Issue 18 (5): the chat page at /, served without a key (this server has none; the browser test
# has one that does), its headers, HEAD, and 405 for other methods.
expect "chat page" 200 '<title>lily</title>' -- "$LILY_URL/"
page_head=$(curl -s -o /dev/null -D - "$LILY_URL/" | tr -d '\r')
for want in '^Content-Type: text/html; charset=utf-8$' "^Content-Security-Policy: default-src 'none'; script-src 'sha256-[A-Za-z0-9+/]{43}='; style-src 'sha256-[A-Za-z0-9+/]{43}='; connect-src 'self';" \
  '^X-Content-Type-Options: nosniff$' '^Cache-Control: no-cache$'; do
  if ! grep -Eq -- "$want" <<<"$page_head"; then echo "FAIL chat page header /$want/: $page_head"; failures=$((failures + 1)); else echo "ok   chat page header /${want:0:40}/"; fi
done
# HEAD: the page's length, no body.
head_reply=$(curl -s -I -o "$work/head" -w '%{http_code} body %{size_download}' "$LILY_URL/")
head_length=$(tr -d '\r' <"$work/head" | grep -i '^content-length:' || true)
if [ "$head_reply" != "200 body 0" ] || ! grep -Eq '^Content-Length: [1-9][0-9]{3,}$' <<<"$head_length"; then
  echo "FAIL HEAD /: '$head_reply', '$head_length'"; failures=$((failures + 1))
else
  echo "ok   HEAD /"
fi
expect "POST on the page" 405 'takes GET, HEAD' -- -X POST "$LILY_URL/"
expect "DELETE on the page" 405 'takes GET, HEAD' -- -X DELETE "$LILY_URL/"
expect "a path under the page" 404 "$err" -- "$LILY_URL/index.html"
# The page's own POSTs carry its origin: served without --cors-origin; another port's are not.
expect "same-origin POST" 200 '"chat.completion"' -- "$LILY_URL/v1/chat/completions" "${json[@]}" -H "Origin: $LILY_URL" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
expect "same host, other port" 403 'cors-origin' -- "$LILY_URL/v1/chat/completions" "${json[@]}" -H "Origin: http://$host:1" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
expect "chunked request body" 200 '"chat.completion"' -- "$LILY_URL/v1/chat/completions" "${json[@]}" -H 'Transfer-Encoding: chunked' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
expect "CORS preflight without an Origin" 204 '' -- -X OPTIONS "$LILY_URL/v1/chat/completions"
# Issue 17 (7): DNS rebinding: on a loopback bind only loopback names are served.
expect "foreign Host" 403 'not a loopback name' -- -H 'Host: attacker.example' "$LILY_URL/v1/models"
expect "foreign Host with a port" 403 'not a loopback name' -- -H 'Host: 10.0.0.1:8080' "$LILY_URL/health"
expect "localhost Host" 200 '"object":"list"' -- -H 'Host: localhost:1234' "$LILY_URL/v1/models"
expect "IPv6 loopback Host" 200 '"object":"list"' -- -H 'Host: [::1]:1234' "$LILY_URL/v1/models"
# Issue 17 (7): a web page of another origin is refused, and no reply carries a CORS header.
expect "foreign Origin" 403 'cors-origin' -- -H 'Origin: https://evil.example' "$LILY_URL/v1/models"
acao=$(curl -s -o /dev/null -D - "$LILY_URL/v1/models" | tr -d '\r' | grep -ci '^access-control' || true)
if [ "$acao" != "0" ]; then echo "FAIL no CORS header by default: $acao access-control headers"; failures=$((failures + 1)); else echo "ok   no CORS header by default"; fi
expect "health" 200 '"status":"ok"' -- "$LILY_URL/health"
expect "metrics" 200 'lily_queue_depth' -- "$LILY_URL/metrics"
raw "garbage request line" '^HTTP/1\.1 4[0-9][0-9]' 'GARBAGE\r\n\r\n'
raw "bad HTTP version" '^HTTP/1\.1 4[0-9][0-9]|^HTTP/1\.1 505|^$' 'GET /health HTTP/9.9\r\n\r\n'
raw "content-length larger than the body" '^HTTP/1\.1 (4[0-9][0-9]|200)|^$' 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{"a":1}'
raw "header without a colon" '^HTTP/1\.1 [24][0-9][0-9]' 'GET /health HTTP/1.1\r\nConnection: close\r\nthis is not a header\r\n\r\n'
raw "HTTP/1.0 request" '^HTTP/1\.0 200' 'GET /health HTTP/1.0\r\n\r\n'
# The server is still up and answers correctly after all of that.
expect "still serving" 200 '"chat.completion"' -- "$LILY_URL/v1/chat/completions" "${json[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'

trap - EXIT
stop_lily_server || failures=$((failures + 1))
if [ "$failures" -ne 0 ]; then echo "$failures curl test(s) failed"; exit 1; fi
echo "all curl tests passed"
