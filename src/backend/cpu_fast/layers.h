// layers.h: the decode step (T = 1) of each layer kind on the GEMV kernels, each one parallel
// region of cpu_team() (attention_step.cpp, deltanet_step.cpp, moe_step.cpp); same math as the
// reference layers of backend/cpu/ops.h, whose caches they share.
#pragma once

#include "backend/cpu/ops.h"

namespace lily::cpu_fast {

// Gated full attention (spec §2.4), one token at `position`. x: [H] normed -> out: [H].
void attention_step(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache, int64_t position,
                    const float* x, float* out);

// Gated DeltaNet (spec §2.6), one token. x: [H] normed -> out: [H]. Advances conv and SSM state.
void deltanet_step(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                   float* out);

// Sparse MoE with the gated shared expert (spec §2.7), one token. x: [H] -> out: [H].
void moe_step(const MoeWeights& w, const ModelConfig& c, const float* x, float* out);

// One recurrent step of the delta rule (spec §3.1) on S [dk, dv], S read in one pass and
// written in a second (deltanet_step.cpp):
//   pass 1: m = exp(g) S^T k, r = exp(g) S^T q        d = beta (v - m), o = r + d (k . q)
//   pass 2: S = exp(g) S + k d^T
void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int64_t dk, int64_t dv,
                     float* S, float* o);

}  // namespace lily::cpu_fast
