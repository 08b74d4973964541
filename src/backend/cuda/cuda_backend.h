// cuda_backend.h: the CUDA backend (cuda_backend.cpp), and what only it can do: run from
// weights already on the GPU, decode greedily without the host in the loop, say which kernels it
// runs. docs/architecture.md maps its files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace lily {

struct ModelWeights;

namespace cuda {
class GpuWeights;
class DecodeStepObserver;
}  // namespace cuda

class CudaBackend : public Backend {
 public:
  // Greedy decode of `count` tokens after the state's last token `first_token`, entirely on
  // the GPU: each step's arg max is written straight into the next step's input slot and
  // the captured step graph is replayed back to back. Tokens reach the host asynchronously
  // (pinned memory + events). Returns the tokens.
  virtual std::vector<int32_t> decode_greedy(SequenceState& state, int32_t first_token, int count) = 0;
  virtual void synchronize() = 0;
  virtual uint64_t weight_bytes() const = 0;
  // The kernels of a decode step and a prefill pass (kernel_plan.h), as a table for people.
  virtual std::string describe_kernels() const = 0;
  // Measurement only (bench/cuda_bench.h): watches each decode step graph as it is captured, and
  // may edit it. Set it before the first decode step of a sequence (graphs are captured once).
  virtual void observe_decode_step(cuda::DecodeStepObserver* observer) = 0;
};

struct CudaBackendOptions {
  bool pdl = true;               // the decode graph's kernel-to-kernel edges programmatic (PDL)
  int prefill_chunk_tokens = 0;  // tokens per prefill pass: a multiple of 64 up to 16384 (the scratch
                                 // grows ~0.2 MB per token: 8192, ~2 GiB); 0: 8192, or under a cap
                                 // the largest that leaves room for planned_context (memory_plan.h)
  int64_t planned_context = 0;   // the context the caller means to hold (--ctx-size), for that choice
  // Measurement and tests only: the kernel plan's settings changed after it is made, each
  // "NAME=VALUE" (kernel_plan.h's edit_plan; `lily bench --kernel-plan`).
  std::vector<std::string> plan_edits;
  // The device profile the kernel plan decides by (device_profile.h): empty, the card as it is
  // (the Hopper path; any other card is refused: lily runs on the CPU there); "device", the card
  // as it is with the portable kernels allowed; a known profile (sm80, sm86, sm89, sm90, sm120),
  // that card's compute capability, SMs and shared-memory limit on this one (`--device-profile`).
  std::string device_profile;
  // A cap on lily's device memory, bytes (0: none; `--gpu-memory GB`, LILY_GPU_MEMORY_GB): the
  // weights, workspaces and reserve must fit it when the backend is built, and each sequence's KV
  // cache and state with them (memory_plan.h; an error says the longest context that would fit).
  uint64_t gpu_memory_bytes = 0;
  // The defaults, with LILY_PDL=0, LILY_PREFILL_CHUNK=N, LILY_KERNEL_PLAN=NAME=VALUE,... (plan
  // edits), LILY_DEVICE_PROFILE=NAME and LILY_GPU_MEMORY_GB=X from the environment where set (the one place below the
  // CLI that reads it). Throws on a malformed value (a bad plan edit: when the backend is built).
  static CudaBackendOptions from_environment();
};

// The backend over weights uploaded from a loaded model, or over weights already on the GPU.
std::unique_ptr<CudaBackend> make_cuda_backend(
    std::shared_ptr<const ModelWeights> weights,
    const CudaBackendOptions& options = CudaBackendOptions::from_environment());
std::unique_ptr<CudaBackend> make_cuda_backend(
    std::unique_ptr<cuda::GpuWeights> weights,
    const CudaBackendOptions& options = CudaBackendOptions::from_environment());

// Whether the CUDA backend runs on this machine's GPU under `device_profile` (as
// CudaBackendOptions::device_profile): a GPU is visible, and it is a Hopper card with this build's
// sm_90a kernels, or the portable path is asked for. cuda_backend_available() (engine.h) is this
// with LILY_DEVICE_PROFILE.
bool cuda_backend_runs(const std::string& device_profile);

// The device profile the backend would run under (device_profile.h's describe()), for `lily info`
// and `lily bench`; "no CUDA device" without one.
std::string describe_device_profile(const std::string& device_profile);

}  // namespace lily
