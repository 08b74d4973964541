// llama_logits.cpp: llama.cpp's logits and greedy tokens on a GGUF, the reference lily's GGUF
// tests compare with (tools/gguf_reference.py runs it). Not part of lily's build: it links
// llama.cpp's libllama, built outside the tree (../shared/peer/README.md):
//
//   g++ -std=c++17 -O2 tools/llama_logits.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin -o /work/peer/llama_logits
//
//   llama_logits MODEL.gguf OUT.f32 N_GREEDY IDS PROMPT      (IDS, PROMPT: comma-separated ids)
//
// OUT.f32: float32 [len(IDS), n_vocab], the logits of every position of one batch of IDS at
// positions 0..len-1 (one sequence, CPU, 2 threads). Then, from a cleared state, PROMPT is
// decoded and N_GREEDY tokens are chosen by argmax (first maximum), never stopping at an
// end-of-generation token. stdout: {"n_vocab": V, "greedy": [ids]}.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

std::vector<llama_token> parse_ids(const std::string& s) {
  std::vector<llama_token> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) ids.push_back(llama_token(std::stoi(item)));
  return ids;
}

void die(const char* what) {
  std::fprintf(stderr, "llama_logits: %s\n", what);
  std::exit(1);
}

// Decodes `ids` at positions first.. as one batch; logits for all of them when `all`, else the last.
void decode(llama_context* ctx, const std::vector<llama_token>& ids, int first, bool all) {
  llama_batch batch = llama_batch_init(int32_t(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = llama_pos(first + int(i));
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = all || i + 1 == ids.size();
  }
  batch.n_tokens = int32_t(ids.size());
  if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
  llama_batch_free(batch);
}

llama_token argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return llama_token(best);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) die("usage: llama_logits MODEL.gguf OUT.f32 N_GREEDY IDS PROMPT");
  const std::vector<llama_token> ids = parse_ids(argv[4]), prompt = parse_ids(argv[5]);
  const int n_greedy = std::atoi(argv[3]);
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die("cannot load the model");
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  cp.n_threads = 2;
  cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("cannot create a context");

  decode(ctx, ids, 0, true);
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) die("cannot write the logits file");
  for (size_t i = 0; i < ids.size(); ++i) std::fwrite(llama_get_logits_ith(ctx, int32_t(i)), 4, size_t(n_vocab), out);
  std::fclose(out);

  llama_memory_clear(llama_get_memory(ctx), true);
  decode(ctx, prompt, 0, false);
  std::vector<llama_token> greedy;
  for (int k = 0; k < n_greedy; ++k) {
    greedy.push_back(argmax(llama_get_logits_ith(ctx, -1), n_vocab));
    if (k + 1 < n_greedy) decode(ctx, {greedy.back()}, int(prompt.size()) + k, false);
  }
  std::printf("{\"n_vocab\": %d, \"greedy\": [", n_vocab);
  for (size_t i = 0; i < greedy.size(); ++i) std::printf("%s%d", i ? ", " : "", greedy[i]);
  std::printf("]}\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
