#!/usr/bin/env python3
"""Decode speed with a JSON schema active against without, through a running `lily serve`
(issue 18: constrained decoding must keep at least 90% of the free decode speed). Stdlib only.

Each request: a system prompt of PROMPT_TOKENS bytes (N bytes = N tokens with the full-size
no-merge tokenizer of ../shared/fullsize), greedy, thinking off, streamed, MAX_TOKENS at most,
the stop tokens ignored (the free reply runs to MAX_TOKENS; the constrained one ends where its
grammar ends). A warm-up of each kind first (the schema's first request builds the vocabulary
and compiles the grammar), then ROUNDS alternating pairs. Prints each run's decode tokens/s as
the client sees it (completion tokens after the first, over the time after the first delta) and
the medians' ratio.

    python3 tools/bench_constrained.py URL [PROMPT_TOKENS] [MAX_TOKENS] [ROUNDS]
"""
import http.client
import json
import statistics
import sys
import time
import urllib.parse

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["summary"],
          "properties": {"summary": {"type": "string"}}}


def run(url, prompt, max_tokens, schema):
    u = urllib.parse.urlparse(url)
    body = {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "Summarise."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:400]}")
    first, usage, finish, text = None, None, None, []
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise SystemExit(f"stream error: {ev['error']}")
        usage = ev.get("usage") or usage
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                text.append(piece)
                first = first or time.time()
            finish = ch.get("finish_reason") or finish
    t1 = time.time()
    n = usage["completion_tokens"]
    return {"tok_s": (n - 1) / (t1 - first) if first and n > 1 else 0.0, "tokens": n, "finish": finish,
            "ttft_ms": round((first - t0) * 1000, 1) if first else None, "text": "".join(text)}


def main():
    url = sys.argv[1]
    n_prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    prompt = ("notes on the river stone " * (n_prompt // 25 + 1))[:n_prompt]
    for kind, schema in (("free", None), ("schema", SCHEMA)):
        w = run(url, prompt, max_tokens, schema)
        print(f"warm-up {kind:6s} tokens {w['tokens']:4d} {w['finish']:6s} ttft {w['ttft_ms']} ms", flush=True)
    speeds = {"free": [], "schema": []}
    for i in range(rounds):
        for kind, schema in (("free", None), ("schema", SCHEMA)):
            r = run(url, prompt, max_tokens, schema)
            if schema and r["finish"] == "stop":
                json.loads(r["text"])  # a constrained reply the grammar ended must be JSON
            speeds[kind].append(r["tok_s"])
            print(f"round {i} {kind:6s} tokens {r['tokens']:4d} {r['finish']:6s} {r['tok_s']:8.1f} tokens/s", flush=True)
    free, constrained = statistics.median(speeds["free"]), statistics.median(speeds["schema"])
    print(f"median: free {free:.1f} tokens/s, schema {constrained:.1f} tokens/s, ratio {constrained / free:.3f}")


if __name__ == "__main__":
    main()
