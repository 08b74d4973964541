// forward.cu: the CUDA backend: the whole model on the GPU, decode captured in a CUDA graph.
//
//   h = embed[token]                                              embed_tokens
//   per layer:  DeltaNet:  qkv, z, b, a = projections(RMSNorm(h))  T = 1: rms_norm_gemv (one fused
//                                                                  matrix); T > 1: rms_norm, project x4
//                          y = gated_deltanet_core(...)          (conv, gates, delta rule, gated norm)
//                          h += out_proj(y)                      project_accumulate
//               attention: qg, k, v = projections(RMSNorm(h))    rms_norm_gemv | rms_norm, project x3
//                          o = gated_attention_core(...)         (norms, RoPE, KV append, softmax, gate)
//                          h += o_proj(o)                        project_accumulate
//               h += experts(RMSNorm(h)) + shared(RMSNorm(h))    T = 1: moe_route_norm, moe_gate_up,
//                                                                moe_down_accumulate (shared = slot k)
//                                                                T > 1: rms_norm, moe_grouped_accumulate
//   logits = lm_head(RMSNorm(h))                                 rms_norm_gemv | rms_norm, project
//                                                                (argmax for greedy)
// project = gemv (T = 1: decode; gemv.cu picks the kernel, tensor cores with fp32-level sums) or
// gemm_q4 (T > 1: prefill, tensor cores, bf16 inputs, fp32 sums).
// Launches of a decode step (T = 1): 254 for the 40-layer model: embed; per DeltaNet layer the
// input projection, the core, out_proj, and the MoE's route, gate/up, down (6); per attention
// layer 7 (the core is a split and a combine launch); advance, lm_head, argmax (515 before the
// fused kernels).
// Shapes: activations fp32 [T, width], T <= chunk_tokens_ per pass (longer prompts are
// processed in chunks; the caches carry the context). KV cache bf16, DeltaNet state fp32.
// The sequence position lives in device memory and is advanced by a kernel, so the T = 1
// step can be captured once per sequence and replayed.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_profiler_api.h>

#include "backend/cuda/common/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_graph.h"
#include "backend/cuda/common/deltanet.h"
#include "backend/cuda/prefill/gemm_q4.h"
#include "backend/cuda/decode/gemv.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/decode/moe.h"
#include "backend/cuda/decode/moe_fused.h"
#include "backend/cuda/prefill/moe_grouped.h"
#include "backend/cuda/common/norm.h"
#include "backend/cuda/decode/top_candidates.h"
#include "base/env.h"
#include "model/weights.h"

namespace lily {

using namespace lily::cuda;

namespace {

// Tokens per prefill pass. Larger passes give the grouped expert GEMMs more rows per expert
// (T * 8 / 256 on average) for each pass over the 19.5 GB of weights; the scratch grows about
// 0.2 MB per token (activations, MoE intermediates). LILY_PREFILL_CHUNK overrides the default
// (a multiple of 64 in [64, 16384]) for measurements; docs/perf.md has the sweep.
constexpr int kDefaultChunkTokens = 8192;
int prefill_chunk_tokens() {
  const char* v = std::getenv("LILY_PREFILL_CHUNK");
  if (!v) return kDefaultChunkTokens;
  const int n = std::atoi(v);
  LILY_CHECK(n >= 64 && n <= 16384 && n % 64 == 0, "LILY_PREFILL_CHUNK={}: a multiple of 64 in [64, 16384]", v);
  return n;
}
// Prefill blocks of at least this many tokens run the chunked delta rule, shorter ones the
// token loop (deltanet_params: the crossover of the measured timings, linearly interpolated).
constexpr int kChunkedDeltaRuleFrom = 48;
// Rows of logits computed (and copied to the host) at once: lm_head output is 1 MB per row.
constexpr int kLogitRows = 64;
// Router logits of prefill passes at fp32 accuracy (gemm_exact: tensor cores with x in bf16 hi +
// lo parts; the decode path and the CPU backend are fp32 too), not through gemm_q4's bf16
// inputs: with bf16 inputs a near-tie between experts flips more often, and a flipped expert
// changes a token's output by far more than rounding does.
constexpr bool kPrefillFp32Router = true;

// LILY_DECODE_SKIP=part[,part...] (measurement only: the outputs are WRONG) leaves parts out of
// the decode step (T = 1 passes), so that `lily bench` differences give each part's cost inside
// the graph, launch gaps included (no timeline profiler on the GPU machine): in_proj (the fused
// input projections), mixer (attention / DeltaNet core), out_proj, moe (or one of its three
// launches: route, gate_up, down), lm_head.
struct DecodeSkip {
  bool in_proj = false, mixer = false, out_proj = false, moe = false, lm_head = false;
  bool route = false, gate_up = false, down = false;
  static DecodeSkip from_env() {
    DecodeSkip d;
    const char* v = std::getenv("LILY_DECODE_SKIP");
    if (!v || !*v) return d;
    const std::string list = std::string(",") + v + ",";
    auto has = [&](const char* part) { return list.find(std::string(",") + part + ",") != std::string::npos; };
    d.in_proj = has("in_proj"), d.mixer = has("mixer"), d.out_proj = has("out_proj"), d.moe = has("moe");
    d.lm_head = has("lm_head"), d.route = has("route"), d.gate_up = has("gate_up"), d.down = has("down");
    std::fprintf(stderr, "lily: LILY_DECODE_SKIP=%s: decode steps leave parts out; outputs are wrong\n", v);
    return d;
  }
};

__global__ void advance_position(int32_t* position, int n) {
  pdl_wait();
  pdl_launch_dependents();
  *position += n;
}
__global__ void set_position(int32_t* position, int value) { *position = value; }

__global__ void fill_bf16(uint16_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u + seed;
    x ^= x >> 15;
    float f = (float(x & 0xffff) / 65536.f - 0.5f) * 0.2f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

// Device memory freed on destruction.
struct DeviceBuffer {
  void* p = nullptr;
  uint64_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(uint64_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(n, 16))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
};

struct CudaRecurrentSnapshot final : RecurrentSnapshot {
  int64_t length_ = 0;
  std::vector<DeviceBuffer> conv, ssm;
  int64_t length() const override { return length_; }
  uint64_t memory_bytes() const override {
    uint64_t n = 0;
    for (auto& b : conv) n += b.bytes;
    for (auto& b : ssm) n += b.bytes;
    return n;
  }
};

class CudaSequenceState final : public SequenceState {
 public:
  CudaSequenceState(const ModelConfig& c, int64_t capacity) : config_(c), capacity_(capacity) {
    kv_row_bytes_ = uint64_t(c.num_key_value_heads) * c.head_dim * 2;
    conv_bytes_ = uint64_t(c.linear_conv_kernel_dim - 1) * c.linear_conv_dim() * 4;
    ssm_bytes_ = uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
    for (LayerKind kind : c.layer_types) {
      if (kind == LayerKind::full_attention) {
        k_cache.emplace_back(kv_row_bytes_ * uint64_t(capacity));
        v_cache.emplace_back(kv_row_bytes_ * uint64_t(capacity));
      } else {
        conv.emplace_back(conv_bytes_);
        ssm.emplace_back(ssm_bytes_);
      }
    }
    position = DeviceBuffer(4);
    reset();
  }
  ~CudaSequenceState() override {
    if (graph_exec) cudaGraphExecDestroy(graph_exec);
  }

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  // The KV cache is allocated for the whole capacity up front, so that is what the state occupies.
  uint64_t memory_bytes() const override {
    return uint64_t(capacity_) * kv_row_bytes_ * 2 * k_cache.size() + (conv_bytes_ + ssm_bytes_) * conv.size();
  }
  std::unique_ptr<SequenceState> clone() const override {
    auto s = std::make_unique<CudaSequenceState>(config_, capacity_);
    for (size_t i = 0; i < k_cache.size(); ++i) {
      CUDA_CHECK(cudaMemcpy(s->k_cache[i].p, k_cache[i].p, kv_row_bytes_ * uint64_t(length_), cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemcpy(s->v_cache[i].p, v_cache[i].p, kv_row_bytes_ * uint64_t(length_), cudaMemcpyDeviceToDevice));
    }
    copy_recurrent(conv, ssm, s->conv, s->ssm);
    s->set_length(length_);
    return s;
  }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override {
    auto s = std::make_unique<CudaRecurrentSnapshot>();
    s->length_ = length_;
    for (size_t i = 0; i < conv.size(); ++i) {
      s->conv.emplace_back(conv_bytes_);
      s->ssm.emplace_back(ssm_bytes_);
    }
    copy_recurrent(conv, ssm, s->conv, s->ssm);
    return s;
  }
  void restore(const RecurrentSnapshot& snapshot) override {
    auto* s = dynamic_cast<const CudaRecurrentSnapshot*>(&snapshot);
    LILY_CHECK(s, "restore: snapshot is not from the CUDA backend");
    LILY_CHECK(s->length_ <= length_, "restore: snapshot at {} tokens is past this sequence's {} tokens", s->length_,
               length_);
    copy_recurrent(s->conv, s->ssm, conv, ssm);
    set_length(s->length_);
  }
  void reset() override {
    for (auto& b : conv) CUDA_CHECK(cudaMemset(b.p, 0, b.bytes));
    for (auto& b : ssm) CUDA_CHECK(cudaMemset(b.p, 0, b.bytes));
    set_length(0);
  }

  void set_length(int64_t n) {
    length_ = n;
    set_position<<<1, 1>>>(position.as<int32_t>(), int(n));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void advance_host(int64_t n) { length_ += n; }

  const ModelConfig config_;
  int64_t capacity_;
  int64_t length_ = 0;
  uint64_t kv_row_bytes_, conv_bytes_, ssm_bytes_;
  std::vector<DeviceBuffer> k_cache, v_cache, conv, ssm;  // per attention / DeltaNet layer
  DeviceBuffer position;                                   // int32: tokens processed so far
  cudaGraphExec_t graph_exec = nullptr;                    // the captured T = 1 step

 private:
  static void copy_recurrent(const std::vector<DeviceBuffer>& conv_src, const std::vector<DeviceBuffer>& ssm_src,
                             std::vector<DeviceBuffer>& conv_dst, std::vector<DeviceBuffer>& ssm_dst) {
    for (size_t i = 0; i < conv_src.size(); ++i) {
      CUDA_CHECK(cudaMemcpy(conv_dst[i].p, conv_src[i].p, conv_src[i].bytes, cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemcpy(ssm_dst[i].p, ssm_src[i].p, ssm_src[i].bytes, cudaMemcpyDeviceToDevice));
    }
  }
};

// Per-pass activations, sized for chunk_tokens_ rows.
struct Scratch {
  DeviceBuffer tokens;       // int32 [chunk_tokens_]
  DeviceBuffer next_token;   // int32 [1]: the greedy pick of the last step
  DeviceBuffer h, normed;    // [T, H]
  DeviceBuffer wide;         // [T, max(conv_dim, 2*nq*hd)]  qkv or qg
  DeviceBuffer z;            // [T, Hv*128]
  DeviceBuffer b, a;         // [T, Hv]
  DeviceBuffer k, v;         // [T, nkv*hd]
  DeviceBuffer fused;        // [1, max(conv_dim + Hv*128 + 2*Hv, (2*nq + 2*nkv)*hd)]  T = 1 fused projections
  DeviceBuffer mixer_out;    // [T, max(Hv*128, nq*hd)]  input of out_proj / o_proj
  DeviceBuffer expert_ids, expert_weights;  // [T, k+1]  slot k: the shared expert (decode, fp32 prefill)
  DeviceBuffer act;          // [T, k+1, I]               (decode, fp32 prefill)
  DeviceBuffer moe_grouped;  // prefill MoE: routing, plan, intermediates of one pass
  DeviceBuffer logits;       // [kLogitRows, V]
  DeviceBuffer attention_scratch;  // split-KV partials and counters (zeroed once; kernels reset them)
  DeviceBuffer route_scratch;      // moe_route_norm's logits and counters (zeroed once; kernels reset them)
  DeviceBuffer candidates, candidate_scratch;  // sampling candidates of one row (top_candidates)
  DeviceBuffer moe_fused_scratch;  // moe_fused_decode's barrier, logits, act (zeroed once)
  DeviceBuffer deltanet_scratch;   // prefill intermediates of one pass
};

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(std::unique_ptr<GpuWeights> weights) : w_(std::move(weights)), c_(w_->config()) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const uint64_t T = chunk_tokens_, H = uint64_t(c_.hidden_size);
    const uint64_t wide = std::max<uint64_t>(uint64_t(c_.linear_conv_dim()), 2ull * c_.num_attention_heads * c_.head_dim);
    const uint64_t value_dim = uint64_t(c_.linear_value_dim());
    const uint64_t mixer = std::max<uint64_t>(value_dim, uint64_t(c_.num_attention_heads) * c_.head_dim);
    s_.tokens = DeviceBuffer(T * 4);
    s_.next_token = DeviceBuffer(4);
    s_.h = DeviceBuffer(T * H * 4);
    s_.normed = DeviceBuffer(T * H * 4);
    s_.wide = DeviceBuffer(T * wide * 4);
    s_.z = DeviceBuffer(T * value_dim * 4);
    s_.b = DeviceBuffer(T * uint64_t(c_.linear_num_value_heads) * 4);
    s_.a = DeviceBuffer(T * uint64_t(c_.linear_num_value_heads) * 4);
    s_.k = DeviceBuffer(T * uint64_t(c_.attention_kv_width()) * 4);
    s_.v = DeviceBuffer(T * uint64_t(c_.attention_kv_width()) * 4);
    s_.fused = DeviceBuffer(std::max<uint64_t>(
        uint64_t(c_.linear_conv_dim()) + value_dim + 2ull * c_.linear_num_value_heads,
        (2ull * c_.num_attention_heads + 2ull * c_.num_key_value_heads) * c_.head_dim) * 4);
    s_.mixer_out = DeviceBuffer(T * mixer * 4);
    const uint64_t slots = uint64_t(c_.num_experts_per_tok) + 1;
    s_.expert_ids = DeviceBuffer(T * slots * 4);
    s_.expert_weights = DeviceBuffer(T * slots * 4);
    s_.act = DeviceBuffer(T * slots * uint64_t(c_.moe_intermediate_size) * 4);
    s_.moe_grouped = DeviceBuffer(moe_grouped_scratch_bytes(moe_weights(w_->layers.at(0).moe), chunk_tokens_,
                                                            c_.num_experts_per_tok));
    s_.logits = DeviceBuffer(uint64_t(kLogitRows) * uint64_t(c_.vocab_size) * 4);
    s_.attention_scratch = DeviceBuffer(attention_scratch_bytes());
    CUDA_CHECK(cudaMemset(s_.attention_scratch.p, 0, s_.attention_scratch.bytes));
    s_.route_scratch = DeviceBuffer(moe_route_scratch_bytes(c_.num_experts, chunk_tokens_));
    s_.moe_fused_scratch = DeviceBuffer(moe_fused_scratch_bytes(c_.num_experts, c_.moe_intermediate_size,
                                                                c_.num_experts_per_tok));
    CUDA_CHECK(cudaMemset(s_.moe_fused_scratch.p, 0, s_.moe_fused_scratch.bytes));
    CUDA_CHECK(cudaMemset(s_.route_scratch.p, 0, s_.route_scratch.bytes));
    s_.deltanet_scratch = DeviceBuffer(gated_deltanet_scratch_bytes(deltanet_params(chunk_tokens_)));
    CUDA_CHECK(cudaMallocHost(&host_token_, 4));
    CUDA_CHECK(cudaMallocHost(&host_ring_, kRing * 4));
    CUDA_CHECK(cudaMallocHost(&host_candidates_, kMaxTopCandidates * sizeof(Candidate)));
    CUDA_CHECK(cudaMallocHost(&host_logits_, size_t(c_.vocab_size) * 4));
    s_.candidates = DeviceBuffer(kMaxTopCandidates * sizeof(Candidate));
    s_.candidate_scratch = DeviceBuffer(top_candidates_scratch_bytes(c_.vocab_size));
  }
  ~CudaBackendImpl() override {
    cudaStreamDestroy(stream_);
    cudaFreeHost(host_token_);
    cudaFreeHost(host_ring_);
    cudaFreeHost(host_candidates_);
    cudaFreeHost(host_logits_);
  }

  std::string name() const override { return "cuda"; }
  void set_prefill_math(PrefillMath math) override { fp32_prefill_ = math == PrefillMath::fp32; }
  const ModelConfig& config() const override { return c_; }
  uint64_t weight_bytes() const override { return w_->bytes(); }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    LILY_CHECK(capacity > 0, "sequence capacity must be positive, got {}", capacity);
    return std::make_unique<CudaSequenceState>(c_, capacity);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    auto& s = as_cuda(state);
    const int64_t T = int64_t(tokens.size()), V = c_.vocab_size;
    LILY_CHECK(s.length() + T <= s.capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s.length(), T, s.capacity());
    for (int32_t id : tokens) LILY_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    logits.assign(size_t(wanted == LogitsWanted::all ? T * V : wanted == LogitsWanted::last && T > 0 ? V : 0), 0.f);

    if (T == 1) {  // decode: replay the captured step
      write_step_token(tokens[0]);
      launch_step_graph(s);
      // The row through pinned memory: a device-to-pageable copy is staged by the driver at a
      // fraction of the bandwidth.
      if (wanted != LogitsWanted::none)
        CUDA_CHECK(cudaMemcpyAsync(host_logits_, s_.logits.p, size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      if (wanted != LogitsWanted::none) std::memcpy(logits.data(), host_logits_, size_t(V) * 4);
      s.advance_host(1);
      return;
    }
    for (int64_t t0 = 0; t0 < T; t0 += chunk_tokens_) {
      const int n = int(std::min<int64_t>(chunk_tokens_, T - t0));
      CUDA_CHECK(cudaMemcpyAsync(s_.tokens.p, tokens.data() + t0, size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
      const bool last_chunk = t0 + n == T;
      int first_row = n;  // no logits
      if (wanted == LogitsWanted::all) first_row = 0;
      else if (wanted == LogitsWanted::last && last_chunk) first_row = n - 1;
      float* dst = first_row >= n ? nullptr : wanted == LogitsWanted::all ? logits.data() + t0 * V : logits.data();
      forward_pass(s, n, first_row, dst);
      // The pass reads the host tokens and writes the host logits asynchronously: finish
      // before the next chunk overwrites the pinned staging (tokens come from pageable memory).
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      s.advance_host(n);
    }
  }

  // One decode step (the captured graph), then the `count` best logits selected on the GPU:
  // count (value, id) pairs come back instead of the 1 MB row (Backend::forward_candidates).
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          std::vector<TokenLogit>& out) override {
    if (count < 1 || count > kMaxTopCandidates) return false;
    auto& s = as_cuda(state);
    const int32_t V = c_.vocab_size;
    LILY_CHECK(s.length() + 1 <= s.capacity(), "sequence of {} tokens plus 1 exceeds its capacity of {}", s.length(),
               s.capacity());
    LILY_CHECK(token >= 0 && token < V, "token id {} is outside the vocabulary [0, {})", token, V);
    write_step_token(token);
    launch_step_graph(s);
    top_candidates(s_.logits.as<float>(), std::min(vocab_limit, V), count, s_.candidate_scratch.p,
                   s_.candidates.as<Candidate>(), stream_);
    CUDA_CHECK(cudaMemcpyAsync(host_candidates_, s_.candidates.p, size_t(count) * sizeof(Candidate),
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    s.advance_host(1);
    out.clear();
    for (int i = 0; i < count; ++i)
      if (host_candidates_[i].id != INT32_MAX) out.push_back({host_candidates_[i].id, host_candidates_[i].value});
    return true;
  }

  std::vector<int32_t> decode_greedy(SequenceState& state, int32_t first_token, int count) override {
    auto& s = as_cuda(state);
    LILY_CHECK(s.length() + count <= s.capacity(), "decode of {} tokens exceeds the capacity", count);
    write_step_token(first_token);
    std::vector<int32_t> out;
    std::vector<cudaEvent_t> events(kRing);
    for (auto& e : events) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int64_t issued = 0, received = 0;
    // Keep up to kRing steps in flight; the host only waits for a token when the ring is full.
    while (received < count) {
      while (issued < count && issued - received < kRing) {
        launch_step_graph(s);  // writes the arg max into s_.tokens for the next step
        CUDA_CHECK(cudaMemcpyAsync(host_ring_ + issued % kRing, s_.next_token.p, 4, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaEventRecord(events[size_t(issued % kRing)], stream_));
        ++issued;
      }
      CUDA_CHECK(cudaEventSynchronize(events[size_t(received % kRing)]));
      out.push_back(host_ring_[received % kRing]);
      ++received;
    }
    for (auto& e : events) cudaEventDestroy(e);
    s.advance_host(count);
    return out;
  }

  void fake_fill(SequenceState& state, int64_t length) override {
    auto& s = as_cuda(state);
    LILY_CHECK(length <= s.capacity(), "fake_fill beyond capacity");
    for (size_t i = 0; i < s.k_cache.size(); ++i) {
      fill_bf16<<<1024, 256>>>(s.k_cache[i].as<uint16_t>(), s.k_cache[i].bytes / 2, uint32_t(i));
      fill_bf16<<<1024, 256>>>(s.v_cache[i].as<uint16_t>(), s.v_cache[i].bytes / 2, uint32_t(i + 99));
    }
    CUDA_CHECK_LAUNCH();
    s.set_length(length);
  }

 private:
  static CudaSequenceState& as_cuda(SequenceState& state) {
    auto* s = dynamic_cast<CudaSequenceState*>(&state);
    LILY_CHECK(s, "sequence state is not from the CUDA backend");
    return *s;
  }

  // `token` into the decode step's input slot, through pinned memory, in stream order.
  void write_step_token(int32_t token) {
    *host_token_ = token;
    CUDA_CHECK(cudaMemcpyAsync(s_.tokens.p, host_token_, 4, cudaMemcpyHostToDevice, stream_));
  }

  // The T = 1 step as a graph, captured the first time per sequence.
  void launch_step_graph(CudaSequenceState& s) {
    if (!s.graph_exec) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
      forward_pass(s, 1, 0);
      argmax(s_.logits.as<float>(), c_.vocab_size, s_.next_token.as<int32_t>(), stream_);
      CUDA_CHECK(cudaMemcpyAsync(s_.tokens.p, s_.next_token.p, 4, cudaMemcpyDeviceToDevice, stream_));
      CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
      s.graph_exec = instantiate_step(graph);
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
    CUDA_CHECK(cudaGraphLaunch(s.graph_exec, stream_));
  }

  // The captured step, its kernel-to-kernel edges made programmatic (pdl.cuh) unless LILY_PDL=0;
  // if the driver refuses that graph, the plain one.
  static cudaGraphExec_t instantiate_step(cudaGraph_t graph) {
    if (const char* v = std::getenv("LILY_DECODE_CARVEOUT")) prefer_shared_carveout(graph, std::atoi(v));  // experiment
    static const bool pdl = env_value("LILY_PDL") != "0";
    cudaGraphExec_t exec = nullptr;
    if (pdl) {
      cudaGraph_t programmatic = nullptr;
      CUDA_CHECK(cudaGraphClone(&programmatic, graph));
      make_edges_programmatic(programmatic);  // pdl_graph.h
      const cudaError_t e = cudaGraphInstantiate(&exec, programmatic, 0);
      CUDA_CHECK(cudaGraphDestroy(programmatic));
      if (e == cudaSuccess) return exec;
      (void)cudaGetLastError();
      static bool warned = false;
      if (!warned) std::fprintf(stderr, "lily: the decode graph with programmatic edges failed (%s); plain graph\n",
                                cudaGetErrorString(e));
      warned = true;
    }
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    return exec;
  }

  // One pass of T <= chunk_tokens_ tokens (already in s_.tokens) through the model; logits of
  // rows [first_row, T) into s_.logits (host_logits == nullptr: at most kLogitRows rows) or,
  // kLogitRows rows at a time through s_.logits, to host_logits (asynchronous copies in
  // stream order).
  void forward_pass(CudaSequenceState& s, int T, int first_row, float* host_logits = nullptr) {
    const int H = c_.hidden_size;
    float* h = s_.h.as<float>();
    float* normed = s_.normed.as<float>();
    embed_tokens(w_->embed_tokens, s_.tokens.as<int32_t>(), T, h, stream_);
    size_t attention_index = 0, deltanet_index = 0;
    for (const GpuLayer& layer : w_->layers) {
      if (layer.kind == LayerKind::full_attention)
        attention_layer(layer.attention, layer.input_layernorm, s, attention_index++, T);
      else
        deltanet_layer(layer.deltanet, layer.input_layernorm, s, deltanet_index++, T);
      if (!(T == 1 && skip_.moe)) moe_block(layer.moe, layer.post_attention_layernorm, T);
    }
    advance_position<<<1, 1, 0, stream_>>>(s.position.as<int32_t>(), T);
    CUDA_CHECK_LAUNCH();
    if (first_row < T) {
      const int rows = T - first_row;
      LILY_CHECK(host_logits || rows <= kLogitRows, "forward_pass: {} rows of logits", rows);
      const size_t V = size_t(c_.vocab_size);
      if (rows == 1 && rms_norm_gemv_supports(w_->lm_head)) {
        if (T == 1 && skip_.lm_head) return;
        rms_norm_gemv(w_->lm_head, h + size_t(first_row) * H, w_->final_norm, c_.rms_norm_eps, s_.logits.as<float>(),
                      stream_);
        if (host_logits) CUDA_CHECK(cudaMemcpyAsync(host_logits, s_.logits.p, V * 4, cudaMemcpyDeviceToHost, stream_));
        return;
      }
      rms_norm(h + size_t(first_row) * H, w_->final_norm, rows, H, c_.rms_norm_eps, normed, stream_);
      for (int r0 = 0; r0 < rows; r0 += kLogitRows) {
        const int n = std::min(kLogitRows, rows - r0);
        project(w_->lm_head, normed + size_t(r0) * H, s_.logits.as<float>(), n);
        if (host_logits)
          CUDA_CHECK(cudaMemcpyAsync(host_logits + size_t(r0) * V, s_.logits.p, size_t(n) * V * 4,
                                     cudaMemcpyDeviceToHost, stream_));
      }
    }
  }

  // y = x @ W^T for T rows: gemv for decode (T = 1), the tensor-core GEMM for prefill.
  void project(const QMatrix& W, const float* x, float* y, int T) {
    if (T == 1 || fp32_prefill_) gemv(W, x, y, T, stream_);
    else gemm_q4(W, x, y, T, stream_);
  }
  // y += x @ W^T
  void project_accumulate(const QMatrix& W, const float* x, float* y, int T) {
    if (T == 1 || fp32_prefill_) gemv_accumulate(W, x, y, T, stream_);
    else gemm_q4_accumulate(W, x, y, T, stream_);
  }

  static MoeGroupedWeights moe_weights(const GpuMoe& m) {
    MoeGroupedWeights w;
    w.router = m.router;
    w.gate = m.experts_gate, w.up = m.experts_up, w.down = m.experts_down;
    w.shared_gate = m.shared_gate, w.shared_up = m.shared_up, w.shared_down = m.shared_down;
    w.shared_expert_gate = m.shared_expert_gate;
    return w;
  }

  AttentionParams attention_params(int T, int capacity) const {
    AttentionParams p;
    p.T = T;
    p.num_heads = c_.num_attention_heads;
    p.num_kv_heads = c_.num_key_value_heads;
    p.head_dim = c_.head_dim;
    p.rotary_dim = c_.rotary_dim;
    p.rope_theta = c_.rope_theta;
    p.eps = c_.rms_norm_eps;
    p.capacity = capacity;
    return p;
  }

  // Enough for any sequence: the split count stops growing at a few thousand rows of capacity.
  size_t attention_scratch_bytes() const {
    return std::max(gated_attention_scratch_bytes(attention_params(1, 1 << 22)),
                    gated_attention_scratch_bytes(attention_params(chunk_tokens_, 1 << 22)));
  }

  DeltaNetParams deltanet_params(int T) const {
    DeltaNetParams p;
    p.T = T;
    p.num_key_heads = c_.linear_num_key_heads;
    p.num_value_heads = c_.linear_num_value_heads;
    p.head_dim = c_.linear_key_head_dim;
    p.conv_kernel = c_.linear_conv_kernel_dim;
    p.eps = c_.rms_norm_eps;
    // The faster form for the length: cuda_test_deltanet's timing table (docs/perf.md) has the
    // token loop ahead below ~48 tokens (18.8 vs 41.9 us at 2, 22.1 vs 44.2 at 16) and the chunked
    // form ahead from 64 (52.6 vs 61.1 us; 2.6x from 512). LILY_DELTANET_PREFILL=recurrent|chunked
    // forces one (A/B runs).
    p.prefill = T < kChunkedDeltaRuleFrom ? DeltaRulePrefill::recurrent : DeltaRulePrefill::chunked;
    if (deltanet_prefill_form_ == "recurrent") p.prefill = DeltaRulePrefill::recurrent;
    if (deltanet_prefill_form_ == "chunked") p.prefill = DeltaRulePrefill::chunked;
    return p;
  }

  // h += o_proj(gated_attention(q_proj, k_proj, v_proj of RMSNorm(h)))
  void attention_layer(const GpuAttention& a, const float* input_norm, CudaSequenceState& s, size_t index, int T) {
    const float *qg, *k, *v;
    if (T == 1 && rms_norm_gemv_supports(a.qkv_proj)) {  // one launch: [qg | k | v] = RMSNorm(h) @ [Wq; Wk; Wv]^T
      float* out = s_.fused.as<float>();
      if (!skip_.in_proj) rms_norm_gemv(a.qkv_proj, s_.h.as<float>(), input_norm, c_.rms_norm_eps, out, stream_);
      qg = out, k = out + a.q_proj.rows, v = out + a.q_proj.rows + a.k_proj.rows;
    } else {
      const float* x = s_.normed.as<float>();
      rms_norm(s_.h.as<float>(), input_norm, T, c_.hidden_size, c_.rms_norm_eps, s_.normed.as<float>(), stream_);
      project(a.q_proj, x, s_.wide.as<float>(), T);
      project(a.k_proj, x, s_.k.as<float>(), T);
      project(a.v_proj, x, s_.v.as<float>(), T);
      qg = s_.wide.as<float>(), k = s_.k.as<float>(), v = s_.v.as<float>();
    }
    AttentionParams p = attention_params(T, int(s.capacity()));
    p.q_norm = a.q_norm;
    p.k_norm = a.k_norm;
    p.position = s.position.as<int32_t>();
    if (!(T == 1 && skip_.mixer))
      gated_attention_core(p, qg, k, v, s.k_cache[index].as<bf16>(), s.v_cache[index].as<bf16>(),
                           s_.mixer_out.as<float>(), s_.attention_scratch.p, stream_);
    if (!(T == 1 && skip_.out_proj)) project_accumulate(a.o_proj, s_.mixer_out.as<float>(), s_.h.as<float>(), T);
  }

  // h += out_proj(gated_deltanet(in_proj_qkv, z, b, a of RMSNorm(h)))
  void deltanet_layer(const GpuDeltaNet& d, const float* input_norm, CudaSequenceState& s, size_t index, int T) {
    const float *mixed, *z, *b, *a;
    if (T == 1 && rms_norm_gemv_supports(d.in_proj_all)) {  // one launch: [qkv | z | b | a] = RMSNorm(h) @ W_all^T
      float* out = s_.fused.as<float>();
      if (!skip_.in_proj) rms_norm_gemv(d.in_proj_all, s_.h.as<float>(), input_norm, c_.rms_norm_eps, out, stream_);
      mixed = out, z = out + d.in_proj_qkv.rows, b = z + d.in_proj_z.rows, a = b + d.in_proj_b.rows;
    } else {
      const float* x = s_.normed.as<float>();
      rms_norm(s_.h.as<float>(), input_norm, T, c_.hidden_size, c_.rms_norm_eps, s_.normed.as<float>(), stream_);
      project(d.in_proj_qkv, x, s_.wide.as<float>(), T);
      project(d.in_proj_z, x, s_.z.as<float>(), T);
      project(d.in_proj_b, x, s_.b.as<float>(), T);
      project(d.in_proj_a, x, s_.a.as<float>(), T);
      mixed = s_.wide.as<float>(), z = s_.z.as<float>(), b = s_.b.as<float>(), a = s_.a.as<float>();
    }
    DeltaNetParams p = deltanet_params(T);
    p.conv_weight = d.conv1d;
    p.A_log = d.A_log;
    p.dt_bias = d.dt_bias;
    p.norm_weight = d.norm;
    if (!(T == 1 && skip_.mixer))
      gated_deltanet_core(p, mixed, z, b, a, s.conv[index].as<float>(), s.ssm[index].as<float>(),
                          s_.mixer_out.as<float>(), s_.deltanet_scratch.p, stream_);
    if (!(T == 1 && skip_.out_proj)) project_accumulate(d.out_proj, s_.mixer_out.as<float>(), s_.h.as<float>(), T);
  }

  // h += routed experts + gated shared expert, all of x = RMSNorm(h) (the shared expert is slot k)
  void moe_block(const GpuMoe& m, const float* post_attention_norm, int T) {
    float* x = s_.normed.as<float>();
    const int k = c_.num_experts_per_tok;
    if (T > 1 && !fp32_prefill_) {  // prefill: routing on the GPU, grouped expert GEMMs, fused combine
      rms_norm(s_.h.as<float>(), post_attention_norm, T, c_.hidden_size, c_.rms_norm_eps, x, stream_);
      moe_grouped_accumulate(moe_weights(m), x, T, k, kPrefillFp32Router, s_.moe_grouped.p, s_.h.as<float>(), stream_);
      return;
    }
    int32_t* ids = s_.expert_ids.as<int32_t>();
    float* weights = s_.expert_weights.as<float>();
    if (T == 1) {  // decode: the whole block in one launch with LILY_MOE_FUSED=1 (moe_fused.cu)
      const MoeFusedWeights fw{m.router,       m.shared_expert_gate, m.experts_gate, m.experts_up, m.experts_down,
                               m.shared_gate, m.shared_up,          m.shared_down};
      if (moe_fused_enabled() && moe_fused_supports(fw, k)) {
        moe_fused_decode(fw, s_.h.as<float>(), post_attention_norm, c_.rms_norm_eps, k, ids, weights,
                         s_.moe_fused_scratch.p, stream_);
        return;
      }
    }
    const bool decode = T == 1;
    // Decode: the top-k is chosen by the expert launches from the router logits (each block; down
    // before its PDL wait) rather than by the last block of moe_route_norm: a fence, an atomic
    // ticket and a serial tail fewer on the critical path (LILY_EXPERTS_CHOOSE=0: the router).
    const bool experts_choose =
        decode && experts_choose_ && moe_experts_can_choose(m.experts_gate, m.experts_down, c_.num_experts, k);
    const float* logits = experts_choose ? moe_route_logits(s_.route_scratch.p, chunk_tokens_) : nullptr;
    if (!(decode && skip_.route))
      moe_route_norm(m.router, m.shared_expert_gate, s_.h.as<float>(), post_attention_norm, c_.rms_norm_eps, T, k, x,
                     ids, weights, s_.route_scratch.p, chunk_tokens_, stream_, !experts_choose);
    if (!(decode && skip_.gate_up))
      moe_gate_up(m.experts_gate, m.experts_up, m.shared_gate, m.shared_up, x, ids, T, k, s_.act.as<float>(), stream_,
                  logits);
    // ids (or the logits) come from moe_route_norm, two kernels back: down's routed weights load
    // before its wait.
    if (!(decode && skip_.down))
      moe_down_accumulate(m.experts_down, m.shared_down, s_.act.as<float>(), ids, weights, T, k, s_.h.as<float>(),
                          stream_, down_ids_early_, logits);
  }

  static constexpr int kRing = 8;
  const int chunk_tokens_ = prefill_chunk_tokens();  // tokens per prefill pass
  const std::string deltanet_prefill_form_{env_value("LILY_DELTANET_PREFILL")};  // A/B runs, read once
  const DecodeSkip skip_ = DecodeSkip::from_env();   // measurement only (LILY_DECODE_SKIP)
  const bool down_ids_early_ = env_value("LILY_DOWN_EARLY") != "0";      // A/B switch
  const bool experts_choose_ = env_value("LILY_EXPERTS_CHOOSE") != "0";  // A/B switch
  std::unique_ptr<GpuWeights> w_;
  const ModelConfig c_;
  cudaStream_t stream_ = nullptr;
  Scratch s_;
  int32_t* host_token_ = nullptr;
  int32_t* host_ring_ = nullptr;
  Candidate* host_candidates_ = nullptr;  // pinned: forward_candidates' result
  float* host_logits_ = nullptr;          // pinned: one row of logits (decode steps)
  bool fp32_prefill_ = false;  // PrefillMath::fp32
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights) {
  return std::make_unique<CudaBackendImpl>(GpuWeights::upload(*weights));
}

std::unique_ptr<CudaBackend> make_cuda_backend(std::unique_ptr<GpuWeights> weights) {
  return std::make_unique<CudaBackendImpl>(std::move(weights));
}

double measure_device_copy_bandwidth() {
  const uint64_t bytes = 2ull << 30;
  DeviceBuffer src(bytes), dst(bytes);
  CUDA_CHECK(cudaMemset(src.p, 1, bytes));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaMemcpy(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  float best_ms = 1e30f;
  for (int i = 0; i < 5; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    CUDA_CHECK(cudaMemcpy(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(bytes) / (double(best_ms) * 1e-3);
}

std::string device_name() {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

void cuda_profiler_start() { CUDA_CHECK(cudaProfilerStart()); }
void cuda_profiler_stop() { CUDA_CHECK(cudaProfilerStop()); }

bool cuda_backend_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace lily
