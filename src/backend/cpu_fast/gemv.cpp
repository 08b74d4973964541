// gemv.cpp: which GEMV kernel runs (gemv.h), and the threaded wrappers. The kernels are in
// gemv_scalar.cpp, gemv_avx2.cpp and gemv_avx512.cpp.
#include "backend/cpu_fast/gemv.h"

#include "backend/cpu_fast/gemv_gguf.h"

#include <algorithm>
#include <atomic>

#include "base/error.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

// Products of fewer weights in all run on the calling thread: even a cheap region start and
// the stores of two cores to one output line cost more than such a product (lily-tiny's
// smallest, [4, 256], is 1 K weights).
constexpr int64_t kParallelMinWeights = 16 * 1024;

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

const char* to_string(Dot dot) { return dot == Dot::integer ? "integer" : "fp32"; }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Isa best_isa() {
  static const Isa isa = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return isa;
}

namespace {
std::atomic<Isa>& chosen_isa() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}
}  // namespace

Isa active_isa() { return chosen_isa().load(std::memory_order_relaxed); }

void use_isa(Isa isa) {
  LILY_CHECK(isa_supported(isa), "the {} kernels need instructions this processor lacks", to_string(isa));
  chosen_isa().store(isa, std::memory_order_relaxed);
}

GemvRowsFn gemv_rows_kernel(Isa isa, Dot dot) {
  LILY_CHECK(isa_supported(isa), "the {} GEMV kernel needs instructions this processor lacks", to_string(isa));
  const bool integer = dot == Dot::integer;
  switch (isa) {
    case Isa::scalar: return integer ? detail::gemv_rows_scalar_integer : detail::gemv_rows_scalar_fp32;
    case Isa::avx2: return integer ? detail::gemv_rows_avx2_integer : detail::gemv_rows_avx2_fp32;
    case Isa::avx512: return integer ? detail::gemv_rows_avx512_integer : detail::gemv_rows_avx512_fp32;
  }
  return detail::gemv_rows_scalar_fp32;
}

bool gemv_supported(const Matrix& W) {
  return W.format == MatrixFormat::affine && (W.bits == 4 || W.bits == 8) && W.group_size > 0 &&
         W.group_size % 16 == 0 && W.cols % W.group_size == 0;
}

Dot preferred_dot(const Matrix& W) { return W.group_size == kInputGroup ? Dot::integer : Dot::fp32; }

void gemv(const Matrix& W, const float* x, float* y) {
  if (W.format == MatrixFormat::gguf) {  // GGUF blocks: gemv_gguf.h
    QuantizedInput in;
    prepare_input(W, x, in);
    return gguf_gemv_rows(W, in, 0, W.rows, y);
  }
  if (!gemv_supported(W)) return detail::gemv_rows_dequantizing(W, x, 0, W.rows, y);
  gemv(W, x, y, active_isa(), preferred_dot(W));
}

void gemv(const Matrix& W, const float* x, float* y, Isa isa, Dot dot) {
  LILY_CHECK(gemv_supported(W), "gemv: the kernels do not take {}", W.describe());
  LILY_CHECK(dot == Dot::fp32 || W.group_size == kInputGroup, "gemv: the integer kernels take groups of {}, not {}",
             kInputGroup, W.group_size);
  QuantizedInput in;
  quantize_input(x, W.cols, W.group_size, in);
  gemv_rows_kernel(isa, dot)(W, in, 0, W.rows, y);
}

void prepare_input(const Matrix& W, const float* x, QuantizedInput& in) {
  reset_input_for(W, x, in);
  if (in.group_size > 0) quantize_groups(in, 0, W.cols / in.group_size);
}

void reset_input_for(const Matrix& W, const float* x, QuantizedInput& in) {
  if (gguf_integer_supported(W)) return reset_input(x, W.cols, kInputGroup, in);  // gemv_gguf.h
  if (gemv_supported(W)) return reset_input(x, W.cols, W.group_size, in);
  in.x = x, in.cols = W.cols, in.group_size = 0, in.quantized = false;
}

void gemv_rows(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.format == MatrixFormat::gguf) return gguf_gemv_rows(W, x, r0, r1, y);  // gemv_gguf.h
  if (plain_gemv_supported(W)) return plain_gemv_rows(W, x.x, r0, r1, y);      // gemv_gguf.h
  if (gemv_supported(W) && x.group_size == W.group_size)
    gemv_rows_kernel(active_isa(), preferred_dot(W))(W, x, r0, r1, y);
  else detail::gemv_rows_dequantizing(W, x.x, r0, r1, y);
}

void gemv_share(std::span<const PreparedGemv> products, const ThreadTeam::Member& member) {
  int64_t total = 0;
  for (const PreparedGemv& p : products) total += p.W->rows * p.W->cols;
  // This member's weights [lo, hi); a row is the member's whose first weight falls there.
  const auto [lo, hi] = member.share(total);
  int64_t offset = 0;
  for (const PreparedGemv& p : products) {
    const int64_t cols = std::max<int64_t>(1, p.W->cols), rows = p.W->rows;
    auto first_row_from = [&](int64_t w) { return std::clamp<int64_t>((w - offset + cols - 1) / cols, 0, rows); };
    const int64_t r0 = first_row_from(lo), r1 = first_row_from(hi);
    if (r0 < r1) gemv_rows(*p.W, *p.x, r0, r1, p.y);
    offset += rows * p.W->cols;
  }
}

void gemv_parallel(std::span<const GemvTask> tasks) {
  GemvScratch scratch;
  gemv_parallel(tasks, scratch);
}

void gemv_parallel(std::span<const GemvTask> tasks, GemvScratch& scratch) {
  std::vector<QuantizedInput>& inputs = scratch.inputs;  // one per distinct (x, cols, group size)
  std::vector<size_t>& input_of = scratch.input_of;
  std::vector<PreparedGemv>& products = scratch.products;
  auto fits = [](const QuantizedInput& in, const GemvTask& t) {
    return in.x == t.x && in.cols == t.W->cols && (!gemv_supported(*t.W) || in.group_size == t.W->group_size);
  };
  input_of.clear();
  size_t n_inputs = 0;
  int64_t weights = 0;
  for (const GemvTask& t : tasks) {
    size_t j = 0;
    while (j < n_inputs && !fits(inputs[j], t)) ++j;
    if (j == n_inputs) {
      if (inputs.size() <= n_inputs) inputs.emplace_back();
      prepare_input(*t.W, t.x, inputs[j]);
      ++n_inputs;
    }
    input_of.push_back(j);
    weights += t.W->rows * t.W->cols;
  }
  products.clear();  // pointers into `inputs` once it has stopped growing
  for (size_t i = 0; i < tasks.size(); ++i) products.push_back({tasks[i].W, &inputs[input_of[i]], tasks[i].y});
  const std::span<const PreparedGemv> all = products;
  if (weights < kParallelMinWeights) {
    for (const PreparedGemv& p : all) gemv_rows(*p.W, *p.x, 0, p.W->rows, p.y);
    return;
  }
  cpu_team().run([all](ThreadTeam::Member& m) { gemv_share(all, m); });
}

}  // namespace lily::cpu_fast
