// mtp_fast.h: the MTP head's block (spec §6) on the fast CPU layers, for the fast backend's
// forward_mtp (backend.cpp); the same math as the reference's cpu::mtp_block (backend/cpu/mtp.cpp)
// on the decode-step layers of layers.h for one row, the prefill layers of prefill.h for more.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "backend/cpu_fast/prefill.h"
#include "model/weights.h"

namespace lily::cpu_fast {

// The fast layers' working buffers (layers.h, prefill.h, gemv.h): one set for a backend.
struct LayerScratch {
  AttentionScratch attention;
  DeltaNetScratch deltanet;
  MoeScratch moe;
  GemvScratch gemv;
  PrefillScratch prefill;
};

// The head's own intermediate rows; they grow once to the longest block.
struct MtpScratch {
  std::vector<float> eh;                // [T, 2H] the fc's input: [e | hh] a row
  std::vector<float> u, normed, mixed;  // [T, H] the block's residual stream, its norm, a sublayer's output
};

// T rows at positions first_position + t (the cache holds exactly first_position rows; T are
// appended), as cpu::mtp_block:
//   u = [RMSNorm_zc(E[tokens[t]]; pre_fc_norm_embedding) | RMSNorm_zc(hidden[t]; pre_fc_norm_hidden)] @ fc^T
//   u = decoder_layer(u; mtp.layers.0)      m[T, H] = RMSNorm_zc(u; mtp.norm)
void mtp_block(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, cpu::AttentionCache& cache,
               int64_t first_position, const float* hidden, const int32_t* tokens, int64_t T, float* m, MtpScratch& s,
               LayerScratch& layers);

}  // namespace lily::cpu_fast
