#include "model/checkpoint/load.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "base/error.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "model/checkpoint/safetensors.h"
#include "model/gguf_weights.h"
#include "model/quant.h"

namespace lily {

namespace {

// Reads tensors by HF-relative name ("layers.3.mlp.gate") from one checkpoint, whatever its
// prefix, and converts them into the in-memory forms of weights.h. `quantization` (config.json's,
// when the checkpoint has one) must agree with the shapes of quantized tensors.
class TensorReader {
 public:
  // The decoder's tensors: prefix and layout detected from the checkpoint's embedding.
  TensorReader(const Checkpoint& ckpt, const std::optional<QuantizationConfig>& quantization)
      : ckpt_(ckpt), quantization_(quantization) {
    detect_layout();
  }
  // The tensors under `prefix` ("mtp."), stored in `layout`.
  TensorReader(const Checkpoint& ckpt, const std::optional<QuantizationConfig>& quantization, std::string prefix,
               CheckpointLayout layout)
      : ckpt_(ckpt), quantization_(quantization), prefix_(std::move(prefix)), layout_(layout) {}

  // Whether `ckpt` holds a decoder's embedding under one of the prefixes detect_layout knows.
  static bool has_embedding(const Checkpoint& ckpt) {
    for (const auto& c : kPrefixes)
      if (ckpt.contains(std::string(c.prefix) + "embed_tokens.weight")) return true;
    return false;
  }

  CheckpointLayout layout() const { return layout_; }

  // A linear weight `<prefix><name>` of shape [rows, cols]: plain `.weight`, or quantized
  // `.weight/.scales/.biases`.
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const std::string base = prefix_ + name;
    if (const TensorView* scales = ckpt_.find(base + ".scales")) return quantized(base, scales, rows, cols, 0, 1);
    const TensorView& w = ckpt_.get(base + ".weight");
    expect_shape(w, {rows, cols});
    return plain(w, rows, cols, 0);
  }

  // The whole model's lm_head lives outside the decoder prefix.
  Matrix lm_head(int64_t rows, int64_t cols) const {
    const std::string base = lm_head_name_;
    if (const TensorView* scales = ckpt_.find(base + ".scales")) return quantized(base, scales, rows, cols, 0, 1);
    const TensorView& w = ckpt_.get(base + ".weight");
    expect_shape(w, {rows, cols});
    return plain(w, rows, cols, 0);
  }

  bool has_lm_head() const { return ckpt_.contains(lm_head_name_ + ".weight"); }

  // One expert's slice of a stacked [E, rows, cols] tensor (plain or quantized), starting at
  // row `row_offset` of each expert's block of `rows_per_expert` rows.
  Matrix stacked_expert(const std::string& base, int expert, int64_t num_experts, int64_t rows_per_expert,
                        int64_t row_offset, int64_t rows, int64_t cols) const {
    if (const TensorView* scales = ckpt_.find(base + ".scales"))
      return quantized(base, scales, rows, cols, expert * rows_per_expert + row_offset, num_experts);
    const TensorView* w = ckpt_.find(base + ".weight");
    if (!w) w = &ckpt_.get(base);  // HF fused experts have no .weight suffix
    expect_shape(*w, {num_experts, rows_per_expert, cols});
    return plain(*w, rows, cols, expert * rows_per_expert + row_offset);
  }

  // A float vector of n values (any float dtype), optionally with +1 (zero-centred norm gain).
  std::vector<float> vector(const std::string& name, std::initializer_list<int64_t> shape, float add = 0.f) const {
    const TensorView& t = ckpt_.get(prefix_ + name);
    return to_floats(t, shape, add);
  }

  const std::string& prefix() const { return prefix_; }
  const Checkpoint& checkpoint() const { return ckpt_; }

  std::vector<float> to_floats(const TensorView& t, std::vector<int64_t> shape, float add) const {
    expect_shape(t, shape);
    std::vector<float> v(size_t(t.numel()));
    const std::byte* p = t.data.data();
    for (size_t i = 0; i < v.size(); ++i) {
      switch (t.dtype) {
        case DType::F32: {
          float f;
          std::memcpy(&f, p + 4 * i, 4);
          v[i] = f;
          break;
        }
        case DType::BF16: {
          bf16 b;
          std::memcpy(&b, p + 2 * i, 2);
          v[i] = to_float(b);
          break;
        }
        case DType::F16: {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          v[i] = half_to_float(h);
          break;
        }
        default: fail("tensor '{}' has dtype {}; expected a float dtype", t.name, dtype_name(t.dtype));
      }
      v[i] += add;
    }
    return v;
  }

  static void expect_shape(const TensorView& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape)
      fail("tensor '{}': expected shape [{}], found {}", t.name, fmt::join(shape, ", "), t.shape_string());
  }

 private:
  struct Candidate {
    const char* prefix;
    const char* lm_head;
  };
  static constexpr Candidate kPrefixes[] = {
      {"language_model.model.", "language_model.lm_head"},  // mlx-lm / mlx-vlm conversions
      {"model.language_model.", "lm_head"},                 // official HF (multimodal wrapper)
      {"model.", "lm_head"},                                // flat text-only export
  };

  void detect_layout() {
    for (const auto& c : kPrefixes) {
      if (ckpt_.contains(std::string(c.prefix) + "embed_tokens.weight")) {
        prefix_ = c.prefix;
        lm_head_name_ = c.lm_head;
        break;
      }
    }
    if (prefix_.empty())
      fail("{}: no embedding tensor found (looked for language_model.model.embed_tokens.weight, "
           "model.language_model.embed_tokens.weight, model.embed_tokens.weight); not a Qwen3.6 checkpoint?",
           ckpt_.dir());
    // Spec §8: the conv1d shape tells an mlx conversion ([C, K, 1], norms pre-shifted) from HF ([C, 1, K]).
    layout_ = CheckpointLayout::hf;
    for (const std::string& name : ckpt_.names()) {
      if (name.starts_with(prefix_) && name.ends_with("linear_attn.conv1d.weight")) {
        const TensorView& t = *ckpt_.find(name);
        if (t.shape.size() == 3 && t.shape[2] == 1 && t.shape[1] != 1) layout_ = CheckpointLayout::mlx;
        break;
      }
    }
    if (prefix_ == "language_model.model.") layout_ = CheckpointLayout::mlx;
  }

  Matrix plain(const TensorView& t, int64_t rows, int64_t cols, int64_t first_row) const {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    size_t elem = dtype_size(t.dtype);
    switch (t.dtype) {
      case DType::F32: m.format = MatrixFormat::f32; break;
      case DType::BF16: m.format = MatrixFormat::bf16; break;
      case DType::F16: m.format = MatrixFormat::f16; break;
      case DType::F8_E4M3:
      case DType::F8_E5M2:
        fail("tensor '{}' is {}: FP8 checkpoints are not supported: use the bf16 or mlx 4-bit checkpoint", t.name,
             dtype_name(t.dtype));
      default:
        fail("tensor '{}' has dtype {}; expected F32, BF16 or F16 (or a quantized triple)", t.name,
             dtype_name(t.dtype));
    }
    m.data = t.data.data() + size_t(first_row * cols) * elem;
    return m;
  }

  // `.weight` uint32 codes [..., rows, cols*bits/32] with `.scales`/`.biases` bf16 [..., rows, cols/G].
  Matrix quantized(const std::string& base, const TensorView* scales, int64_t rows, int64_t cols, int64_t first_row,
                   int64_t num_experts) const {
    const TensorView& w = ckpt_.get(base + ".weight");
    const TensorView& biases = ckpt_.get(base + ".biases");
    const bool stacked = num_experts > 1 || w.shape.size() == 3;
    auto lead = [&](int64_t r, int64_t c) -> std::vector<int64_t> {
      return stacked ? std::vector<int64_t>{num_experts, r, c} : std::vector<int64_t>{r, c};
    };
    if (w.dtype != DType::U32)
      fail("tensor '{}.weight' is quantized (has .scales) but has dtype {}, expected U32", base, dtype_name(w.dtype));
    if (scales->dtype != DType::BF16 && scales->dtype != DType::F16 && scales->dtype != DType::F32)
      fail("tensor '{}.scales' has dtype {}", base, dtype_name(scales->dtype));
    if (scales->dtype != DType::BF16 || biases.dtype != DType::BF16)
      fail("tensor '{}': lily reads bf16 scales and biases, found {} / {}", base, dtype_name(scales->dtype),
           dtype_name(biases.dtype));
    if (w.shape.empty() || scales->shape.empty()) fail("tensor '{}': empty shape", base);
    const int64_t word_cols = w.shape.back(), group_cols = scales->shape.back();
    if (group_cols <= 0 || word_cols <= 0 || cols % group_cols != 0 || (word_cols * 32) % cols != 0)
      fail("tensor '{}': codes {} and scales {} do not fit {} input columns", base, w.shape_string(),
           scales->shape_string(), cols);
    const int bits = int(word_cols * 32 / cols);
    const int group_size = int(cols / group_cols);
    // The config's quantization entry (per-module override, else global) must agree with the shapes.
    if (const auto& q = quantization_) {
      std::optional<QuantSpec> spec = q->for_module(base);
      if (spec && (spec->bits != bits || spec->group_size != group_size))
        fail("tensor '{}': shapes say {}-bit group {}, but config.json quantization says {}-bit group {}", base, bits,
             group_size, spec->bits, spec->group_size);
    }
    if (bits != 2 && bits != 4 && bits != 8) fail("tensor '{}': {}-bit quantization is not supported", base, bits);
    // Rows of one matrix (per expert when stacked).
    const int64_t r_total = stacked ? (w.shape.size() == 3 ? w.shape[1] : -1) : rows;
    expect_shape(w, lead(r_total, cols * bits / 32));
    expect_shape(*scales, lead(r_total, cols / group_size));
    expect_shape(biases, lead(r_total, cols / group_size));
    if (!stacked && first_row != 0) fail("internal: row offset into an unstacked tensor");
    if (first_row + rows > (stacked ? num_experts * r_total : r_total)) fail("tensor '{}': rows out of range", base);
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.format = MatrixFormat::affine;
    m.bits = bits;
    m.group_size = group_size;
    m.data = w.data.data() + size_t(first_row * (cols * bits / 32)) * 4;
    m.scales = reinterpret_cast<const bf16*>(scales->data.data()) + first_row * (cols / group_size);
    m.biases = reinterpret_cast<const bf16*>(biases.data.data()) + first_row * (cols / group_size);
    return m;
  }

  const Checkpoint& ckpt_;
  std::optional<QuantizationConfig> quantization_;
  std::string prefix_, lm_head_name_;
  CheckpointLayout layout_ = CheckpointLayout::hf;
};

// Effective gain of a zero-centred RMSNorm: HF stores w (gain 1 + w), mlx stores 1 + w.
float zero_centred_shift(const TensorReader& r) { return r.layout() == CheckpointLayout::hf ? 1.f : 0.f; }

AttentionWeights load_attention(const TensorReader& r, const ModelConfig& c, const std::string& p) {
  AttentionWeights a;
  const int64_t H = c.hidden_size, d = c.head_dim;
  a.q_proj = r.matrix(p + "q_proj", 2 * int64_t(c.num_attention_heads) * d, H);
  a.k_proj = r.matrix(p + "k_proj", int64_t(c.num_key_value_heads) * d, H);
  a.v_proj = r.matrix(p + "v_proj", int64_t(c.num_key_value_heads) * d, H);
  a.o_proj = r.matrix(p + "o_proj", H, int64_t(c.num_attention_heads) * d);
  a.q_norm = r.vector(p + "q_norm.weight", {d}, zero_centred_shift(r));
  a.k_norm = r.vector(p + "k_norm.weight", {d}, zero_centred_shift(r));
  return a;
}

DeltaNetWeights load_deltanet(const TensorReader& r, const ModelConfig& c, const std::string& p) {
  DeltaNetWeights w;
  const int64_t H = c.hidden_size, Hv = c.linear_num_value_heads, K = c.linear_conv_kernel_dim;
  const int64_t conv_dim = c.linear_conv_dim();
  w.in_proj_qkv = r.matrix(p + "in_proj_qkv", conv_dim, H);
  w.in_proj_z = r.matrix(p + "in_proj_z", c.linear_value_dim(), H);
  w.in_proj_b = r.matrix(p + "in_proj_b", Hv, H);
  w.in_proj_a = r.matrix(p + "in_proj_a", Hv, H);
  w.out_proj = r.matrix(p + "out_proj", H, c.linear_value_dim());
  const TensorView& conv = r.checkpoint().get(r.prefix() + p + "conv1d.weight");
  // HF [C, 1, K]; mlx [C, K, 1]: the same [C][K] order in memory.
  std::vector<int64_t> conv_shape = r.layout() == CheckpointLayout::mlx ? std::vector<int64_t>{conv_dim, K, 1}
                                                                        : std::vector<int64_t>{conv_dim, 1, K};
  w.conv1d = r.to_floats(conv, conv_shape, 0.f);
  w.A_log = r.vector(p + "A_log", {Hv});
  w.dt_bias = r.vector(p + "dt_bias", {Hv});
  w.norm = r.vector(p + "norm.weight", {c.linear_value_head_dim});  // gated norm: never shifted
  return w;
}

ExpertWeights load_experts(const TensorReader& r, const ModelConfig& c, const std::string& p) {
  ExpertWeights e;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  const Checkpoint& ck = r.checkpoint();
  const std::string base = r.prefix() + p;
  enum { switch_mlp, fused, per_expert } form;
  if (ck.contains(base + "switch_mlp.gate_proj.weight")) form = switch_mlp;
  else if (ck.contains(base + "experts.gate_up_proj")) form = fused;
  else if (ck.contains(base + "experts.0.gate_proj.weight")) form = per_expert;
  else
    fail("missing expert tensors: none of '{0}switch_mlp.gate_proj.weight', '{0}experts.gate_up_proj', "
         "'{0}experts.0.gate_proj.weight'",
         base);
  for (int x = 0; x < E; ++x) {
    switch (form) {
      case switch_mlp:
        e.gate_proj.push_back(r.stacked_expert(base + "switch_mlp.gate_proj", x, E, I, 0, I, H));
        e.up_proj.push_back(r.stacked_expert(base + "switch_mlp.up_proj", x, E, I, 0, I, H));
        e.down_proj.push_back(r.stacked_expert(base + "switch_mlp.down_proj", x, E, H, 0, H, I));
        break;
      case fused:  // gate_up_proj [E, 2I, H]: gate rows first, then up rows
        e.gate_proj.push_back(r.stacked_expert(base + "experts.gate_up_proj", x, E, 2 * I, 0, I, H));
        e.up_proj.push_back(r.stacked_expert(base + "experts.gate_up_proj", x, E, 2 * I, I, I, H));
        e.down_proj.push_back(r.stacked_expert(base + "experts.down_proj", x, E, H, 0, H, I));
        break;
      case per_expert: {
        std::string ex = fmt::format("{}experts.{}.", p, x);
        e.gate_proj.push_back(r.matrix(ex + "gate_proj", I, H));
        e.up_proj.push_back(r.matrix(ex + "up_proj", I, H));
        e.down_proj.push_back(r.matrix(ex + "down_proj", H, I));
        break;
      }
    }
  }
  return e;
}

MoeWeights load_moe(const TensorReader& r, const ModelConfig& c, const std::string& p) {
  MoeWeights m;
  const int64_t H = c.hidden_size, Is = c.shared_expert_intermediate_size;
  m.router = r.matrix(p + "gate", c.num_experts, H);
  m.experts = load_experts(r, c, p);
  m.shared_gate_proj = r.matrix(p + "shared_expert.gate_proj", Is, H);
  m.shared_up_proj = r.matrix(p + "shared_expert.up_proj", Is, H);
  m.shared_down_proj = r.matrix(p + "shared_expert.down_proj", H, Is);
  m.shared_expert_gate = r.matrix(p + "shared_expert_gate", 1, H);
  return m;
}

// A decoder layer under `p` ("layers.3.", or the MTP head's "layers.0.") of the given kind.
LayerWeights load_layer(const TensorReader& r, const ModelConfig& c, const std::string& p, LayerKind kind) {
  LayerWeights l;
  l.kind = kind;
  l.input_layernorm = r.vector(p + "input_layernorm.weight", {c.hidden_size}, zero_centred_shift(r));
  l.post_attention_layernorm = r.vector(p + "post_attention_layernorm.weight", {c.hidden_size}, zero_centred_shift(r));
  if (l.kind == LayerKind::full_attention) l.attention = load_attention(r, c, p + "self_attn.");
  else l.deltanet = load_deltanet(r, c, p + "linear_attn.");
  l.moe = load_moe(r, c, p + "mlp.");
  return l;
}

// The MTP head (spec §5a, §6), from a reader with the prefix "mtp.": fc, the three mtp norms
// (zero-centred like every other) and layers.0, a full-attention MoE layer whose experts may be
// per expert (the published layout), fused or stacked (repacks), as load_experts reads them.
MtpWeights load_mtp(const TensorReader& r, const ModelConfig& c) {
  MtpWeights m;
  const int64_t H = c.hidden_size;
  for (const std::string& name : r.checkpoint().names()) {
    const std::string p = r.prefix() + "layers.";
    if (name.starts_with(p) && !name.starts_with(p + "0."))
      fail("tensor '{}': lily runs a one-layer MTP head (mtp.layers.0, spec §6); this checkpoint has more", name);
  }
  m.fc = r.matrix("fc", H, 2 * H);
  m.pre_fc_norm_embedding = r.vector("pre_fc_norm_embedding.weight", {H}, zero_centred_shift(r));
  m.pre_fc_norm_hidden = r.vector("pre_fc_norm_hidden.weight", {H}, zero_centred_shift(r));
  m.layer = load_layer(r, c, "layers.0.", LayerKind::full_attention);
  m.norm = r.vector("norm.weight", {H}, zero_centred_shift(r));
  return m;
}

bool has_mtp_tensors(const Checkpoint& ckpt) {
  for (const std::string& name : ckpt.names())
    if (name.starts_with("mtp.")) return true;
  return false;
}

// The layout MTP tensors read from `ckpt` are stored in: that of its decoder when it has one
// (an mlx conversion pre-shifts its norms), else HF (a directory of the published mtp.* alone).
CheckpointLayout mtp_layout(const Checkpoint& ckpt, const std::optional<QuantizationConfig>& quantization) {
  if (!TensorReader::has_embedding(ckpt)) return CheckpointLayout::hf;
  return TensorReader(ckpt, quantization).layout();
}

// LoadOptions::mtp_dir: the MTP head from another directory (the HF checkpoint beside an mlx
// conversion, which dropped it). Its config.json, when it has one, gives the quantization its
// tensors are checked against; its mtp.* shapes must fit the model's config.
void load_mtp_from(const std::string& dir, ModelWeights& w) {
  with_context("reading the MTP head from " + dir, [&] {
    auto ckpt = std::make_shared<Checkpoint>(dir);
    if (!has_mtp_tensors(*ckpt))
      fail("{} holds no mtp.* tensors; --mtp names a checkpoint with the MTP head (the Hugging Face "
           "Qwen/Qwen3.6-35B-A3B has it)",
           dir);
    std::optional<QuantizationConfig> quantization;
    if (std::filesystem::exists(std::filesystem::path(dir) / "config.json"))
      quantization = load_model_config(dir).quantization;
    TensorReader r(*ckpt, quantization, "mtp.", mtp_layout(*ckpt, quantization));
    w.mtp = load_mtp(r, w.config);
    w.mtp_dir = dir;
    w.storage.push_back(ckpt);
  });
}

// Quantizes one plain matrix in place (its new bytes are owned by `storage`).
void quantize_matrix(Matrix& m, int bits, std::vector<std::shared_ptr<void>>& storage, std::mutex& mu) {
  if (m.empty() || m.quantized()) return;
  std::vector<float> values(size_t(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.dequantize_row(r, values.data() + r * m.cols);
  auto q = std::make_shared<QuantizedMatrix>(quantize_affine(values, m.rows, m.cols, bits, 64));
  m.format = MatrixFormat::affine;
  m.bits = bits;
  m.group_size = 64;
  m.data = q->codes.data();
  m.scales = q->scales.data();
  m.biases = q->biases.data();
  std::lock_guard lock(mu);
  storage.push_back(q);
}

using QuantizeJobs = std::vector<std::pair<Matrix*, int>>;  // a matrix and its bits

// One layer's matrices for quantize_weights: `bits` for all but the router and
// shared_expert_gate, 8 for those.
void add_layer_jobs(LayerWeights& l, int bits, QuantizeJobs& jobs) {
  if (l.kind == LayerKind::full_attention)
    for (Matrix* m : {&l.attention.q_proj, &l.attention.k_proj, &l.attention.v_proj, &l.attention.o_proj})
      jobs.push_back({m, bits});
  else
    for (Matrix* m : {&l.deltanet.in_proj_qkv, &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a,
                      &l.deltanet.out_proj})
      jobs.push_back({m, bits});
  MoeWeights& m = l.moe;
  jobs.push_back({&m.router, 8});
  jobs.push_back({&m.shared_expert_gate, 8});
  for (Matrix* x : {&m.shared_gate_proj, &m.shared_up_proj, &m.shared_down_proj}) jobs.push_back({x, bits});
  for (auto* list : {&m.experts.gate_proj, &m.experts.up_proj, &m.experts.down_proj})
    for (Matrix& x : *list) jobs.push_back({&x, bits});
}

// --quantize q4: the mlx scheme (4-bit g64; router and shared_expert_gate at 8 bits), the MTP
// head's matrices (fc and its layer) included. Matrices already quantized are left as they are.
void quantize_weights(ModelWeights& w, int bits) {
  QuantizeJobs jobs;
  jobs.push_back({&w.embed_tokens, bits});
  if (w.lm_head.data != w.embed_tokens.data) jobs.push_back({&w.lm_head, bits});
  for (LayerWeights& l : w.layers) add_layer_jobs(l, bits, jobs);
  if (w.mtp) {
    jobs.push_back({&w.mtp->fc, bits});
    add_layer_jobs(w.mtp->layer, bits, jobs);
  }
  std::mutex mu;
  parallel_for(int64_t(jobs.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) quantize_matrix(*jobs[size_t(i)].first, jobs[size_t(i)].second, w.storage, mu);
  });
  if (w.lm_head.data == nullptr) w.lm_head = w.embed_tokens;
}

bool is_gguf_file(const std::filesystem::path& path) {
  if (path.extension() == ".gguf") return true;
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

// What lily cannot load, said before anything else is read: any file that is not a GGUF.
void refuse_unsupported_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec))
    fail("{} is a file; lily loads a GGUF file, or a Hugging Face model directory of safetensors "
         "(Qwen/Qwen3.6-35B-A3B in bf16, or an mlx-community 4-bit conversion)",
         path);
}

// Token ids the model directory names must be rows of the model's embedding.
void check_token_ids(const ModelWeights& w) {
  for (int id : w.generation.eos_token_ids)
    if (id >= w.config.vocab_size)
      fail("generation_config.json: eos_token_id {} does not fit the model's vocabulary (vocab_size {})", id,
           w.config.vocab_size);
}

// LoadOptions applied to loaded weights: the MTP head from another directory, --quantize.
void apply_options(ModelWeights& w, const LoadOptions& options, bool mtp_loaded) {
  if (!options.mtp_dir.empty() && !mtp_loaded) load_mtp_from(options.mtp_dir, w);
  if (options.quantize_bits) {
    LILY_CHECK(options.quantize_bits == 4 || options.quantize_bits == 8, "--quantize supports q4 and q8, not {} bits",
               options.quantize_bits);
    quantize_weights(w, options.quantize_bits);
  }
}

}  // namespace

bool is_gguf_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return is_gguf_file(path);
  if (!fs::is_directory(path, ec)) return false;
  bool gguf = false, safetensors = false;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    if (entry.path().extension() == ".safetensors") safetensors = true;
    else if (entry.path().extension() == ".gguf") gguf = true;
  }
  return gguf && !safetensors;
}

std::shared_ptr<ModelWeights> load_model(const std::string& model_dir, const LoadOptions& options) {
  if (is_gguf_model(model_dir)) {
    auto w = load_gguf_model(model_dir);
    with_context("loading " + model_dir, [&] {
      check_token_ids(*w);
      apply_options(*w, options, false);
    });
    return w;
  }
  refuse_unsupported_path(model_dir);
  return with_context("loading " + model_dir, [&] {
    auto w = std::make_shared<ModelWeights>();
    w->model_dir = model_dir;
    w->config = load_model_config(model_dir);
    w->generation = load_generation_config(model_dir);
    check_token_ids(*w);
    auto ckpt = std::make_shared<Checkpoint>(model_dir);
    w->storage.push_back(ckpt);
    TensorReader r(*ckpt, w->config.quantization);
    w->layout = r.layout();
    const ModelConfig& c = w->config;
    w->embed_tokens = r.matrix("embed_tokens", c.vocab_size, c.hidden_size);
    w->final_norm = r.vector("norm.weight", {c.hidden_size}, zero_centred_shift(r));
    w->lm_head = r.has_lm_head() || !c.tie_word_embeddings ? r.lm_head(c.vocab_size, c.hidden_size) : w->embed_tokens;
    w->layers.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i)
      w->layers[size_t(i)] = with_context(fmt::format("layer {}", i), [&] {
        return load_layer(r, c, fmt::format("layers.{}.", i), c.layer_types[size_t(i)]);
      });
    bool mtp_loaded = false;
    if (options.mtp_dir.empty() && has_mtp_tensors(*ckpt)) {
      with_context("the MTP head (mtp.*)", [&] {
        w->mtp = load_mtp(TensorReader(*ckpt, c.quantization, "mtp.", w->layout), c);
        w->mtp_dir = model_dir;
      });
      mtp_loaded = true;
    }
    apply_options(*w, options, mtp_loaded);
    return w;
  });
}

}  // namespace lily
