// bench_tokenizer.cpp: encode / decode throughput on a ~100K-token mixed-language prompt.
//
// Tokenizer: $LILY_TOKENIZER (a tokenizer.json, e.g. the real Qwen3.6 one) or the test fixture
// tests/fixtures/tokenizer/tokenizer.json. Reported: tokens/s (items_per_second) and bytes/s.
// Goal (issue 3): a 100K-token prompt encodes in well under a second, cold cache included.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace {

std::string tokenizer_path() {
  if (const char* env = std::getenv("LILY_TOKENIZER")) return env;
  return std::string(LILY_FIXTURES_DIR) + "/tokenizer/tokenizer.json";
}

// Mixed prose, code, numbers and several scripts; numbers make many words distinct.
std::string make_prompt(size_t target_bytes) {
  static const char* const lines[] = {
      "The quick brown fox jumps over the lazy dog, and it's what we've wanted since {0}.\n",
      "def f_{0}(x):\n    return [i * x for i in range({0})]  # list comprehension\n\n",
      "你好，世界！今天是第{0}天，人工智能正在改变世界。\n",
      "สวัสดีครับ ผมชื่ออเล็กซ์ หมายเลข {0}\n",
      "नमस्ते दुनिया {0}, हिन्दी में क्षत्रिय।\n",
      "Привет, мир! Строка номер {0}.\r\n",
      "{{\"id\": {0}, \"name\": \"item\", \"tags\": [\"a\", \"b\"], \"ok\": true}}\n",
      "Emoji {0} 🎉👍🏽 and café résumé naïve.\t\tTabs   and   spaces.\n",
  };
  std::string text;
  for (size_t i = 0; text.size() < target_bytes; ++i) {
    text += fmt::format(fmt::runtime(lines[i % std::size(lines)]), i * 7919 % 100000);
  }
  return text;
}

struct Setup {
  std::string path = tokenizer_path();
  bool ok = std::filesystem::exists(path);
  std::string prompt = make_prompt(400'000);
};

Setup& setup() {
  static Setup s;
  return s;
}

void report(benchmark::State& state, size_t tokens, size_t bytes) {
  state.SetItemsProcessed(int64_t(state.iterations() * tokens));
  state.SetBytesProcessed(int64_t(state.iterations() * bytes));
  state.counters["tokens"] = double(tokens);
}

// A fresh tokenizer every iteration: the per-word cache starts empty (load time not counted).
void BM_EncodeColdCache(benchmark::State& state) {
  if (!setup().ok) return state.SkipWithError(("no tokenizer at " + setup().path).c_str());
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tokenizer = std::make_unique<lily::Tokenizer>(lily::Tokenizer::load(setup().path));
    state.ResumeTiming();
    tokens = tokenizer->encode(setup().prompt).size();
    state.PauseTiming();
    tokenizer.reset();
    state.ResumeTiming();
  }
  report(state, tokens, setup().prompt.size());
}
BENCHMARK(BM_EncodeColdCache)->Unit(benchmark::kMillisecond);

void BM_EncodeWarmCache(benchmark::State& state) {
  if (!setup().ok) return state.SkipWithError(("no tokenizer at " + setup().path).c_str());
  const lily::Tokenizer tokenizer = lily::Tokenizer::load(setup().path);
  size_t tokens = tokenizer.encode(setup().prompt).size();
  for (auto _ : state) benchmark::DoNotOptimize(tokens = tokenizer.encode(setup().prompt).size());
  report(state, tokens, setup().prompt.size());
}
BENCHMARK(BM_EncodeWarmCache)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  if (!setup().ok) return state.SkipWithError(("no tokenizer at " + setup().path).c_str());
  const lily::Tokenizer tokenizer = lily::Tokenizer::load(setup().path);
  const auto ids = tokenizer.encode(setup().prompt);
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer.decode(ids));
  report(state, ids.size(), setup().prompt.size());
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamingDecode(benchmark::State& state) {
  if (!setup().ok) return state.SkipWithError(("no tokenizer at " + setup().path).c_str());
  const lily::Tokenizer tokenizer = lily::Tokenizer::load(setup().path);
  const auto ids = tokenizer.encode(setup().prompt);
  for (auto _ : state) {
    lily::StreamingDecoder decoder(tokenizer);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += decoder.push(id).size();
    bytes += decoder.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  report(state, ids.size(), setup().prompt.size());
}
BENCHMARK(BM_StreamingDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
