// cuda_bench.h: measurement only, for `lily bench` and the kernel workbenches: random weights of
// a geometry, a KV cache filled without computing, the device's copy bandwidth, profiler marks,
// and leaving parts out of the decode step. Nothing in the model depends on this folder.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/gpu_weights.h"

namespace lily::cuda::bench {

// Random 4-bit weights of `config`'s geometry (8-bit router and shared-expert gate, as mlx),
// generated on the GPU: uniform codes, small scales and biases, norm gains around 1. mtp: with a
// random MTP head too (its fc halves and a full-attention layer: ~0.45 GB more), for `lily bench
// --synthetic --speculate K`.
std::unique_ptr<GpuWeights> synthetic_weights(const ModelConfig& config, uint64_t seed, bool mtp = false);

// The KV cache of a CUDA sequence filled with random bf16 rows and its length set to `length`,
// nothing computed (decode at a given context depth).
void fake_fill(SequenceState& state, int64_t length);

// Bytes read + written per second by a large device-to-device copy: the practical ceiling a
// decode step is measured against.
double measure_device_copy_bandwidth();
std::string device_name();

// Bracket a region for a profiler started with `--profile-from-start off` (ncu, nsys).
void profiler_start();
void profiler_stop();

// Leaves `parts` (comma separated part_name()s of decode_step.h; "moe" = route,gate_up,down) out
// of every decode step graph captured while it observes (CudaBackend::observe_decode_step): the
// differences of `lily bench` timings give each part's cost inside the graph, launch gaps
// included. The outputs are WRONG. Throws on an unknown part.
std::unique_ptr<DecodeStepObserver> decode_skip(const std::string& parts);

}  // namespace lily::cuda::bench
