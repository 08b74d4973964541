// gpu_weights.cu: moving a loaded model into GPU memory (or making a random one there).
//
// Layout on the GPU: see gpu_weights.h. Uploading quantizes plain matrices on the host
// (parallel over rows) with the same affine scheme as mlx, so an HF bf16 checkpoint runs
// from 4-bit weights like an mlx one. Synthetic weights are filled by a hash kernel:
// uniform random codes, small scales and biases, unit norm gains.
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gpu_weights.h"
#include "base/thread_pool.h"
#include "model/quant.h"
#include "model/weights.h"

namespace lily::cuda {

void* GpuWeights::allocate(uint64_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(bytes, 16)));
  allocations_.push_back(p);
  bytes_ += bytes;
  return p;
}

GpuWeights::~GpuWeights() {
  for (void* p : allocations_) cudaFree(p);
}

// ---- Upload of a loaded model ------------------------------------------------------------

class WeightUploader {
 public:
  explicit WeightUploader(GpuWeights& out) : out_(out) {}

  // A stack of `count` matrices of equal shape, quantized to `bits` if they are plain.
  QMatrix matrices(const std::vector<const Matrix*>& ms, int plain_bits) {
    const Matrix& first = *ms[0];
    const int bits = first.quantized() ? first.bits : plain_bits;
    const int group = first.quantized() ? first.group_size : 64;
    QMatrix q;
    q.batch = int(ms.size());
    q.rows = int(first.rows);
    q.cols = int(first.cols);
    q.bits = bits;
    q.group_size = group;
    const uint64_t code_bytes = uint64_t(first.rows) * first.cols * bits / 8;
    const uint64_t scale_bytes = uint64_t(first.rows) * (first.cols / group) * 2;
    auto* codes = static_cast<uint8_t*>(out_.allocate(code_bytes * ms.size()));
    auto* scales = static_cast<uint8_t*>(out_.allocate(scale_bytes * ms.size()));
    auto* biases = static_cast<uint8_t*>(out_.allocate(scale_bytes * ms.size()));
    for (size_t i = 0; i < ms.size(); ++i) {
      const Matrix& m = *ms[i];
      LILY_CHECK(m.rows == first.rows && m.cols == first.cols, "expert matrices differ in shape");
      if (m.quantized()) {
        LILY_CHECK(m.bits == bits && m.group_size == group, "expert matrices differ in quantization");
        CUDA_CHECK(cudaMemcpy(codes + i * code_bytes, m.data, code_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(scales + i * scale_bytes, m.scales, scale_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(biases + i * scale_bytes, m.biases, scale_bytes, cudaMemcpyHostToDevice));
      } else {
        QuantizedMatrix qm = quantize_rows(m, bits);
        CUDA_CHECK(cudaMemcpy(codes + i * code_bytes, qm.codes.data(), code_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(scales + i * scale_bytes, qm.scales.data(), scale_bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(biases + i * scale_bytes, qm.biases.data(), scale_bytes, cudaMemcpyHostToDevice));
      }
    }
    q.codes = reinterpret_cast<const uint32_t*>(codes);
    q.scales = reinterpret_cast<const bf16*>(scales);
    q.biases = reinterpret_cast<const bf16*>(biases);
    return q;
  }

  QMatrix matrix(const Matrix& m, int plain_bits = 4) { return matrices({&m}, plain_bits); }

  QMatrix stack(const std::vector<Matrix>& experts) {
    std::vector<const Matrix*> ms;
    for (const Matrix& m : experts) ms.push_back(&m);
    return matrices(ms, 4);
  }

  const float* vector(const std::vector<float>& v) {
    auto* p = static_cast<float*>(out_.allocate(v.size() * 4));
    CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return p;
  }

 private:
  // Quantizes a plain matrix in row blocks on all cores.
  static QuantizedMatrix quantize_rows(const Matrix& m, int bits) {
    QuantizedMatrix q;
    q.codes.resize(size_t(m.rows * m.cols * bits / 32));
    q.scales.resize(size_t(m.rows * (m.cols / 64)));
    q.biases.resize(q.scales.size());
    parallel_for(m.rows, 64, [&](int64_t r0, int64_t r1) {
      std::vector<float> values(size_t((r1 - r0) * m.cols));
      for (int64_t r = r0; r < r1; ++r) m.dequantize_row(r, values.data() + (r - r0) * m.cols);
      QuantizedMatrix part = quantize_affine(values, r1 - r0, m.cols, bits, 64);
      std::copy(part.codes.begin(), part.codes.end(), q.codes.begin() + r0 * m.cols * bits / 32);
      std::copy(part.scales.begin(), part.scales.end(), q.scales.begin() + r0 * (m.cols / 64));
      std::copy(part.biases.begin(), part.biases.end(), q.biases.begin() + r0 * (m.cols / 64));
    });
    return q;
  }

  GpuWeights& out_;
};

std::unique_ptr<GpuWeights> GpuWeights::upload(const ModelWeights& w) {
  auto g = std::unique_ptr<GpuWeights>(new GpuWeights());
  g->config_ = w.config;
  WeightUploader up(*g);
  g->embed_tokens = up.matrix(w.embed_tokens);
  g->lm_head = w.lm_head.data == w.embed_tokens.data ? g->embed_tokens : up.matrix(w.lm_head);
  g->final_norm = up.vector(w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    GpuLayer gl;
    gl.kind = l.kind;
    gl.input_layernorm = up.vector(l.input_layernorm);
    gl.post_attention_layernorm = up.vector(l.post_attention_layernorm);
    if (l.kind == LayerKind::full_attention) {
      const AttentionWeights& a = l.attention;
      gl.attention = {up.matrix(a.q_proj), up.matrix(a.k_proj), up.matrix(a.v_proj), up.matrix(a.o_proj),
                      up.vector(a.q_norm), up.vector(a.k_norm)};
    } else {
      const DeltaNetWeights& d = l.deltanet;
      gl.deltanet = {up.matrix(d.in_proj_qkv), up.matrix(d.in_proj_z), up.matrix(d.in_proj_b), up.matrix(d.in_proj_a),
                     up.matrix(d.out_proj),    up.vector(d.conv1d),    up.vector(d.A_log),      up.vector(d.dt_bias),
                     up.vector(d.norm)};
    }
    const MoeWeights& m = l.moe;
    gl.moe.router = up.matrix(m.router, 8);
    gl.moe.experts_gate = up.stack(m.experts.gate_proj);
    gl.moe.experts_up = up.stack(m.experts.up_proj);
    gl.moe.experts_down = up.stack(m.experts.down_proj);
    gl.moe.shared_gate = up.matrix(m.shared_gate_proj);
    gl.moe.shared_up = up.matrix(m.shared_up_proj);
    gl.moe.shared_down = up.matrix(m.shared_down_proj);
    gl.moe.shared_expert_gate = up.matrix(m.shared_expert_gate, 8);
    g->layers.push_back(gl);
    std::fprintf(stderr, "\ruploading weights to the GPU: layer %zu/%zu", i + 1, w.layers.size());
  }
  std::fprintf(stderr, "\n");
  return g;
}

// ---- Synthetic weights -------------------------------------------------------------------

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

}  // namespace

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

std::unique_ptr<GpuWeights> GpuWeights::synthetic(const ModelConfig& c, uint64_t seed) {
  auto g = std::unique_ptr<GpuWeights>(new GpuWeights());
  g->config_ = c;
  SyntheticBuilder b(*g, seed);
  const int H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  g->embed_tokens = b.matrix(1, c.vocab_size, H);
  g->lm_head = b.matrix(1, c.vocab_size, H);
  g->final_norm = b.vector(uint64_t(H), 1.f, 0.1f);
  for (int i = 0; i < c.num_layers; ++i) {
    GpuLayer gl;
    gl.kind = c.layer_types[size_t(i)];
    gl.input_layernorm = b.vector(uint64_t(H), 1.f, 0.1f);
    gl.post_attention_layernorm = b.vector(uint64_t(H), 1.f, 0.1f);
    if (gl.kind == LayerKind::full_attention) {
      const int nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
      gl.attention = {b.matrix(1, 2 * nq * d, H), b.matrix(1, nkv * d, H), b.matrix(1, nkv * d, H),
                      b.matrix(1, H, nq * d),     b.vector(uint64_t(d), 1.f, 0.1f), b.vector(uint64_t(d), 1.f, 0.1f)};
    } else {
      const int Hv = c.linear_num_value_heads;
      gl.deltanet = {b.matrix(1, c.linear_conv_dim(), H),
                     b.matrix(1, c.linear_value_dim(), H),
                     b.matrix(1, Hv, H),
                     b.matrix(1, Hv, H),
                     b.matrix(1, H, c.linear_value_dim()),
                     b.vector(uint64_t(c.linear_conv_dim()) * c.linear_conv_kernel_dim, 0.f, 0.3f),
                     b.vector(uint64_t(Hv), 1.f, 1.f),
                     b.vector(uint64_t(Hv), 0.f, 0.5f),
                     b.vector(128, 1.f, 0.1f)};
    }
    gl.moe.router = b.matrix(1, E, H, 8);
    gl.moe.experts_gate = b.matrix(E, I, H);
    gl.moe.experts_up = b.matrix(E, I, H);
    gl.moe.experts_down = b.matrix(E, H, I);
    gl.moe.shared_gate = b.matrix(1, Is, H);
    gl.moe.shared_up = b.matrix(1, Is, H);
    gl.moe.shared_down = b.matrix(1, H, Is);
    gl.moe.shared_expert_gate = b.matrix(1, 1, H, 8);
    g->layers.push_back(gl);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

}  // namespace lily::cuda
