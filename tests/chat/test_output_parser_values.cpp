// test_output_parser_values.cpp: typing of tool-call values by schema, the JSON layout of the
// arguments, and the block parser on its own (tool_call_xml.h).
#include "chat/tool_call_xml.h"

#include <gtest/gtest.h>

#include <string>

namespace lily {
namespace {

// The value as the arguments JSON would show it.
std::string typed(const std::string& raw, const char* schema) {
  json s = json::parse(schema);
  return dump_json_python_style(convert_parameter_value(raw, s.is_null() ? nullptr : &s));
}

TEST(output_parser_values, String) {
  EXPECT_EQ(typed("42", R"({"type": "string"})"), R"("42")");
  EXPECT_EQ(typed("null", R"({"type": "string"})"), R"("null")");
  EXPECT_EQ(typed(" a \"b\"\n", R"({"type": "str"})"), R"(" a \"b\"\n")");
  EXPECT_EQ(typed("x", R"({"type": "string", "enum": ["x", "y"]})"), R"("x")");
}

TEST(output_parser_values, Integer) {
  EXPECT_EQ(typed("7", R"({"type": "integer"})"), "7");
  EXPECT_EQ(typed(" -12 ", R"({"type": "integer"})"), "-12");
  EXPECT_EQ(typed("+3", R"({"type": "int"})"), "3");
  EXPECT_EQ(typed("5.0", R"({"type": "integer"})"), "5");
  EXPECT_EQ(typed("5.5", R"({"type": "integer"})"), "5.5");  // not an integer: untyped (JSON)
  EXPECT_EQ(typed("three", R"({"type": "integer"})"), R"("three")");
  EXPECT_EQ(typed("None", R"({"type": "integer"})"), "null");
}

TEST(output_parser_values, Number) {
  EXPECT_EQ(typed("21.5", R"({"type": "number"})"), "21.5");
  EXPECT_EQ(typed("3", R"({"type": "number"})"), "3");
  EXPECT_EQ(typed(".5", R"({"type": "number"})"), "0.5");
  EXPECT_EQ(typed("1e3", R"({"type": "float"})"), "1000.0");
  EXPECT_EQ(typed("inf", R"({"type": "number"})"), R"("inf")");
  EXPECT_EQ(typed("12abc", R"({"type": "number"})"), R"("12abc")");
}

TEST(output_parser_values, Boolean) {
  EXPECT_EQ(typed("true", R"({"type": "boolean"})"), "true");
  EXPECT_EQ(typed("True", R"({"type": "boolean"})"), "true");
  EXPECT_EQ(typed("FALSE", R"({"type": "bool"})"), "false");
  EXPECT_EQ(typed("yes", R"({"type": "boolean"})"), R"("yes")");
}

TEST(output_parser_values, ObjectAndArray) {
  EXPECT_EQ(typed(R"({"a": [1, {"b": null}]})", R"({"type": "object"})"), R"({"a": [1, {"b": null}]})");
  EXPECT_EQ(typed("{'a': True, 'b': None, 'c': 'it\\'s \"x\"'}", R"({"type": "object"})"),
            R"({"a": true, "b": null, "c": "it's \"x\""})");
  EXPECT_EQ(typed(R"("{'k': 'v'}")", R"({"type": "dict"})"), R"({"k": "v"})");
  EXPECT_EQ(typed("[1, 'two', (3, 4)]", R"({"type": "array"})"), R"([1, "two", [3, 4]])");
  EXPECT_EQ(typed("[1, 2]", R"({"type": "object"})"), "[1, 2]");  // wrong kind: untyped
  EXPECT_EQ(typed("not json", R"({"type": "array"})"), R"("not json")");
  EXPECT_EQ(typed("{\"a\": ", R"({"type": "object"})"), R"("{\"a\": ")");
}

TEST(output_parser_values, NullAndUnions) {
  EXPECT_EQ(typed("null", R"({"type": "null"})"), "null");
  EXPECT_EQ(typed("None", R"({"anyOf": [{"type": "string"}, {"type": "null"}]})"), "null");
  EXPECT_EQ(typed("Oslo", R"({"anyOf": [{"type": "string"}, {"type": "null"}]})"), R"("Oslo")");
  EXPECT_EQ(typed("4", R"({"type": ["integer", "string"]})"), "4");
  EXPECT_EQ(typed("four", R"({"type": ["integer", "string"]})"), R"("four")");
  EXPECT_EQ(typed("[1]", R"({"oneOf": [{"type": "array"}, {"type": "boolean"}]})"), "[1]");
  EXPECT_EQ(typed("true", R"({"oneOf": [{"type": "array"}, {"type": "boolean"}]})"), "true");
}

TEST(output_parser_values, NoSchema) {
  EXPECT_EQ(typed("5", "null"), "5");
  EXPECT_EQ(typed("Oslo", "null"), R"("Oslo")");
  EXPECT_EQ(typed("{\"x\": 1}", "null"), R"({"x": 1})");
  EXPECT_EQ(typed("{'x': True}", "null"), R"({"x": true})");
  EXPECT_EQ(typed("'quoted'", "null"), R"("'quoted'")");
  EXPECT_EQ(typed("None", "null"), "null");
  EXPECT_EQ(typed("anything", R"({"description": "no type"})"), R"("anything")");
}

TEST(output_parser_values, PythonStyleLayout) {
  json v = json::parse(R"({"a": [1, 2.5, {"b": "ü 🙂"}], "c": {}, "d": []})");
  EXPECT_EQ(dump_json_python_style(v), R"({"a": [1, 2.5, {"b": "ü 🙂"}], "c": {}, "d": []})");
  EXPECT_EQ(dump_json_python_style(json("bad \xC3")), "\"bad \xEF\xBF\xBD\"");
}

TEST(output_parser_xml, SchemasFromEitherToolShape) {
  ToolSchemas schemas(json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}},
    {"name": "g", "parameters": {"properties": {"s": {"type": "string"}}}},
    "junk", {"function": {"name": 3}}])"));
  ASSERT_NE(schemas.find_parameter("f", "n"), nullptr);
  ASSERT_NE(schemas.find_parameter("g", "s"), nullptr);
  EXPECT_EQ(schemas.find_parameter("f", "s"), nullptr);
  EXPECT_EQ(schemas.find_parameter("h", "n"), nullptr);
  auto call = parse_tool_call_xml("\n<function=g>\n<parameter=s>\n12\n</parameter>\n</function>\n", schemas);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->arguments_json, R"({"s": "12"})");
}

TEST(output_parser_xml, Structure) {
  ToolSchemas none;
  auto parse = [&](std::string_view body) {
    auto call = parse_tool_call_xml(body, none);
    return call ? call->name + " " + call->arguments_json : std::string("not a call");
  };
  EXPECT_EQ(parse("<function=f></function>"), "f {}");
  EXPECT_EQ(parse("\n<function= f >\n<parameter= a >\n1\n</parameter>\n</function>\n"), "f {\"a\": 1}");
  // Written twice: the first value stays (it may have been streamed already).
  EXPECT_EQ(parse("<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>"),
            "f {\"a\": 1}");
  EXPECT_EQ(parse("<function=f>\n<parameter=a>\nx\n</parameter>\n"), "f {\"a\": \"x\"}");
  EXPECT_EQ(parse("<function=f>\n<parameter=a>\nx\n</function>"), "f {\"a\": \"x\"}");
  EXPECT_EQ(parse("<function=f>\n<parameter=a>\nx"), "f {\"a\": \"x\"}");
  // require_function_end: only arguments a whole </function> ended.
  auto ended = [&](std::string_view body) { return parse_tool_call_xml(body, none, true).has_value(); };
  EXPECT_TRUE(ended("<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n"));
  EXPECT_TRUE(ended("<function=f>\n<parameter=a>\nx\n</function>"));
  EXPECT_TRUE(ended("<function=f></function>"));
  EXPECT_FALSE(ended("<function=f>\n<parameter=a>\nx\n</parameter>\n"));
  EXPECT_FALSE(ended("<function=f>\n<parameter=a>\nx\n</parameter>\n</func"));
  EXPECT_FALSE(ended("<function=f>\n<parameter=a>\nx</function>y"));
  // Closers followed by more text are the value's text.
  EXPECT_EQ(parse("<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\ntrailing"),
            "f {\"a\": \"x\\n</parameter>\\n</function>\\ntrailing\"}");
  // Text between parameters and after the function is dropped.
  EXPECT_EQ(parse("<function=f>junk</function>"), "f {}");
  EXPECT_EQ(parse("<function=f>\n<parameter=a\n</function>"), "f {}");
  EXPECT_EQ(parse("<function=f>x <b>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>"),
            "f {\"a\": 1, \"b\": 2}");
  EXPECT_EQ(parse("<function=f></function> <parameter=a>\n1\n</parameter>"), "f {}");
  EXPECT_EQ(parse("text <function=f></function>"), "not a call");
  EXPECT_EQ(parse("<function=\n>\n</function>"), "not a call");
  EXPECT_EQ(parse("<function=f<x>\n</function>"), "not a call");
  EXPECT_EQ(parse("<function=f"), "not a call");
  EXPECT_EQ(parse("{\"name\": \"f\"}"), "not a call");
}

}  // namespace
}  // namespace lily
