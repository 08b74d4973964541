// layers.h: the decode step (T = 1) of each layer kind on the GEMV kernels, each one parallel
// region of cpu_team() (attention_step.cpp, deltanet_step.cpp, moe_step.cpp); same math as the
// reference layers of backend/cpu/ops.h, whose caches they share.
//
// Their working buffers come from the caller (the backend owns one set and uses it under a
// lock): they grow once to the model's sizes and are reused, with no allocation per step and
// none per thread (a server runs generations on whichever of its threads takes the request;
// buffers per thread grew its resident memory with every thread that ever ran one).
#pragma once

#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"

namespace lily::cpu_fast {

struct AttentionScratch {
  std::vector<float> qg;                   // [nq, 2 d] q_proj's output: per head d queries then d gates
  std::vector<float> q, k, v;              // [nq, d], [nkv, d], [nkv, d]
  std::vector<float> o;                    // [nq, d] gated attention output, o_proj's input
  std::vector<std::vector<float>> scores;  // [members][visible]
  QuantizedInput x_in, o_in;
};

struct DeltaNetScratch {
  std::vector<float> mixed, z, b, a;  // projections: [C], [Hv * dv], [Hv], [Hv]
  std::vector<float> u;               // [C] conv output: q | k | v
  std::vector<float> o, y;            // [Hv * dv] delta rule output, gated norm of it
  std::vector<float> m, r;            // [Hv * dv] the delta rule's sums per head
  QuantizedInput x_in, y_in;
};

// One member's routing (identical in every member).
struct Routing {
  std::vector<float> p;    // [E] softmax of the router logits
  std::vector<int> order;  // [E]; the first k: the chosen experts in index order
  float chosen_sum = 0;    // sum of p over the chosen
};

struct MoeScratch {
  std::vector<float> logits;           // [E + 1] router logits, then the shared expert's gate logit
  std::vector<Routing> routing;        // [members]
  std::vector<float> gate, up, act;    // [k + 1, I_max]
  std::vector<float> ys;               // [k + 1, H] expert outputs (each member its rows)
  QuantizedInput x_in;                 // x for the router, the shared gate and every expert
  std::vector<QuantizedInput> act_in;  // [k + 1] act for the down projections
};

// Gated full attention (spec §2.4), one token at `position`. x: [H] normed -> out: [H].
void attention_step(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache, int64_t position,
                    const float* x, float* out, AttentionScratch& s);

// Gated DeltaNet (spec §2.6), one token. x: [H] normed -> out: [H]. Advances conv and SSM state.
void deltanet_step(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                   float* out, DeltaNetScratch& s);

// Sparse MoE with the gated shared expert (spec §2.7), one token. x: [H] -> out: [H].
void moe_step(const MoeWeights& w, const ModelConfig& c, const float* x, float* out, MoeScratch& s);

// Query head qh (gate gh) over the cache's first `visible` positions of KV head g:
// oh = softmax(qh K^T / sqrt(d)) V * sigmoid(gh) (attention_step.cpp). scores: [visible] scratch.
void attend(const float* qh, const float* gh, const cpu::AttentionCache& cache, int64_t visible, int64_t nkv, int64_t g,
            int64_t d, float* scores, float* oh);

// Query heads [h0, h1) of KV head g (q [nq, d]; their gates in qg [nq, 2d] at + d; o [nq, d])
// over the cache's first `visible` positions: on AVX-512 (d a multiple of 64, up to 8 heads) all of
// them in one pass over the keys and values (attention_avx512.cpp), else attend per head.
// scores: [(h1 - h0) visible] scratch.
void attend_heads(const float* q, const float* qg, const cpu::AttentionCache& cache, int64_t visible, int64_t nkv,
                  int64_t g, int64_t d, int64_t h0, int64_t h1, float* scores, float* o);

// Router logits [E] -> r: softmax, the top k (ties to the lower index) in index order (moe_step.cpp).
void route(const float* logits, int64_t E, int64_t k, Routing& r);

// One recurrent step of the delta rule (spec §3.1) on S [dk, dv], S read in one pass and
// written in a second (deltanet_step.cpp):
//   pass 1: m = exp(g) S^T k, r = exp(g) S^T q        d = beta (v - m), o = r + d (k . q)
//   pass 2: S = exp(g) S + k d^T
// m and r: [dv] scratch.
void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int64_t dk, int64_t dv,
                     float* S, float* o, float* m, float* r);

// The states delta_rule_tokens keeps (SequenceState::keep_row_states): S after token first + j,
// j < count, into states + j * stride.
struct KeptStates {
  float* states = nullptr;
  int64_t first = 0, count = 0, stride = 0;
};

// The delta rule over in.T tokens of one value head (spec §3.1), token by token: S [dk, dv] in
// place, o [T, o_stride]. On AVX-512 for dv a multiple of 16 up to 128 the update of one token
// and the sums of the next share one pass over S (delta_rule_avx512.cpp); else delta_rule_step
// per token. m and r: [dv] scratch. The states `kept` asks for are written on the way.
void delta_rule_tokens(const cpu::DeltaRuleInputs& in, float* S, float* o, int64_t o_stride, float* m, float* r,
                       const KeptStates& kept = {});

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {
// Returns false (and does nothing) where dv is not a multiple of 16 up to 128.
bool delta_rule_tokens_avx512(const cpu::DeltaRuleInputs& in, float* S, float* o, int64_t o_stride,
                              const KeptStates& kept = {});

}  // namespace lily::cpu_fast::detail
