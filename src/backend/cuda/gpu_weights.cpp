// gpu_weights.cpp: moving a loaded model into GPU memory.
//
// Layout on the GPU: see gpu_weights.h. Uploading quantizes plain matrices on the host
// (parallel over rows) with the same affine scheme as mlx, so an HF bf16 checkpoint runs
// from 4-bit weights like an mlx one.
#include <cstdio>
#include <cstring>

#include "backend/cuda/gpu_weights.h"

#include <algorithm>

#include "backend/cuda/common/cuda_check.h"
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
    QMatrix q = allocate(int(ms.size()), int(first.rows), int(first.cols), first.quantized() ? first.bits : plain_bits,
                         first.quantized() ? first.group_size : 64);
    for (size_t i = 0; i < ms.size(); ++i) {
      LILY_CHECK(ms[i]->rows == first.rows && ms[i]->cols == first.cols, "expert matrices differ in shape");
      write(*ms[i], q, int64_t(i) * first.rows);
    }
    return q;
  }

  // Matrices of one input width concatenated by rows into one (returned), with parts[i] set
  // to the view of ms[i]'s rows. Where their quantizations differ, each is uploaded on its
  // own and the returned matrix has no rows.
  QMatrix concatenated(const std::vector<const Matrix*>& ms, int plain_bits, const std::vector<QMatrix*>& parts) {
    auto bits_of = [&](const Matrix* m) { return m->quantized() ? m->bits : plain_bits; };
    auto group_of = [&](const Matrix* m) { return m->quantized() ? int(m->group_size) : 64; };
    bool same = true;
    int rows = 0;
    for (const Matrix* m : ms) {
      same = same && m->cols == ms[0]->cols && bits_of(m) == bits_of(ms[0]) && group_of(m) == group_of(ms[0]);
      rows += int(m->rows);
    }
    if (!same) {
      for (size_t i = 0; i < ms.size(); ++i) *parts[i] = matrix(*ms[i], plain_bits);
      return QMatrix{};
    }
    QMatrix q = allocate(1, rows, int(ms[0]->cols), bits_of(ms[0]), group_of(ms[0]));
    int row = 0;
    for (size_t i = 0; i < ms.size(); ++i) {
      write(*ms[i], q, row);
      *parts[i] = q.row_range(row, int(ms[i]->rows));
      row += int(ms[i]->rows);
    }
    return q;
  }

  QMatrix matrix(const Matrix& m, int plain_bits = 4) { return matrices({&m}, plain_bits); }

  // Columns [c0, c0 + n) of m as a matrix of their own, 4-bit where m is plain. An affine
  // matrix's codes, scales and biases are copied as they are (c0 and n whole groups), not
  // quantized again.
  QMatrix columns(const Matrix& m, int64_t c0, int64_t n) {
    LILY_CHECK(c0 >= 0 && n > 0 && c0 + n <= m.cols, "columns [{}, {}) of a matrix of {}", c0, c0 + n, m.cols);
    Matrix part;
    part.rows = m.rows, part.cols = n;
    std::vector<uint32_t> codes;
    std::vector<bf16> scales, biases;
    std::vector<float> values;
    if (m.quantized()) {
      LILY_CHECK(c0 % m.group_size == 0 && n % m.group_size == 0 && (c0 * m.bits) % 32 == 0,
                 "columns [{}, {}) of a {}-bit group-{} matrix split a group", c0, c0 + n, m.bits, m.group_size);
      const int64_t words = m.cols * m.bits / 32, w0 = c0 * m.bits / 32, wn = n * m.bits / 32;
      const int64_t groups = m.cols / m.group_size, g0 = c0 / m.group_size, gn = n / m.group_size;
      const auto* src = static_cast<const uint32_t*>(m.data);
      for (int64_t r = 0; r < m.rows; ++r) {
        codes.insert(codes.end(), src + r * words + w0, src + r * words + w0 + wn);
        scales.insert(scales.end(), m.scales + r * groups + g0, m.scales + r * groups + g0 + gn);
        biases.insert(biases.end(), m.biases + r * groups + g0, m.biases + r * groups + g0 + gn);
      }
      part.format = MatrixFormat::affine, part.bits = m.bits, part.group_size = m.group_size;
      part.data = codes.data(), part.scales = scales.data(), part.biases = biases.data();
    } else {
      std::vector<float> row(size_t(m.cols));
      values.resize(size_t(m.rows * n));
      for (int64_t r = 0; r < m.rows; ++r) {
        m.dequantize_row(r, row.data());
        std::copy(row.begin() + c0, row.begin() + c0 + n, values.begin() + r * n);
      }
      part.format = MatrixFormat::f32, part.data = values.data();
    }
    return matrix(part);  // copied to the device before the host buffers go
  }

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
  QMatrix allocate(int batch, int rows, int cols, int bits, int group) {
    QMatrix q;
    q.batch = batch, q.rows = rows, q.cols = cols, q.bits = bits, q.group_size = group;
    const uint64_t all_rows = uint64_t(batch) * rows;
    q.codes = static_cast<const uint32_t*>(out_.allocate(all_rows * cols * bits / 8));
    q.scales = static_cast<const bf16*>(out_.allocate(all_rows * (cols / group) * 2));
    q.biases = static_cast<const bf16*>(out_.allocate(all_rows * (cols / group) * 2));
    return q;
  }

  // m into rows [first_row, first_row + m.rows) of the stack q (flattened over its batch),
  // quantized to q.bits if m is plain.
  static void write(const Matrix& m, const QMatrix& q, int64_t first_row) {
    const uint64_t code_bytes = uint64_t(m.rows) * m.cols * q.bits / 8;
    const uint64_t scale_bytes = uint64_t(m.rows) * (m.cols / q.group_size) * 2;
    auto* codes = reinterpret_cast<uint8_t*>(const_cast<uint32_t*>(q.codes)) + first_row * q.cols * q.bits / 8;
    auto* scales = reinterpret_cast<uint8_t*>(const_cast<bf16*>(q.scales)) + first_row * q.groups_per_row() * 2;
    auto* biases = reinterpret_cast<uint8_t*>(const_cast<bf16*>(q.biases)) + first_row * q.groups_per_row() * 2;
    if (m.quantized()) {
      LILY_CHECK(m.bits == q.bits && m.group_size == q.group_size, "matrices of one stack differ in quantization");
      CUDA_CHECK(cudaMemcpy(codes, m.data, code_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(scales, m.scales, scale_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(biases, m.biases, scale_bytes, cudaMemcpyHostToDevice));
    } else {
      QuantizedMatrix qm = quantize_rows(m, q.bits);
      CUDA_CHECK(cudaMemcpy(codes, qm.codes.data(), code_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(scales, qm.scales.data(), scale_bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(biases, qm.biases.data(), scale_bytes, cudaMemcpyHostToDevice));
    }
  }

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

namespace {

GpuLayer upload_layer(WeightUploader& up, const LayerWeights& l) {
  GpuLayer gl;
  gl.kind = l.kind;
  gl.input_layernorm = up.vector(l.input_layernorm);
  gl.post_attention_layernorm = up.vector(l.post_attention_layernorm);
  if (l.kind == LayerKind::full_attention) {
    const AttentionWeights& a = l.attention;
    GpuAttention& ga = gl.attention;
    ga.qkv_proj = up.concatenated({&a.q_proj, &a.k_proj, &a.v_proj}, 4, {&ga.q_proj, &ga.k_proj, &ga.v_proj});
    ga.o_proj = up.matrix(a.o_proj);
    ga.q_norm = up.vector(a.q_norm);
    ga.k_norm = up.vector(a.k_norm);
  } else {
    const DeltaNetWeights& d = l.deltanet;
    GpuDeltaNet& gd = gl.deltanet;
    gd.in_proj_all = up.concatenated({&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a}, 4,
                                     {&gd.in_proj_qkv, &gd.in_proj_z, &gd.in_proj_b, &gd.in_proj_a});
    gd.out_proj = up.matrix(d.out_proj);
    gd.conv1d = up.vector(d.conv1d);
    gd.A_log = up.vector(d.A_log);
    gd.dt_bias = up.vector(d.dt_bias);
    gd.norm = up.vector(d.norm);
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
  return gl;
}

GpuMtp upload_mtp(WeightUploader& up, const MtpWeights& m, int64_t H) {
  LILY_CHECK(m.fc.rows == H && m.fc.cols == 2 * H, "mtp.fc is [{}, {}]; the head needs [{}, {}]", m.fc.rows, m.fc.cols,
             H, 2 * H);
  LILY_CHECK(m.layer.kind == LayerKind::full_attention, "mtp.layers.0 must be a full-attention layer");
  GpuMtp g;
  g.fc_embedding = up.columns(m.fc, 0, H);
  g.fc_hidden = up.columns(m.fc, H, H);
  g.pre_fc_norm_embedding = up.vector(m.pre_fc_norm_embedding);
  g.pre_fc_norm_hidden = up.vector(m.pre_fc_norm_hidden);
  g.norm = up.vector(m.norm);
  g.layer = upload_layer(up, m.layer);
  return g;
}

}  // namespace

std::unique_ptr<GpuWeights> GpuWeights::upload(const ModelWeights& w) {
  auto g = std::make_unique<GpuWeights>(w.config);
  WeightUploader up(*g);
  g->embed_tokens = up.matrix(w.embed_tokens);
  g->lm_head = w.lm_head.data == w.embed_tokens.data ? g->embed_tokens : up.matrix(w.lm_head);
  g->final_norm = up.vector(w.final_norm);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    g->layers.push_back(upload_layer(up, w.layers[i]));
    std::fprintf(stderr, "\ruploading weights to the GPU: layer %zu/%zu", i + 1, w.layers.size());
  }
  if (w.mtp) g->mtp = upload_mtp(up, *w.mtp, w.config.hidden_size);
  std::fprintf(stderr, "\n");
  return g;
}

}  // namespace lily::cuda
