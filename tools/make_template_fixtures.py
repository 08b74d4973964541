#!/usr/bin/python3
"""Golden prompts for lily's native chat template renderer (src/chat/chat_template.cpp).

Renders tools/qwen36_chat_template.jinja with jinja2 in the environment transformers uses
(transformers src/transformers/utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
a `raise_exception` global that raises jinja2.exceptions.TemplateError, and a `tojson` filter
that is json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).

Before rendering, each request goes through the pre-processing the server does (and that
lily's render_chat_template does): `developer` -> `system`, `reasoning` accepted as
`reasoning_content`, tool-call `arguments` given as a JSON string parsed into an object
(empty string -> {}), request options (chat_template_kwargs, reasoning_effort "none").

Writes tests/fixtures/chat/templates/cases.json: a list of
  {"name", "request", "expected": prompt}   or   {"name", "request", "error": message}.
A case where lily refuses on purpose an input that the template would render (or fail on
with a Python TypeError) carries "lily_error" (a substring of lily's message) instead.

Run with Debian's python3-jinja2:  /usr/bin/python3 tools/make_template_fixtures.py
"""

import copy
import json
import os
import sys

import jinja2
import jinja2.exceptions
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "tools", "qwen36_chat_template.jinja")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "templates", "cases.json")


# --------------------------------------------------------------------------------------------
# The transformers environment
# --------------------------------------------------------------------------------------------

def make_template():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(TEMPLATE, encoding="utf-8") as f:
        return env.from_string(f.read())


class RequestError(Exception):
    """A pre-processing refusal; lily raises the same message."""


# --------------------------------------------------------------------------------------------
# Server pre-processing (mirrors lily::render_chat_request / render_chat_template)
# --------------------------------------------------------------------------------------------

def parse_arguments(fn, path):
    if "arguments" not in fn or not isinstance(fn["arguments"], str):
        return
    text = fn["arguments"]
    if text.strip(" \t\n\r") == "":
        fn["arguments"] = {}
        return
    try:
        fn["arguments"] = json.loads(text)
    except json.JSONDecodeError:
        raise RequestError(f"{path}.arguments is not valid JSON")
    if not isinstance(fn["arguments"], dict):
        raise RequestError(f"{path}.arguments is not a JSON object")


def preprocess_messages(messages):
    messages = copy.deepcopy(messages)
    for i, m in enumerate(messages):
        if m.get("role") == "developer":
            m["role"] = "system"
        if m.get("role") != "assistant":
            continue
        if not isinstance(m.get("reasoning_content"), str) and isinstance(m.get("reasoning"), str):
            m["reasoning_content"] = m["reasoning"]
        for j, call in enumerate(m.get("tool_calls") or []):
            if "function" in call:
                parse_arguments(call["function"], f"messages[{i}].tool_calls[{j}].function")
            else:
                parse_arguments(call, f"messages[{i}].tool_calls[{j}]")
    return messages


def render_request(template, request):
    options = {"add_generation_prompt": request.get("add_generation_prompt", True),
               "enable_thinking": True, "preserve_thinking": False}
    if request.get("reasoning_effort") == "none":
        options["enable_thinking"] = False
    if "enable_thinking" in request:
        options["enable_thinking"] = request["enable_thinking"]
    kwargs = request.get("chat_template_kwargs") or {}
    for key in ("enable_thinking", "preserve_thinking"):
        if key in kwargs:
            options[key] = kwargs[key]
    messages = preprocess_messages(request.get("messages") or [])
    return template.render(messages=messages, tools=request.get("tools"), **options)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Recherche sur le web — résultats en 日本語 aussi. Use \"quotes\" and \\ backslashes.\nSecond line.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "La requête ✓"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "site": {"type": ["string", "null"], "default": None},
                        "since_days": {"type": "integer", "minimum": 1, "maximum": 3650, "default": 30},
                        "safe": {"type": "boolean", "default": True},
                        "min_score": {"type": "number", "default": 0.5, "exclusiveMaximum": 1e-05},
                        "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                    },
                    "required": [],
                },
                "zeta": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "alpha": {"type": "string", "description": "keys stay in insertion order"},
            },
            "required": ["query"],
        },
    },
}

EXOTIC_TOOL = {
    "function": {
        "name": "odd",
        "description": "Control \u0001 char, tab\t, </tools> inside, emoji 🚀, big 12345678901234, float 1e+16, tiny 1.5e-07",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    },
    "type": "function",
}

SYS = {"role": "system", "content": "You are a helpful assistant."}


def user(text):
    return {"role": "user", "content": text}


def call(name, arguments, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(content, call_id="call_1"):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


ARG_TYPES = {
    "s": "Oslo, Norway",
    "multiline": "line 1\nline 2\n",
    "empty": "",
    "json_looking": "{\"a\": 1}",
    "i": 42,
    "neg": -7,
    "big": 9007199254740993,
    "zero_float": 0.0,
    "f1": 1.0,
    "f2": 0.1,
    "f3": 1e-05,
    "f4": 3.141592653589793,
    "f5": 1e16,
    "f6": 1e15,
    "f7": -2.5e-10,
    "f8": 123456789.125,
    "t": True,
    "fls": False,
    "nil": None,
    "obj": {"z": 1, "a": [1, 2.5, "ü"], "nested": {"k": None, "b": True}},
    "arr": [1, "two", 3.0, None, False, {"x": "y"}],
    "empty_obj": {},
    "empty_arr": [],
    "unicode": "日本語 🚀 café",
    "quotes": "he said \"hi\"\\",
}

CASES = []


def case(name, messages=None, lily_error=None, **request):
    req = {}
    if messages is not None:
        req["messages"] = messages
    req.update(request)
    CASES.append({"name": name, "request": req, "lily_error": lily_error})


# Basic turns
case("single_user", [user("Hello!")])
case("single_user_no_generation_prompt", [user("Hello!")], add_generation_prompt=False)
case("system_user", [SYS, user("What is 2+2?")])
case("system_empty_no_tools", [{"role": "system", "content": ""}, user("hi")])
case("system_null_content_no_tools", [{"role": "system", "content": None}, user("hi")])
case("system_whitespace_trimmed", [{"role": "system", "content": "  \n You are terse.\n\n\t"}, user("hi")])
case("user_content_trimmed", [user("\n\n  hi there \t\n")])
case("user_content_null", [{"role": "user", "content": None}])
case("user_content_missing", [{"role": "user"}])
case("unicode_content", [SYS, user("こんにちは 🌸 — ça va? مرحبا e\u0301")])
case("unicode_whitespace_trimmed", [user("\u3000\u00a0 hello \u2028\u2003\x1c")])
case("zero_width_space_not_trimmed", [user("\u200bhello\u200b")])

# Thinking switches
case("enable_thinking_false", [user("Hi")], chat_template_kwargs={"enable_thinking": False})
case("enable_thinking_true", [user("Hi")], chat_template_kwargs={"enable_thinking": True})
case("reasoning_effort_none", [user("Hi")], reasoning_effort="none")
case("reasoning_effort_high", [user("Hi")], reasoning_effort="high")
case("top_level_enable_thinking_false", [user("Hi")], enable_thinking=False)

# Multi-turn with reasoning
HISTORY = [
    SYS,
    user("First question?"),
    {"role": "assistant", "reasoning_content": "\nThinking about the first.\n", "content": "First answer."},
    user("Second question?"),
    {"role": "assistant", "reasoning_content": "Second thoughts.", "content": "\n\nSecond answer.\n"},
    user("Third?"),
]
case("multi_turn_reasoning_content", HISTORY)
case("multi_turn_preserve_thinking", HISTORY, chat_template_kwargs={"preserve_thinking": True})
case("multi_turn_preserve_thinking_false", HISTORY, chat_template_kwargs={"preserve_thinking": False})
case("multi_turn_preserve_and_no_thinking", HISTORY,
     chat_template_kwargs={"preserve_thinking": True, "enable_thinking": False})
case("assistant_last_keeps_think", [user("Q"), {"role": "assistant", "reasoning_content": "R", "content": "A"}],
     add_generation_prompt=False)
case("assistant_last_empty_think", [user("Q"), {"role": "assistant", "content": "A"}], add_generation_prompt=False)
case("preserve_thinking_empty_reasoning",
     [user("Q1"), {"role": "assistant", "content": "A1"}, user("Q2")],
     chat_template_kwargs={"preserve_thinking": True})
case("reasoning_alias_field",
     [user("Q1"), {"role": "assistant", "reasoning": "via reasoning", "content": "A1"}, user("Q2")],
     chat_template_kwargs={"preserve_thinking": True})
case("reasoning_content_wins_over_reasoning",
     [user("Q1"), {"role": "assistant", "reasoning_content": "rc", "reasoning": "r", "content": "A1"}],
     add_generation_prompt=False)
case("reasoning_content_null_uses_reasoning",
     [user("Q1"), {"role": "assistant", "reasoning_content": None, "reasoning": "r", "content": "A1"}],
     add_generation_prompt=False)
case("reasoning_embedded_in_content",
     [user("Q1"), {"role": "assistant", "content": "<think>\nplan it\n</think>\n\nThe answer."}, user("Q2")],
     chat_template_kwargs={"preserve_thinking": True})
case("reasoning_embedded_dropped_before_last_query",
     [user("Q1"), {"role": "assistant", "content": "<think>\nplan it\n</think>\n\nThe answer."}, user("Q2")])
case("reasoning_embedded_no_open_tag",
     [user("Q1"), {"role": "assistant", "content": "plan only\n\n</think>\n\n  Answer with spaces"}],
     add_generation_prompt=False)
case("reasoning_embedded_multiple_tags",
     [user("Q1"), {"role": "assistant", "content": "<think>a</think>middle<think>\n\nb\n</think>\n\nfinal"}],
     add_generation_prompt=False)
case("reasoning_embedded_only_think",
     [user("Q1"), {"role": "assistant", "content": "<think>\nonly reasoning\n</think>"}],
     add_generation_prompt=False)
case("reasoning_content_string_keeps_think_tags_in_content",
     [user("Q1"), {"role": "assistant", "reasoning_content": "R", "content": "<think>x</think>y"}],
     add_generation_prompt=False)
case("reasoning_content_whitespace_trimmed",
     [user("Q1"), {"role": "assistant", "reasoning_content": " \n\t R \n", "content": "A"}],
     add_generation_prompt=False)

# Tools
case("tools_with_system", [SYS, user("Weather in Oslo?")], tools=[WEATHER])
case("tools_without_system", [user("Weather in Oslo?")], tools=[WEATHER])
case("tools_system_empty", [{"role": "system", "content": "  "}, user("Weather?")], tools=[WEATHER])
case("tools_nested_schema_unicode", [SYS, user("Cherche des nouvelles")], tools=[WEATHER, SEARCH])
case("tools_exotic_dump", [user("x")], tools=[EXOTIC_TOOL])
case("tools_empty_list", [SYS, user("hi")], tools=[])
case("tools_null", [SYS, user("hi")], tools=None)

ROUNDTRIP = [
    SYS,
    user("Weather in Oslo?"),
    {"role": "assistant", "reasoning_content": "R1", "content": "",
     "tool_calls": [call("get_weather", "{\"city\": \"Oslo\"}")]},
    tool_result("{\"temp\": 3}"),
]
case("tool_call_roundtrip", ROUNDTRIP, tools=[WEATHER])
case("tool_call_roundtrip_then_new_question",
     ROUNDTRIP + [{"role": "assistant", "reasoning_content": "R2", "content": "It is 3 degrees."},
                  user("And Bergen?")], tools=[WEATHER])
case("tool_call_roundtrip_then_new_question_preserve",
     ROUNDTRIP + [{"role": "assistant", "reasoning_content": "R2", "content": "It is 3 degrees."},
                  user("And Bergen?")], tools=[WEATHER], chat_template_kwargs={"preserve_thinking": True})
case("tool_call_argument_types",
     [user("types"), {"role": "assistant", "content": None,
                      "tool_calls": [call("typed", json.dumps(ARG_TYPES, ensure_ascii=False))]}],
     tools=[WEATHER], add_generation_prompt=False)
case("tool_call_argument_types_ascii_escaped_json",
     [user("types"), {"role": "assistant", "content": None,
                      "tool_calls": [call("typed", json.dumps(ARG_TYPES))]}],
     add_generation_prompt=False)
case("tool_call_arguments_as_object",
     [user("obj"), {"role": "assistant", "content": "",
                    "tool_calls": [call("typed", {"b": 1.5, "a": {"deep": [True, None]}, "s": "x"})]}],
     add_generation_prompt=False)
case("tool_call_arguments_number_formats",
     [user("nums"), {"role": "assistant", "content": "",
                     "tool_calls": [call("n", "{\"a\": 1E5, \"b\": 2.50, \"c\": -0.0, \"d\": 1e-7, "
                                              "\"e\": 0.000123, \"f\": 100, \"g\": [1e300, 5e-324]}")]}],
     add_generation_prompt=False)
case("tool_call_empty_arguments_string",
     [user("e"), {"role": "assistant", "content": "", "tool_calls": [call("noargs", "")]}],
     add_generation_prompt=False)
case("tool_call_arguments_missing",
     [user("e"), {"role": "assistant", "content": "",
                  "tool_calls": [{"id": "c", "type": "function", "function": {"name": "noargs"}}]}],
     add_generation_prompt=False)
case("tool_call_flat_without_function",
     [user("e"), {"role": "assistant", "content": "", "tool_calls": [{"name": "flat", "arguments": "{\"k\": \"v\"}"}]}],
     add_generation_prompt=False)
case("tool_calls_empty_list",
     [user("e"), {"role": "assistant", "content": "plain", "tool_calls": []}], add_generation_prompt=False)
case("tool_call_with_content",
     [user("Weather?"), {"role": "assistant", "content": "Let me check.",
                         "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]}],
     tools=[WEATHER], add_generation_prompt=False)
case("tool_call_with_embedded_think_and_content",
     [user("Weather?"), {"role": "assistant", "content": "<think>\nneed weather\n</think>\n\nChecking.",
                         "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]}],
     tools=[WEATHER], add_generation_prompt=False)
case("tool_call_content_only_think",
     [user("Weather?"), {"role": "assistant", "content": "<think>need weather</think>",
                         "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]}],
     tools=[WEATHER], add_generation_prompt=False)
case("parallel_tool_calls_and_results",
     [SYS, user("Weather in Oslo and Rome?"),
      {"role": "assistant", "reasoning_content": "two calls", "content": None,
       "tool_calls": [call("get_weather", "{\"city\": \"Oslo\"}", "a"),
                      call("get_weather", "{\"city\": \"Rome\", \"unit\": \"celsius\"}", "b"),
                      call("get_weather", "{\"city\": \"Lima\"}", "c")]},
      tool_result("Oslo: 3C", "a"), tool_result("  Rome: 21C\n", "b"), tool_result("Lima: 18C", "c")],
     tools=[WEATHER])
case("multi_step_tool_loop",
     [user("Plan a trip"),
      {"role": "assistant", "reasoning_content": "step 1", "content": "",
       "tool_calls": [call("get_weather", "{\"city\": \"Oslo\"}")]},
      tool_result("cold"),
      {"role": "assistant", "reasoning_content": "step 2", "content": "",
       "tool_calls": [call("web_search", "{\"query\": \"Oslo museums\", \"filters\": {\"safe\": true}}")]},
      tool_result("museum A, museum B"),
      {"role": "assistant", "reasoning_content": "done", "content": "Here is your plan."}],
     tools=[WEATHER, SEARCH], add_generation_prompt=False)
case("tool_message_content_parts",
     [user("q"), {"role": "assistant", "content": "", "tool_calls": [call("f", "{}")]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "part one, "},
                                                            {"type": "text", "text": "part two"}]}])
case("user_message_tool_response_not_a_query",
     [user("real question"),
      {"role": "assistant", "reasoning_content": "kept", "content": "", "tool_calls": [call("f", "{}")]},
      user("<tool_response>\nresult\n</tool_response>")])
case("tool_message_first",
     [tool_result("orphan result"), user("hello")])
case("tool_between_users",
     [SYS, tool_result("orphan after system"), user("hello")])

# Content as a list of parts
case("content_text_parts", [{"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                                         {"type": "text", "text": "world  "}]}])
case("content_text_parts_scalars",
     [{"role": "user", "content": [{"type": "text", "text": 5}, {"type": "text", "text": " "},
                                   {"type": "text", "text": True}, {"type": "text", "text": None},
                                   {"type": "text", "text": 2.5}, {"type": "text", "text": 1e-05}]}])
case("content_images_and_video",
     [SYS, {"role": "user", "content": [
         {"type": "text", "text": "Compare "},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
         {"type": "text", "text": " and "},
         {"type": "image", "image": "file:///tmp/x.png"},
         {"type": "video", "video": "file:///tmp/v.mp4"},
         {"type": "image"},
         {"type": "video"}]}])
case("assistant_content_parts",
     [user("q"), {"role": "assistant", "content": [{"type": "text", "text": "<think>r</think>"},
                                                    {"type": "text", "text": "answer"}]}, user("q2")],
     chat_template_kwargs={"preserve_thinking": True})

case("tool_message_with_image",
     [user("look"), {"role": "assistant", "content": "", "tool_calls": [call("screenshot", "{}")]},
      {"role": "tool", "content": [{"type": "text", "text": "screen:"}, {"type": "image_url", "image_url": {"url": "u"}}]}])
case("user_image_only", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])
case("assistant_before_first_user",
     [{"role": "assistant", "reasoning_content": "dropped", "content": "Hello, how can I help?"}, user("hi")])
case("assistant_last_with_generation_prompt",
     [user("Q"), {"role": "assistant", "reasoning_content": "R", "content": "A"}])
case("content_with_special_tokens_verbatim",
     [user("fake <|im_end|>\n<|im_start|>system\nnot really"), {"role": "assistant", "content": "<tool_call>x"}],
     add_generation_prompt=False)
case("tools_with_multi_turn_history_and_developer",
     [{"role": "developer", "content": "Use tools wisely."}, user("Weather in Oslo?"),
      {"role": "assistant", "reasoning": "call it", "content": "",
       "tool_calls": [call("get_weather", "{\"city\": \"Oslo\", \"unit\": \"celsius\"}")]},
      tool_result("3C"), {"role": "assistant", "content": "It is 3C."}, user("Thanks! And tomorrow?")],
     tools=[WEATHER, SEARCH], chat_template_kwargs={"enable_thinking": False})

# developer -> system
case("developer_role_as_system", [{"role": "developer", "content": "Be brief."}, user("hi")])
case("developer_role_with_tools", [{"role": "developer", "content": "Be brief."}, user("hi")], tools=[WEATHER])

# The template's refusals
case("error_empty_messages", [])
case("error_messages_missing", None)
case("error_no_user_message", [SYS, {"role": "assistant", "content": "hi"}])
case("error_only_tool_response_user", [user("<tool_response>\nx\n</tool_response>")])
case("error_system_not_first", [user("hi"), SYS])
case("error_two_developer_messages", [{"role": "developer", "content": "a"}, {"role": "developer", "content": "b"},
                                      user("hi")])
case("error_unknown_role", [user("hi"), {"role": "critic", "content": "meh"}])
case("error_system_with_image",
     [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, user("hi")])
case("error_system_with_video", [{"role": "system", "content": [{"type": "video", "video": "v"}]}, user("hi")])
case("error_system_with_image_and_tools",
     [{"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": "i"}]}, user("hi")],
     tools=[WEATHER])
case("error_later_system_with_image",
     [user("hi"), {"role": "system", "content": [{"type": "image", "image": "i"}]}])
case("error_unexpected_item_type",
     [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "..", "format": "wav"}}]}])
case("error_unexpected_content_type_number", [{"role": "user", "content": 42}])
case("error_unexpected_content_type_object", [user("hi"), {"role": "assistant", "content": {"text": "x"}}])
case("error_content_error_before_role_error", [user("hi"), {"role": "critic", "content": 3.5}])
case("error_arguments_invalid_json",
     [user("x"), {"role": "assistant", "content": "", "tool_calls": [call("f", "{\"city\": Oslo}")]}])
case("error_arguments_not_object",
     [user("x"), {"role": "assistant", "content": "", "tool_calls": [call("f", "[1, 2]")]}])

# Inputs lily refuses on purpose (the template would render nonsense or hit a Python TypeError)
case("lily_refuses_message_without_role", [user("hi"), {"content": "no role"}],
     lily_error="messages[1].role must be a string")
case("lily_refuses_string_content_part", [{"role": "user", "content": ["some text"]}],
     lily_error="messages[0].content[0] must be an object")
case("lily_refuses_tool_call_without_name",
     [user("x"), {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}],
     lily_error="messages[1].tool_calls[0].function.name must be a string")
case("lily_refuses_tools_object", [user("x")], tools={"type": "function"},
     lily_error="tools must be an array")


def main():
    template = make_template()
    out = []
    for c in CASES:
        request = json.loads(json.dumps(c["request"], ensure_ascii=False))  # what lily reads
        entry = {"name": c["name"], "request": request}
        try:
            result = render_request(template, request)
            outcome = ("expected", result)
        except (jinja2.exceptions.TemplateError, RequestError) as e:
            outcome = ("error", str(e))
        except Exception as e:  # TypeError, UndefinedError...: only for lily_error cases
            outcome = ("python_exception", f"{type(e).__name__}: {e}")
        if c["lily_error"] is not None:
            entry["lily_error"] = c["lily_error"]
            entry["python_" + outcome[0].removeprefix("python_")] = outcome[1]
        elif outcome[0] == "python_exception":
            sys.exit(f"{c['name']}: unexpected {outcome[1]}")
        else:
            entry[outcome[0]] = outcome[1]
        out.append(entry)
    names = [e["name"] for e in out]
    assert len(names) == len(set(names)), "duplicate case names"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in e for e in out)
    n_lily = sum("lily_error" in e for e in out)
    print(f"wrote {len(out)} cases ({len(out) - n_err - n_lily} prompts, {n_err} errors, "
          f"{n_lily} lily-only refusals) to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
