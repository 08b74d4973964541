// bench_grammar.cpp: one decoding step's allowed-token mask over a 248,320-entry vocabulary
// (synthetic_vocabulary.h: a made-up one of the real size, the schema and the document).
// A document valid for the schema is cut into tokens by longest match; each benchmark walks it
// token by token and times fill_next_token_bitmask at each step:
//   *Cold: a fresh CompiledGrammar per walk (every state's cache entry made on first use);
//   *Warm: the same grammar again (what the second and later requests of a schema see).
// Counters: each step's time is its median over the iterations (so one preemption of this shared
// machine is not a step's cost); median_us, p90_us and max_us are over the steps of the walk.
// *Applied: the step also sets the forbidden ones of 248,320 logits to -inf (apply_token_bitmask),
// as generate() does before sampling.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "synthetic_vocabulary.h"

namespace {

using lily::bench::kDocument;
using lily::bench::kPadded;
using lily::bench::kSchema;
using lily::bench::tokenize;
using lily::bench::vocabulary;
using lily::grammar::CompiledGrammar;
using lily::grammar::GrammarMatcher;
using lily::grammar::json;

struct Walk {
  std::vector<int32_t> tokens;
  std::vector<double> step_us;
};

// logits: also apply each mask to a row of that many logits (what generate() does per step).
void walk(const std::shared_ptr<const CompiledGrammar>& g, Walk& w, std::vector<uint64_t>& mask,
          std::vector<float>* logits = nullptr) {
  GrammarMatcher m(g);
  for (int32_t id : w.tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    m.fill_next_token_bitmask(mask);
    if (logits) lily::grammar::apply_token_bitmask(*logits, mask);
    const auto t1 = std::chrono::steady_clock::now();
    w.step_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    benchmark::DoNotOptimize(mask.data());
    if (!((mask[size_t(id) >> 6] >> (id & 63)) & 1) || !m.accept_token(id)) throw std::runtime_error("walk refused");
  }
}

void report(benchmark::State& state, Walk& w) {
  const size_t steps = w.tokens.size(), runs = w.step_us.size() / steps;
  std::vector<double> t(steps);
  for (size_t i = 0; i < steps; ++i) {
    std::vector<double> one;
    for (size_t r = 0; r < runs; ++r) one.push_back(w.step_us[r * steps + i]);
    std::nth_element(one.begin(), one.begin() + ptrdiff_t(runs / 2), one.end());
    t[i] = one[runs / 2];
  }
  std::sort(t.begin(), t.end());
  state.counters["median_us"] = t[t.size() / 2];
  state.counters["p90_us"] = t[t.size() * 9 / 10];
  state.counters["max_us"] = t.back();
  state.counters["steps"] = double(w.tokens.size());
}

void run(benchmark::State& state, const lily::grammar::Grammar& grammar, const std::string& text, bool cold,
         bool apply = false) {
  auto vocab = vocabulary();
  Walk w;
  w.tokens = tokenize(*vocab, text);
  std::vector<uint64_t> mask(vocab->mask_words());
  std::vector<float> logits(size_t(kPadded), 0.0f);
  std::vector<float>* row = apply ? &logits : nullptr;
  auto shared = std::make_shared<const CompiledGrammar>(grammar, vocab);
  if (!cold) walk(shared, w, mask, row), w.step_us.clear();  // fill the cache once
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      shared = std::make_shared<const CompiledGrammar>(grammar, vocab);
      state.ResumeTiming();
    }
    walk(shared, w, mask, row);
  }
  report(state, w);
  state.counters["cache_MB"] = double(shared->cache_bytes()) / 1e6;
}

void BM_SchemaWarm(benchmark::State& state) {
  run(state, lily::grammar::json_schema_grammar(kSchema), kDocument, false);
}
// The mask and its application to the 248,320 logits: one step of generate() before sampling.
void BM_SchemaWarmApplied(benchmark::State& state) {
  run(state, lily::grammar::json_schema_grammar(kSchema), kDocument, false, true);
}
void BM_SchemaCold(benchmark::State& state) {
  run(state, lily::grammar::json_schema_grammar(kSchema), kDocument, true);
}
void BM_JsonObjectWarm(benchmark::State& state) { run(state, lily::grammar::json_object_grammar(), kDocument, false); }
void BM_JsonObjectCold(benchmark::State& state) { run(state, lily::grammar::json_object_grammar(), kDocument, true); }
void BM_ThinkingThenSchemaWarm(benchmark::State& state) {
  lily::grammar::GrammarOptions o;
  o.thinking = true;
  run(state, lily::grammar::json_schema_grammar(kSchema, o),
      "The user wants a record; I will write it as JSON, with the name first.\n</think>\n\n" + std::string(kDocument),
      false);
}
void BM_ToolCallWarm(benchmark::State& state) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
      {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "query":{"type":"string"}},"required":["query"]}}}])");
  run(state, lily::grammar::tool_call_grammar(tools, {}),
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo and the fjords\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>",
      false);
}

BENCHMARK(BM_SchemaWarm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaWarmApplied)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaCold)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_JsonObjectWarm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_JsonObjectCold)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ThinkingThenSchemaWarm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ToolCallWarm)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
