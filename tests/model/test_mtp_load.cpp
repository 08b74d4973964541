// Loading the MTP head (mtp.*, spec §5a, §6): every HF layout that carries it, per-expert or
// fused experts, quantized at load, from another directory beside an mlx model (--mtp DIR), and
// the errors of a wrong or partial head, each naming the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "base/bf16.h"
#include "base/error.h"
#include "fixture.h"
#include "model/checkpoint/load.h"
#include "model/checkpoint/safetensors.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = test::fixture_dir("tiny-a");
const std::string kMtpShard = "model-00003-of-00003.safetensors";  // hf-fused: mtp.* alone

// An empty scratch directory, removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    dir_ = fs::temp_directory_path() / ("lily-mtp-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
  }
  ~ScratchDir() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  // Copies every file of a fixture layout here.
  void copy_layout(const std::string& layout) const {
    for (auto& e : fs::directory_iterator(kTiny + "/" + layout)) fs::copy(e.path(), dir_ / e.path().filename());
  }

 private:
  fs::path dir_;
  static inline int counter_ = 0;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A tensor as a safetensors file stores it.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::vector<RawTensor> read_tensors(const std::string& path) {
  SafetensorsFile f(path);
  std::vector<RawTensor> out;
  for (const auto& [name, t] : f.tensors())
    out.push_back(
        {name, dtype_name(t.dtype), t.shape, std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size())});
  return out;
}

void write_tensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');  // as safetensors writers pad: 8-byte aligned data
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(json.size()) >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out << json << data;
}

// A directory holding only the published mtp.* tensors (hf-fused's third shard), edited by `edit`.
void write_mtp_dir(const ScratchDir& d, const std::function<void(std::vector<RawTensor>&)>& edit = {}) {
  std::vector<RawTensor> t = read_tensors(kTiny + "/hf-fused/" + kMtpShard);
  if (edit) edit(t);
  write_tensors(d.file("mtp.safetensors"), t);
}

RawTensor* find(std::vector<RawTensor>& tensors, const std::string& name) {
  for (RawTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> row_of(const Matrix& m, int64_t r) {
  std::vector<float> v(size_t(m.cols));
  m.dequantize_row(r, v.data());
  return v;
}

// Every value of two matrices of the same shape, equal.
void expect_same_matrix(const Matrix& a, const Matrix& b, const std::string& what) {
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  for (int64_t r = 0; r < a.rows; ++r) ASSERT_EQ(row_of(a, r), row_of(b, r)) << what << " row " << r;
}

void expect_same_mtp(const MtpWeights& a, const MtpWeights& b) {
  expect_same_matrix(a.fc, b.fc, "fc");
  EXPECT_EQ(a.pre_fc_norm_embedding, b.pre_fc_norm_embedding);
  EXPECT_EQ(a.pre_fc_norm_hidden, b.pre_fc_norm_hidden);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.layer.input_layernorm, b.layer.input_layernorm);
  EXPECT_EQ(a.layer.attention.q_norm, b.layer.attention.q_norm);
  expect_same_matrix(a.layer.attention.q_proj, b.layer.attention.q_proj, "q_proj");
  expect_same_matrix(a.layer.moe.router, b.layer.moe.router, "router");
  ASSERT_EQ(a.layer.moe.experts.gate_proj.size(), b.layer.moe.experts.gate_proj.size());
  for (size_t e = 0; e < a.layer.moe.experts.gate_proj.size(); ++e) {
    expect_same_matrix(a.layer.moe.experts.gate_proj[e], b.layer.moe.experts.gate_proj[e], "gate_proj");
    expect_same_matrix(a.layer.moe.experts.up_proj[e], b.layer.moe.experts.up_proj[e], "up_proj");
    expect_same_matrix(a.layer.moe.experts.down_proj[e], b.layer.moe.experts.down_proj[e], "down_proj");
  }
}

TEST(MtpLoad, EveryHfLayoutCarriesTheHeadWithItsShapes) {
  for (const char* layout : {"hf-fused", "hf-per-expert"}) {
    SCOPED_TRACE(layout);
    auto w = load_model(kTiny + "/" + layout);
    ASSERT_TRUE(w->mtp.has_value());
    EXPECT_EQ(w->mtp_dir, kTiny + "/" + layout);
    const ModelConfig& c = w->config;
    const MtpWeights& m = *w->mtp;
    EXPECT_EQ(m.fc.rows, c.hidden_size);
    EXPECT_EQ(m.fc.cols, 2 * c.hidden_size);
    EXPECT_EQ(m.layer.kind, LayerKind::full_attention);
    EXPECT_EQ(m.layer.attention.q_proj.rows, 2 * c.num_attention_heads * c.head_dim);
    EXPECT_EQ(int(m.layer.moe.experts.gate_proj.size()), c.num_experts);
    EXPECT_EQ(m.layer.moe.experts.down_proj[0].rows, c.hidden_size);
    EXPECT_GT(w->mtp_weight_bytes(), 0u);
  }
  auto fused = load_model(kTiny + "/hf-fused"), per_expert = load_model(kTiny + "/hf-per-expert");
  expect_same_mtp(*fused->mtp, *per_expert->mtp);
}

// The four MTP norms are zero-centred (spec §6): the gain is 1 + the stored w, in HF layouts.
TEST(MtpLoad, NormsAreZeroCentred) {
  auto w = load_model(kTiny + "/hf-fused");
  Checkpoint ckpt(kTiny + "/hf-fused");
  auto stored = [&](const std::string& name) {
    const TensorView& t = ckpt.get(name);
    std::vector<float> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = to_float(reinterpret_cast<const bf16*>(t.data.data())[i]);
    return v;
  };
  const MtpWeights& m = *w->mtp;
  const std::pair<const char*, const std::vector<float>*> norms[] = {
      {"mtp.pre_fc_norm_embedding.weight", &m.pre_fc_norm_embedding},
      {"mtp.pre_fc_norm_hidden.weight", &m.pre_fc_norm_hidden},
      {"mtp.norm.weight", &m.norm},
      {"mtp.layers.0.input_layernorm.weight", &m.layer.input_layernorm},
      {"mtp.layers.0.post_attention_layernorm.weight", &m.layer.post_attention_layernorm},
      {"mtp.layers.0.self_attn.q_norm.weight", &m.layer.attention.q_norm},
      {"mtp.layers.0.self_attn.k_norm.weight", &m.layer.attention.k_norm}};
  for (const auto& [name, gain] : norms) {
    const std::vector<float> w_stored = stored(name);
    ASSERT_EQ(gain->size(), w_stored.size()) << name;
    for (size_t i = 0; i < w_stored.size(); ++i) ASSERT_EQ((*gain)[i], 1.f + w_stored[i]) << name << "[" << i << "]";
  }
}

TEST(MtpLoad, QuantizeAtLoadQuantizesTheHeadLikeTheLayers) {
  LoadOptions options;
  options.quantize_bits = 4;
  auto q = load_model(kTiny + "/hf-fused", options);
  const MtpWeights& m = *q->mtp;
  EXPECT_EQ(m.fc.bits, 4);
  EXPECT_EQ(m.layer.attention.q_proj.bits, 4);
  EXPECT_EQ(m.layer.attention.o_proj.bits, 4);
  EXPECT_EQ(m.layer.moe.shared_down_proj.bits, 4);
  for (const Matrix& x : m.layer.moe.experts.up_proj) EXPECT_EQ(x.bits, 4);
  EXPECT_EQ(m.layer.moe.router.bits, 8);
  EXPECT_EQ(m.layer.moe.shared_expert_gate.bits, 8);
  // The same values to 4-bit precision.
  auto plain = load_model(kTiny + "/hf-fused");
  const std::vector<float> a = row_of(plain->mtp->fc, 5), b = row_of(m.fc, 5);
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_abs = std::max(max_abs, double(std::fabs(a[i]))), max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  EXPECT_LE(max_diff, max_abs / 7.5) << "a 4-bit code step is at most (max - min) / 15";
}

// The mlx conversions drop mtp.*: --mtp DIR takes the head from the HF checkpoint beside it,
// with HF's norm convention (the gain 1 + w) although the main layout is mlx (stored 1 + w).
TEST(MtpLoad, MtpDirBesideAnMlxModel) {
  auto mlx = load_model(kTiny + "/mlx-q4");
  EXPECT_FALSE(mlx->mtp.has_value());
  LoadOptions options;
  options.mtp_dir = kTiny + "/hf-fused";
  auto with = load_model(kTiny + "/mlx-q4", options);
  ASSERT_TRUE(with->mtp.has_value());
  EXPECT_EQ(with->layout, CheckpointLayout::mlx);
  EXPECT_EQ(with->mtp_dir, kTiny + "/hf-fused");
  auto hf = load_model(kTiny + "/hf-fused");
  expect_same_mtp(*with->mtp, *hf->mtp);

  // A directory of the mtp.* tensors alone (no config.json, no decoder) will do.
  ScratchDir d;
  write_mtp_dir(d);
  options.mtp_dir = d.dir();
  auto from_alone = load_model(kTiny + "/mlx-q4", options);
  ASSERT_TRUE(from_alone->mtp.has_value());
  expect_same_mtp(*from_alone->mtp, *hf->mtp);

  // --quantize q4 then quantizes the head only (the mlx matrices are 4-bit already).
  options.quantize_bits = 4;
  auto q = load_model(kTiny + "/mlx-q4", options);
  EXPECT_EQ(q->mtp->fc.bits, 4);
  EXPECT_EQ(q->mtp->layer.moe.router.bits, 8);
}

// Repacks store the MTP experts stacked (spec §5a): the fused gate_up_proj [E, 2I, H] and
// down_proj [E, H, I] load as the same matrices as the published per-expert tensors.
TEST(MtpLoad, FusedMtpExpertsLoadLikePerExpert) {
  ScratchDir d;
  write_mtp_dir(d, [](std::vector<RawTensor>& t) {
    const std::string p = "mtp.layers.0.mlp.experts.";
    int64_t E = 0;
    while (find(t, p + std::to_string(E) + ".gate_proj.weight")) ++E;
    ASSERT_GT(E, 0);
    const RawTensor& g0 = *find(t, p + "0.gate_proj.weight");
    const RawTensor& d0 = *find(t, p + "0.down_proj.weight");
    RawTensor gate_up{p + "gate_up_proj", g0.dtype, {E, 2 * g0.shape[0], g0.shape[1]}, ""};
    RawTensor down{p + "down_proj", d0.dtype, {E, d0.shape[0], d0.shape[1]}, ""};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      gate_up.bytes += find(t, x + "gate_proj.weight")->bytes + find(t, x + "up_proj.weight")->bytes;
      down.bytes += find(t, x + "down_proj.weight")->bytes;
    }
    std::erase_if(t, [&](const RawTensor& r) { return r.name.starts_with(p); });
    t.push_back(gate_up);
    t.push_back(down);
  });
  LoadOptions options;
  options.mtp_dir = d.dir();
  auto fused = load_model(kTiny + "/mlx-q4", options);
  auto hf = load_model(kTiny + "/hf-fused");
  expect_same_mtp(*fused->mtp, *hf->mtp);
}

TEST(MtpLoad, MissingMtpTensorIsNamed) {
  ScratchDir d;
  write_mtp_dir(d, [](std::vector<RawTensor>& t) {
    std::erase_if(t, [](const RawTensor& r) { return r.name == "mtp.layers.0.self_attn.k_norm.weight"; });
  });
  LoadOptions options;
  options.mtp_dir = d.dir();
  const std::string err = error_of([&] { load_model(kTiny + "/mlx-q4", options); });
  EXPECT_NE(err.find("reading the MTP head from " + d.dir()), std::string::npos) << err;
  EXPECT_NE(err.find("missing tensor 'mtp.layers.0.self_attn.k_norm.weight'"), std::string::npos) << err;

  // A model whose own mtp.* is partial does not load either.
  ScratchDir m;
  m.copy_layout("hf-per-expert");
  std::vector<RawTensor> t = read_tensors(m.file("model.safetensors"));
  std::erase_if(t, [](const RawTensor& r) { return r.name == "mtp.layers.0.mlp.experts.3.up_proj.weight"; });
  write_tensors(m.file("model.safetensors"), t);
  const std::string own = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(own.find("the MTP head (mtp.*)"), std::string::npos) << own;
  EXPECT_NE(own.find("missing tensor 'mtp.layers.0.mlp.experts.3.up_proj.weight'"), std::string::npos) << own;
}

TEST(MtpLoad, MisShapedMtpTensorNamesTensorAndShapes) {
  ScratchDir d;
  write_mtp_dir(d, [](std::vector<RawTensor>& t) {
    RawTensor* fc = find(t, "mtp.fc.weight");  // [H, 2H] stored as [2H, H]: the same bytes
    ASSERT_TRUE(fc);
    std::swap(fc->shape[0], fc->shape[1]);
  });
  LoadOptions options;
  options.mtp_dir = d.dir();
  const std::string err = error_of([&] { load_model(kTiny + "/mlx-q4", options); });
  EXPECT_NE(err.find("tensor 'mtp.fc.weight': expected shape [128, 256], found [256, 128]"), std::string::npos) << err;

  // A head of another model's geometry: its norms are [2 x 128].
  write_mtp_dir(d, [](std::vector<RawTensor>& t) {
    RawTensor* n = find(t, "mtp.norm.weight");
    ASSERT_TRUE(n);
    n->shape = {2, 64};
  });
  const std::string norm = error_of([&] { load_model(kTiny + "/mlx-q4", options); });
  EXPECT_NE(norm.find("tensor 'mtp.norm.weight': expected shape [128], found [2, 64]"), std::string::npos) << norm;
}

TEST(MtpLoad, MtpDirWithoutTheHeadIsRefused) {
  LoadOptions options;
  options.mtp_dir = kTiny + "/mlx-q4";
  const std::string err = error_of([&] { load_model(kTiny + "/mlx-q4", options); });
  EXPECT_NE(err.find(kTiny + "/mlx-q4 holds no mtp.* tensors"), std::string::npos) << err;
}

TEST(MtpLoad, AHeadOfMoreThanOneLayerIsRefused) {
  ScratchDir d;
  write_mtp_dir(d, [](std::vector<RawTensor>& t) {
    RawTensor extra = *find(t, "mtp.layers.0.input_layernorm.weight");
    extra.name = "mtp.layers.1.input_layernorm.weight";
    t.push_back(extra);
  });
  LoadOptions options;
  options.mtp_dir = d.dir();
  const std::string err = error_of([&] { load_model(kTiny + "/mlx-q4", options); });
  EXPECT_NE(err.find("tensor 'mtp.layers.1.input_layernorm.weight': lily runs a one-layer MTP head"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace lily
