// decode_kernel.h: the launcher of the persistent decode kernel (decode_kernel.cu). The host side
// that fills StepArgs is persistent_decode.h.
#pragma once

#include "backend/cuda/persistent/step_args.h"

typedef struct CUstream_st* cudaStream_t;

namespace lily::cuda::persistent {

// Zeroes the `counters` step counters, then launches `blocks` blocks, all resident at once (a
// cooperative launch: an error, never a hang, where they do not fit). Stream-ordered; capturable.
void launch_persistent_decode(const StepArgs& args, int blocks, int counters, cudaStream_t stream);

// The most blocks that can be resident at once (one per SM, times the blocks an SM holds).
int persistent_decode_max_blocks();

}  // namespace lily::cuda::persistent
