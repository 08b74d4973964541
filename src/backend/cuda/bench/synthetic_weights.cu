// synthetic_weights.cu: random weights of a geometry on the GPU (bench/cuda_bench.h), filled by a
// hash kernel: uniform random codes, small scales and biases, norm gains around 1. Speed does not
// depend on the values, so the full-size model is measured without a checkpoint.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/bench/cuda_bench.h"

namespace lily::cuda::bench {

namespace {

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

__global__ void fill_random_words(uint32_t* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = hash32(seed * 0x9e3779b97f4a7c15ull + i);
}

// bf16 values uniform in [center - spread, center + spread].
__global__ void fill_random_bf16(uint16_t* p, uint64_t n, uint64_t seed, float center, float spread) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    float u = float(hash32(seed * 0x9e3779b97f4a7c15ull + i)) * (1.0f / 4294967296.0f);
    float f = center + spread * (2.f * u - 1.f);
    uint32_t bits = __float_as_uint(f);
    p[i] = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

__global__ void fill_random_floats(float* p, uint64_t n, uint64_t seed, float center, float spread) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    float u = float(hash32(seed * 0x9e3779b97f4a7c15ull + i)) * (1.0f / 4294967296.0f);
    p[i] = center + spread * (2.f * u - 1.f);
  }
}

// Matrices and vectors of random values in memory owned by `out`.
class SyntheticBuilder {
 public:
  SyntheticBuilder(GpuWeights& out, uint64_t seed) : out_(out), seed_(seed) {}

  // Random codes; scale ~ 0.002 and bias centred so weights are ~ N(0, 0.01)-like.
  QMatrix matrix(int batch, int rows, int cols, int bits = 4) {
    QMatrix q;
    q.batch = batch, q.rows = rows, q.cols = cols, q.bits = bits, q.group_size = 64;
    const uint64_t words = uint64_t(batch) * rows * cols * bits / 32;
    const uint64_t groups = uint64_t(batch) * rows * (cols / 64);
    auto* codes = static_cast<uint32_t*>(out_.allocate(words * 4));
    auto* scales = static_cast<uint16_t*>(out_.allocate(groups * 2));
    auto* biases = static_cast<uint16_t*>(out_.allocate(groups * 2));
    const float levels = float((1 << bits) - 1);
    fill_random_words<<<1024, 256>>>(codes, words, ++seed_);
    fill_random_bf16<<<1024, 256>>>(scales, groups, ++seed_, 0.02f / levels, 0.005f / levels);
    fill_random_bf16<<<1024, 256>>>(biases, groups, ++seed_, -0.01f, 0.002f);
    CUDA_CHECK_LAUNCH();
    q.codes = codes;
    q.scales = reinterpret_cast<const bf16*>(scales);
    q.biases = reinterpret_cast<const bf16*>(biases);
    return q;
  }

  const float* vector(uint64_t n, float center, float spread) {
    auto* p = static_cast<float*>(out_.allocate(n * 4));
    fill_random_floats<<<256, 256>>>(p, n, ++seed_, center, spread);
    CUDA_CHECK_LAUNCH();
    return p;
  }

 private:
  GpuWeights& out_;
  uint64_t seed_;
};

}  // namespace

namespace {

GpuLayer synthetic_layer(SyntheticBuilder& b, const ModelConfig& c, LayerKind kind) {
  const int H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  GpuLayer gl;
  gl.kind = kind;
  gl.input_layernorm = b.vector(uint64_t(H), 1.f, 0.1f);
  gl.post_attention_layernorm = b.vector(uint64_t(H), 1.f, 0.1f);
  if (gl.kind == LayerKind::full_attention) {
    const int nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
    GpuAttention& ga = gl.attention;
    ga.qkv_proj = b.matrix(1, 2 * nq * d + 2 * nkv * d, H);
    ga.q_proj = ga.qkv_proj.row_range(0, 2 * nq * d);
    ga.k_proj = ga.qkv_proj.row_range(2 * nq * d, nkv * d);
    ga.v_proj = ga.qkv_proj.row_range(2 * nq * d + nkv * d, nkv * d);
    ga.o_proj = b.matrix(1, H, nq * d);
    ga.q_norm = b.vector(uint64_t(d), 1.f, 0.1f);
    ga.k_norm = b.vector(uint64_t(d), 1.f, 0.1f);
  } else {
    const int Hv = c.linear_num_value_heads;
    const int C = c.linear_conv_dim(), Vd = c.linear_value_dim();
    GpuDeltaNet& gd = gl.deltanet;
    gd.in_proj_all = b.matrix(1, C + Vd + 2 * Hv, H);
    gd.in_proj_qkv = gd.in_proj_all.row_range(0, C);
    gd.in_proj_z = gd.in_proj_all.row_range(C, Vd);
    gd.in_proj_b = gd.in_proj_all.row_range(C + Vd, Hv);
    gd.in_proj_a = gd.in_proj_all.row_range(C + Vd + Hv, Hv);
    gd.out_proj = b.matrix(1, H, Vd);
    gd.conv1d = b.vector(uint64_t(C) * c.linear_conv_kernel_dim, 0.f, 0.3f);
    gd.A_log = b.vector(uint64_t(Hv), 1.f, 1.f);
    gd.dt_bias = b.vector(uint64_t(Hv), 0.f, 0.5f);
    gd.norm = b.vector(128, 1.f, 0.1f);
  }
  gl.moe.router = b.matrix(1, E, H, 8);
  gl.moe.experts_gate = b.matrix(E, I, H);
  gl.moe.experts_up = b.matrix(E, I, H);
  gl.moe.experts_down = b.matrix(E, H, I);
  gl.moe.shared_gate = b.matrix(1, Is, H);
  gl.moe.shared_up = b.matrix(1, Is, H);
  gl.moe.shared_down = b.matrix(1, H, Is);
  gl.moe.shared_expert_gate = b.matrix(1, 1, H, 8);
  return gl;
}

}  // namespace

std::unique_ptr<GpuWeights> synthetic_weights(const ModelConfig& c, uint64_t seed, bool mtp) {
  auto g = std::make_unique<GpuWeights>(c);
  SyntheticBuilder b(*g, seed);
  const int H = c.hidden_size;
  g->embed_tokens = b.matrix(1, c.vocab_size, H);
  g->lm_head = b.matrix(1, c.vocab_size, H);
  g->final_norm = b.vector(uint64_t(H), 1.f, 0.1f);
  for (int i = 0; i < c.num_layers; ++i) g->layers.push_back(synthetic_layer(b, c, c.layer_types[size_t(i)]));
  if (mtp) {
    GpuMtp m;
    m.fc_embedding = b.matrix(1, H, H), m.fc_hidden = b.matrix(1, H, H);
    m.pre_fc_norm_embedding = b.vector(uint64_t(H), 1.f, 0.1f);
    m.pre_fc_norm_hidden = b.vector(uint64_t(H), 1.f, 0.1f);
    m.norm = b.vector(uint64_t(H), 1.f, 0.1f);
    m.layer = synthetic_layer(b, c, LayerKind::full_attention);
    g->mtp = m;
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

}  // namespace lily::cuda::bench
