// cuda_backend.h: the CUDA backend (see forward.cu), and what only it can do: run from
// weights generated on the GPU, and decode greedily without the host in the loop.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"

namespace lily {

struct ModelWeights;

namespace cuda {
class GpuWeights;
}

// How prefill passes (T > 1) compute their matrix products.
enum class PrefillMath {
  tensor_cores,  // gemm_q4 / grouped MoE: bf16 inputs, fp32 sums (the default, fast)
  fp32,          // the decode kernels over T rows: fp32 inputs and sums (slow; for tests that
                 // separate rounding from errors, and as a reference on real checkpoints)
};

class CudaBackend : public Backend {
 public:
  virtual void set_prefill_math(PrefillMath math) = 0;
  // Greedy decode of `count` tokens after the state's last token `first_token`, entirely on
  // the GPU: each step's arg max is written straight into the next step's input slot and
  // the captured step graph is replayed back to back. Tokens reach the host asynchronously
  // (pinned memory + events) and are passed to on_token in order. Returns the tokens.
  virtual std::vector<int32_t> decode_greedy(SequenceState& state, int32_t first_token, int count) = 0;
  // Fills the state's KV cache and sets its length without computing (for benchmarks of
  // decode at a given context depth).
  virtual void fake_fill(SequenceState& state, int64_t length) = 0;
  virtual void synchronize() = 0;
  virtual uint64_t weight_bytes() const = 0;
};

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights);
// Bytes read + written per second by a large device-to-device copy: the practical ceiling
// a decode step is measured against.
double measure_device_copy_bandwidth();
std::string device_name();
// Bracket a region for a profiler started with `--profile-from-start off` (ncu, nsys): lily
// bench marks the first measurement of each prefill length and decode depth. No-ops otherwise.
void cuda_profiler_start();
void cuda_profiler_stop();
std::unique_ptr<CudaBackend> make_cuda_backend(std::unique_ptr<cuda::GpuWeights> weights);

}  // namespace lily
