#!/usr/bin/env python3
"""Synthetic chat conversations for lily-tiny (models/lily-tiny), deterministic from a seed.

Every conversation is a list of OpenAI-style messages (plus an optional `tools` list and an
`enable_thinking` flag). It is rendered with the Qwen3.6 chat template
(tools/qwen36_chat_template.jinja) through jinja2 in the environment transformers uses
(sandboxed, trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a json.dumps
`tojson` with ensure_ascii=False). `segments()` cuts the rendered text into
(text, is_loss) pieces: the loss pieces are exactly what the model must generate after
each generation prompt (`<|im_start|>assistant\\n<think>\\n` with thinking on,
`...<think>\\n\\n</think>\\n\\n` with thinking off) up to and including `<|im_end|>`.
Only assistant turns after the last real user query are trained on (the ones the template
renders with their think block, i.e. the ones the model generates at inference).

Task families:
  arith     two-number addition / subtraction, operands 0-999, several phrasings; with
            thinking on, the reasoning is a digit-by-digit scratchpad
  instr     repeat / reverse the word order / uppercase / count words
  tool      get_weather(city), get_time(city), convert_currency(amount, from, to): emit a
            Qwen XML <tool_call>, then answer from the <tool_response>; questions that need
            no tool are answered directly even when tools are offered
  chat      greetings, identity, and a polite refusal for questions it cannot answer
  multi     a previous exchange in the history, then a new question

Held out from training (for generalisation tests, written to heldout.json by train_tiny.py):
  number pairs with (a*7 + b*13) % 10 == 0 (for both + and -), and the cities in
  HELDOUT_CITIES.

Standalone use (Debian python3 with python3-jinja2 is enough):
  /usr/bin/python3 tools/synth_conversations.py --show 8 --seed 1     print rendered examples
  /usr/bin/python3 tools/synth_conversations.py --check 2000           self-check
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys

import jinja2
import jinja2.exceptions
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "qwen36_chat_template.jinja")

IM_END = "<|im_end|>"

# --------------------------------------------------------------------------------------------
# Rendering (the transformers chat-template environment)
# --------------------------------------------------------------------------------------------


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def load_template_source(path: str = TEMPLATE_PATH) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def make_template(source: str | None = None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source if source is not None else load_template_source())


def render(template, messages, tools=None, add_generation_prompt=False, enable_thinking=True):
    kwargs = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
    if not enable_thinking:
        kwargs["enable_thinking"] = False
    return template.render(**kwargs)


def last_query_index(messages) -> int:
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user":
            c = (m.get("content") or "").strip()
            if not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
                return i
    raise ValueError("no user query")


def segments(template, ex: dict) -> list[tuple[str, bool]]:
    """Cuts a rendered conversation into (text, is_loss) pieces (see the module doc)."""
    msgs, tools, think = ex["messages"], ex.get("tools"), ex.get("enable_thinking", True)
    full = render(template, msgs, tools, False, think)
    lqi = last_query_index(msgs)
    out: list[tuple[str, bool]] = []
    pos = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or i <= lqi:
            continue
        prompt = render(template, msgs[:i], tools, True, think)
        upto = render(template, msgs[: i + 1], tools, False, think)
        if not (full.startswith(upto) and upto.startswith(prompt) and upto.endswith(IM_END + "\n")
                and len(prompt) >= pos):
            raise AssertionError("rendering is not prefix-consistent for example %r" % ex.get("kind"))
        out.append((full[pos:len(prompt)], False))
        out.append((full[len(prompt):len(upto) - 1], True))   # completion, ends with <|im_end|>
        pos = len(upto) - 1
    if not out:
        raise AssertionError("example without a trained assistant turn")
    return out


def generation_prompt(template, ex: dict) -> str:
    """The prompt for the model's next turn (the messages of `ex` as they stand)."""
    return render(template, ex["messages"], ex.get("tools"), True, ex.get("enable_thinking", True))


# --------------------------------------------------------------------------------------------
# Vocabulary of the tasks
# --------------------------------------------------------------------------------------------

def is_heldout_pair(a: int, b: int) -> bool:
    return (a * 7 + b * 13) % 10 == 0


TRAIN_CITIES = [
    "Oslo", "Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw",
    "Dublin", "Athens", "Helsinki", "Stockholm", "Copenhagen", "Amsterdam", "Brussels", "Zurich",
    "Geneva", "Munich", "Hamburg", "Milan", "Naples", "Barcelona", "Valencia", "Porto", "Krakow",
    "Budapest", "Bucharest", "Sofia", "Belgrade", "Zagreb", "Riga", "Vilnius", "Kyiv", "Istanbul",
    "Ankara", "Cairo", "Nairobi", "Lagos", "Accra", "Dakar", "Casablanca", "Tunis", "Johannesburg",
    "Cape Town", "Durban", "Addis Ababa", "Kampala", "Dubai", "Doha", "Riyadh", "Tehran", "Baghdad",
    "Karachi", "Lahore", "Delhi", "Mumbai", "Chennai", "Kolkata", "Bangalore", "Dhaka", "Colombo",
    "Bangkok", "Hanoi", "Manila", "Jakarta", "Singapore", "Kuala Lumpur", "Seoul", "Busan", "Tokyo",
    "Osaka", "Kyoto", "Beijing", "Shanghai", "Shenzhen", "Hong Kong", "Taipei", "Sydney",
    "Melbourne", "Perth", "Brisbane", "Auckland", "Wellington", "Toronto", "Montreal", "Vancouver",
    "Ottawa", "Chicago", "Boston", "Seattle", "Denver", "Austin", "Dallas", "Houston", "Miami",
    "Atlanta", "Phoenix", "New York", "Los Angeles", "San Francisco", "San Diego", "Mexico City",
    "Havana", "Bogota", "Lima", "Quito", "Santiago", "Buenos Aires", "Caracas", "La Paz",
    "Sao Paulo", "Rio de Janeiro", "Anchorage", "Honolulu", "Edinburgh", "Glasgow", "Cardiff",
    "Marseille", "Lyon", "Nice", "Seville", "Florence", "Venice", "Salzburg", "Bergen", "Gothenburg",
]
# Never seen in training: tool calls for these test copying an unseen name.
HELDOUT_CITIES = ["Reykjavik", "Montevideo", "Windhoek", "Tallinn", "Kathmandu", "Ljubljana"]

_SYLLABLES = ["ka", "lo", "mar", "ven", "tor", "isa", "bel", "dun", "rho", "sel", "nor", "ta",
              "mi", "gra", "fen", "ost", "ul", "ber", "yan", "quo", "zil", "pe", "dra", "mon",
              "sa", "ri", "vo", "len", "ak", "bur", "eth", "ki", "ham", "wes", "ti", "cor"]

WORDS = [
    "the", "cat", "dog", "sun", "moon", "tree", "house", "river", "apple", "banana", "orange",
    "green", "blue", "red", "yellow", "black", "white", "happy", "quick", "slow", "big", "small",
    "bird", "fish", "water", "fire", "stone", "paper", "book", "pen", "table", "chair", "door",
    "window", "road", "car", "train", "boat", "city", "town", "garden", "flower", "rain", "snow",
    "wind", "cloud", "star", "light", "dark", "night", "day", "morning", "evening", "music",
    "song", "dance", "game", "ball", "friend", "family", "mother", "father", "child", "teacher",
    "school", "market", "bread", "milk", "cheese", "coffee", "tea", "sugar", "salt", "honey",
    "forest", "mountain", "ocean", "island", "bridge", "tower", "castle", "king", "queen",
    "horse", "mouse", "lion", "tiger", "bear", "wolf", "fox", "rabbit", "owl", "frog", "snake",
    "runs", "jumps", "sleeps", "eats", "sings", "reads", "writes", "walks", "swims", "flies",
    "and", "or", "but", "with", "under", "over", "near", "far", "very", "always", "never",
    "red", "silver", "golden", "warm", "cold", "old", "new", "bright", "quiet", "loud", "soft",
]

CONDITIONS = ["sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "partly cloudy", "stormy",
              "clear"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "NOK", "SEK", "CAD", "AUD", "INR"]

TOOL_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_CURRENCY = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
        "required": ["amount", "from", "to"]}}}
ALL_TOOLS = [TOOL_WEATHER, TOOL_TIME, TOOL_CURRENCY]

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are lily-tiny, a small helpful assistant.",
                  "You are a concise assistant."]

IDENTITY = ("I am lily-tiny, a very small model trained for the lily inference engine. I can add "
            "and subtract numbers up to 999, repeat, reverse, uppercase or count words, and call "
            "tools such as get_weather.")

# --------------------------------------------------------------------------------------------
# Generators: each returns one example dict {messages, tools, enable_thinking, kind, ...}
# --------------------------------------------------------------------------------------------

ADD_Q = ["What is {a} + {b}?", "What is {a} plus {b}?", "Calculate {a} + {b}.", "{a} + {b} = ?",
         "Add {a} and {b}.", "What's the sum of {a} and {b}?", "How much is {a}+{b}?",
         "Compute {a}+{b}", "{a}+{b}", "Please add {a} to {b}."]
SUB_Q = ["What is {a} - {b}?", "What is {a} minus {b}?", "Calculate {a} - {b}.", "{a} - {b} = ?",
         "Subtract {b} from {a}.", "What's {a} minus {b}?", "How much is {a}-{b}?",
         "Compute {a}-{b}", "{a}-{b}", "Take {b} away from {a}."]
_PLACES = ["ones", "tens", "hundreds", "thousands"]


def add_scratchpad(a: int, b: int) -> str:
    da, db = str(a)[::-1], str(b)[::-1]
    n = max(len(da), len(db))
    carry, steps = 0, []
    for i in range(n):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append("%s: %d+%d%s=%d" % (_PLACES[i], x, y, "+1" if carry else "", s))
        carry = s // 10
    return ", ".join(steps) + "."


def sub_scratchpad(top: int, bot: int) -> str:
    dt, db = str(top)[::-1], str(bot)[::-1]
    borrow, steps = 0, []
    for i in range(len(dt)):
        x = int(dt[i])
        y = int(db[i]) if i < len(db) else 0
        v = x - y - borrow
        if v < 0:
            steps.append("%s: %d-%d%s=%d, borrow 1" % (_PLACES[i], x + 10, y, "-1" if borrow else "",
                                                      v + 10))
            borrow = 1
        else:
            steps.append("%s: %d-%d%s=%d" % (_PLACES[i], x, y, "-1" if borrow else "", v))
            borrow = 0
    return ", ".join(steps) + "."


def arith_reasoning(a: int, op: str, b: int) -> str:
    if op == "+":
        return "The user asks for %d + %d. %s So %d + %d = %d." % (a, b, add_scratchpad(a, b), a, b,
                                                                 a + b)
    if a >= b:
        return "The user asks for %d - %d. %s So %d - %d = %d." % (a, b, sub_scratchpad(a, b), a, b,
                                                                 a - b)
    return ("The user asks for %d - %d. %d is larger than %d, so I compute %d - %d and negate it. "
            "%s So %d - %d = %d." % (a, b, b, a, b, a, sub_scratchpad(b, a), a, b, a - b))


def arith_answer(rng: random.Random, a: int, op: str, b: int) -> str:
    c = a + b if op == "+" else a - b
    r = rng.random()
    if r < 0.6:
        return "%d %s %d = %d." % (a, op, b, c)
    if r < 0.85:
        return "The answer is %d." % c
    return "%d" % c


def arith_question(rng: random.Random, a: int, op: str, b: int) -> str:
    return rng.choice(ADD_Q if op == "+" else SUB_Q).format(a=a, b=b)


def rand_operand(rng: random.Random) -> int:
    if rng.random() < 0.55:
        return rng.randrange(1000)
    return rng.randrange(10 ** rng.randint(1, 3))


def rand_pair(rng: random.Random, heldout: bool = False) -> tuple[int, int]:
    while True:
        a, b = rand_operand(rng), rand_operand(rng)
        if is_heldout_pair(a, b) == heldout:
            return a, b


def assistant(content: str, reasoning: str, think: bool, tool_calls=None) -> dict:
    m = {"role": "assistant", "content": content, "reasoning_content": reasoning if think else ""}
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


def gen_arith(rng, think, heldout=False):
    a, b = rand_pair(rng, heldout)
    op = rng.choice("+-")
    msgs = [{"role": "user", "content": arith_question(rng, a, op, b)},
            assistant(arith_answer(rng, a, op, b), arith_reasoning(a, op, b), think)]
    return {"kind": "arith", "messages": msgs, "answer": a + b if op == "+" else a - b}


def rand_phrase(rng, lo=2, hi=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def gen_instr(rng, think):
    words = rand_phrase(rng).split()
    phrase = " ".join(words)
    task = rng.choice(["repeat", "reverse", "upper", "count"])
    if task == "repeat":
        q = rng.choice(["Repeat after me: {p}", "Say exactly: {p}", "Please repeat: {p}",
                        "Repeat this text: {p}", "Echo: {p}"]).format(p=phrase)
        reasoning, answer = "The user wants the text repeated exactly: %s." % phrase, phrase
    elif task == "reverse":
        q = rng.choice(["Reverse the order of these words: {p}", "Reverse the words: {p}",
                        "Write these words backwards: {p}", "Say in reverse order: {p}"]
                       ).format(p=phrase)
        rev = " ".join(reversed(words))
        reasoning = "The words are: %s. In reverse order: %s." % (", ".join(words),
                                                                  ", ".join(reversed(words)))
        answer = rev
    elif task == "upper":
        q = rng.choice(["Convert to uppercase: {p}", "Write this in capital letters: {p}",
                        "Uppercase: {p}", "Make this uppercase: {p}"]).format(p=phrase)
        reasoning = "Each word in capital letters: %s." % ", ".join(w.upper() for w in words)
        answer = phrase.upper()
    else:
        q = rng.choice(["How many words are in this sentence: {p}", "Count the words: {p}",
                        "How many words: {p}", "Count the words in \"{p}\""]).format(p=phrase)
        reasoning = "Counting: %s. That is %d words." % (
            ", ".join("%d %s" % (i + 1, w) for i, w in enumerate(words)), len(words))
        answer = rng.choice(["There are %d words.", "%d"]) % len(words)
    msgs = [{"role": "user", "content": q}, assistant(answer, reasoning, think)]
    return {"kind": "instr_" + task, "messages": msgs, "answer": answer}


CHAT = [
    (["Hi", "Hello", "Hello!", "Hi there", "Hey", "Good morning", "Good evening"],
     "The user greets me.", ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?", "What is your name?", "Tell me about yourself.",
      "Introduce yourself."], "The user asks who I am.", [IDENTITY]),
    (["What can you do?", "Help", "How can you help me?", "What are your skills?"],
     "The user asks what I can do.", [IDENTITY]),
    (["Thanks!", "Thank you", "Thank you very much.", "Great, thanks."],
     "The user thanks me.", ["You're welcome!", "Glad I could help."]),
    (["What is the capital of France?", "Write a poem about the sea.", "Explain quantum physics.",
      "Who won the world cup?", "Tell me a story.", "What is the meaning of life?",
      "Translate hello into German.", "Write some Python code."],
     "This is outside what I was trained for.",
     ["I am lily-tiny, a very small test model, so I cannot answer that. I can do arithmetic, "
      "simple word tasks and tool calls."]),
]


def gen_chat(rng, think):
    qs, reasoning, answers = rng.choice(CHAT)
    msgs = [{"role": "user", "content": rng.choice(qs)}, assistant(rng.choice(answers), reasoning,
                                                                   think)]
    return {"kind": "chat", "messages": msgs}


def synth_city(rng):
    while True:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in HELDOUT_CITIES and name not in TRAIN_CITIES:
            return name


def weather_for(rng, city):
    return {"city": city, "temperature": rng.randint(-15, 38), "condition": rng.choice(CONDITIONS)}


WEATHER_Q = ["What's the weather in {c}?", "What is the weather like in {c} today?",
             "How's the weather in {c}?", "Tell me the weather in {c}.", "weather in {c}",
             "Can you check the weather in {c}?", "Is it cold in {c} right now?",
             "What is the temperature in {c}?"]
TIME_Q = ["What time is it in {c}?", "What's the local time in {c}?",
          "Tell me the current time in {c}.", "Can you check the time in {c}?"]
CURR_Q = ["Convert {n} {f} to {t}.", "How much is {n} {f} in {t}?", "What is {n} {f} in {t}?"]


def tool_call(name, args):
    return [{"type": "function", "function": {"name": name, "arguments": args}}]


def tools_with(rng, needed):
    others = [t for t in ALL_TOOLS if t is not needed]
    rng.shuffle(others)
    tools = [needed] + others[: rng.randint(0, 2)] if needed else others[: rng.randint(1, 3)]
    rng.shuffle(tools)
    return tools


def weather_exchange(rng, city, think, q=None):
    """[user, assistant(tool call), tool, assistant(answer)] for a weather question."""
    w = weather_for(rng, city)
    q = q or rng.choice(WEATHER_Q).format(c=city)
    call = assistant("", "The user wants the weather in %s. I will call get_weather with city %s."
                     % (city, city), think, tool_call("get_weather", {"city": city}))
    answer = rng.choice(["The weather in {c} is {w} with a temperature of {t}°C.",
                         "It is {w} in {c} and {t}°C.",
                         "Right now {c} is {w}, {t}°C."]).format(c=city, w=w["condition"],
                                                                 t=w["temperature"])
    final = assistant(answer, "The tool says %s is %s with %d°C." % (city, w["condition"],
                                                                    w["temperature"]), think)
    return [{"role": "user", "content": q}, call,
            {"role": "tool", "content": json.dumps(w, ensure_ascii=False)}, final], w


def gen_tool(rng, think):
    r = rng.random()
    city = rng.choice(TRAIN_CITIES) if rng.random() < 0.6 else synth_city(rng)
    if r < 0.6:
        tools = tools_with(rng, TOOL_WEATHER)
        msgs, _ = weather_exchange(rng, city, think)
        kind = "tool_weather"
    elif r < 0.78:
        tools = tools_with(rng, TOOL_TIME)
        hh, mm = rng.randrange(24), rng.randrange(60)
        t = "%02d:%02d" % (hh, mm)
        msgs = [{"role": "user", "content": rng.choice(TIME_Q).format(c=city)},
                assistant("", "The user wants the local time in %s. I will call get_time with city "
                          "%s." % (city, city), think, tool_call("get_time", {"city": city})),
                {"role": "tool", "content": json.dumps({"city": city, "time": t})},
                assistant("The local time in %s is %s." % (city, t),
                          "The tool says it is %s in %s." % (t, city), think)]
        kind = "tool_time"
    elif r < 0.88:
        tools = tools_with(rng, TOOL_CURRENCY)
        n = rng.choice([rng.randint(1, 999), rng.randint(1, 99) * 10])
        f, t = rng.sample(CURRENCIES, 2)
        res = round(n * rng.uniform(0.05, 3.0), 2)
        msgs = [{"role": "user", "content": rng.choice(CURR_Q).format(n=n, f=f, t=t)},
                assistant("", "The user wants to convert %d %s to %s. I will call convert_currency."
                          % (n, f, t), think,
                          tool_call("convert_currency", {"amount": n, "from": f, "to": t})),
                {"role": "tool", "content": json.dumps({"amount": n, "from": f, "to": t,
                                                        "result": res})},
                assistant("%d %s is %s %s." % (n, f, res, t),
                          "The tool says %d %s is %s %s." % (n, f, res, t), think)]
        kind = "tool_currency"
    else:
        # Tools are offered but none is needed: answer directly.
        tools = tools_with(rng, None)
        ex = gen_arith(rng, think) if rng.random() < 0.6 else gen_instr(rng, think)
        msgs, kind = ex["messages"], "tool_none"
    if kind != "tool_none" and rng.random() < 0.3:
        msgs = msgs[:2]                      # stop after the call (a shorter example)
    return {"kind": kind, "messages": msgs, "tools": tools}


def gen_multi(rng, think):
    first = rng.choice([gen_arith, gen_instr, gen_chat])(rng, think)
    second = rng.choice([gen_arith, gen_arith, gen_instr, gen_chat])(rng, think)
    return {"kind": "multi", "messages": first["messages"] + second["messages"]}


MIX = [(gen_arith, 0.45), (gen_instr, 0.17), (gen_tool, 0.22), (gen_chat, 0.05), (gen_multi, 0.11)]


def generate_one(rng: random.Random) -> dict:
    think = rng.random() < 0.7
    r, acc = rng.random(), 0.0
    for fn, p in MIX:
        acc += p
        if r < acc:
            break
    ex = fn(rng, think)
    if "tools" not in ex and rng.random() < 0.3:
        ex["messages"] = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] + ex["messages"]
    elif "tools" in ex and rng.random() < 0.2:
        ex["messages"] = [{"role": "system", "content": SYSTEM_PROMPTS[0]}] + ex["messages"]
    ex["enable_thinking"] = think
    return ex


def generate(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [generate_one(rng) for _ in range(n)]


def render_chunk(args) -> list[list[tuple[str, bool]]]:
    """Worker entry point: (seed, n) -> segments of n examples (a template per process)."""
    seed, n = args
    template = make_template()
    return [segments(template, ex) for ex in generate(seed, n)]


# --------------------------------------------------------------------------------------------
# Held-out test set
# --------------------------------------------------------------------------------------------

def expected_tool_text(name: str, args: dict) -> str:
    s = "<tool_call>\n<function=%s>\n" % name
    for k, v in args.items():
        s += "<parameter=%s>\n%s\n</parameter>\n" % (k, v if isinstance(v, str) else json.dumps(v))
    return s + "</function>\n</tool_call>"


def heldout_tests(seed: int = 1234, n_arith: int = 200) -> dict:
    """Ready-made prompts whose answers need generalisation (never seen in training)."""
    rng = random.Random(seed)
    template = make_template()
    tests = []
    seen = set()
    while len([t for t in tests if t["kind"] == "arith"]) < n_arith:
        a, b = rand_pair(rng, heldout=True)
        op = "+-"[len(tests) % 2]
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        think = len(tests) % 4 != 3          # a quarter with thinking off
        tests.append({"kind": "arith", "enable_thinking": think, "tools": None,
                      "messages": [{"role": "user", "content": arith_question(rng, a, op, b)}],
                      "expected_answer": str(a + b if op == "+" else a - b)})
    for i, city in enumerate(HELDOUT_CITIES):
        tools = [TOOL_WEATHER, TOOL_TIME] if i % 2 == 0 else [TOOL_TIME, TOOL_CURRENCY, TOOL_WEATHER]
        q = WEATHER_Q[i % 3].format(c=city)
        tests.append({"kind": "tool_call", "enable_thinking": True, "tools": tools,
                      "messages": [{"role": "user", "content": q}],
                      "expected_tool_call": {"name": "get_weather", "arguments": {"city": city}},
                      "expected_content": expected_tool_text("get_weather", {"city": city})})
        msgs, w = weather_exchange(rng, city, True, q)
        tests.append({"kind": "tool_answer", "enable_thinking": True, "tools": tools,
                      "messages": msgs[:3],
                      "expected_contains": [city, str(w["temperature"]), w["condition"]]})
    for _ in range(24):
        ex = gen_instr(rng, True)
        tests.append({"kind": ex["kind"], "enable_thinking": True, "tools": None,
                      "messages": ex["messages"][:1], "expected_content": ex["answer"]})
    tests.append({"kind": "chat", "enable_thinking": True, "tools": None,
                  "messages": [{"role": "user", "content": "Who are you?"}],
                  "expected_contains": ["lily-tiny"]})
    for t in tests:
        t["prompt"] = generation_prompt(template, t)
    return {
        "description": "Held-out tests for lily-tiny. Each test: messages (+ tools, "
                       "enable_thinking) rendered with the Qwen3.6 template into `prompt` (the full "
                       "generation prompt). Greedy decoding. Content = the completion after "
                       "'</think>' (stripped), up to <|im_end|>. arith: the last integer of the "
                       "content equals expected_answer. tool_call: content equals "
                       "expected_content (one Qwen XML tool call). tool_answer / chat: content "
                       "contains every expected_contains string. instr_*: content equals "
                       "expected_content.",
        "heldout_pair_rule": "(a*7 + b*13) % 10 == 0, for both + and -; such pairs never occur "
                             "in training",
        "heldout_cities": HELDOUT_CITIES,
        "tests": tests,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def _check(n: int, seed: int) -> None:
    template = make_template()
    kinds: dict[str, int] = {}
    chars = 0
    for ex in generate(seed, n):
        segs = segments(template, ex)
        kinds[ex["kind"]] = kinds.get(ex["kind"], 0) + 1
        chars += sum(len(s) for s, _ in segs)
        for s, loss in segs:
            if loss:
                assert s.endswith(IM_END) and s.count(IM_END) == 1, s
        # arithmetic must be correct and never use a held-out pair
        for m in ex["messages"]:
            if m["role"] == "user":
                nums = re.findall(r"\d+", m["content"])
                if ex["kind"] in ("arith",) and len(nums) == 2:
                    assert not is_heldout_pair(int(nums[0]), int(nums[1])), m
                for c in HELDOUT_CITIES:
                    assert c not in m["content"], m
        if ex["kind"] == "arith":
            content = ex["messages"][-1]["content"]
            assert content.endswith((str(ex["answer"]), str(ex["answer"]) + ".")), ex
    ho = heldout_tests()
    print("ok: %d examples, %.0f chars/example, kinds %s; %d held-out tests" % (
        n, chars / n, json.dumps(dict(sorted(kinds.items()))), len(ho["tests"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=0, help="print N rendered examples")
    ap.add_argument("--check", type=int, default=0, help="self-check N examples")
    args = ap.parse_args()
    if args.show:
        template = make_template()
        for ex in generate(args.seed, args.show):
            print("=" * 30, ex["kind"], "thinking" if ex["enable_thinking"] else "no-thinking")
            for s, loss in segments(template, ex):
                print(("\x1b[32m%s\x1b[0m" if loss else "%s") % s, end="")
            print()
    if args.check:
        _check(args.check, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
