// cpu_fast.h: the fast CPU backend (`--backend cpu`): the reference's forward with every
// projection and expert of a decode step on the GEMV kernels of gemv.h (the weights read as
// stored, SIMD chosen at run time), the MoE expert-parallel over the thread pool, and the
// DeltaNet recurrent step in two passes over the state. Prefill (more than one token) runs the
// layers of prefill.h on the same caches: every projection a GEMM over the block's tokens
// (gemm.h), the experts grouped by the tokens routed to them. The fp32 reference stays the
// oracle (`--backend reference`, make_cpu_backend).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace lily {

std::unique_ptr<Backend> make_cpu_fast_backend(std::shared_ptr<const ModelWeights> weights);

}  // namespace lily
