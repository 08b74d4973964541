// choose_token.cu: the token a chained decode step chooses from its candidates
// (Backend::chain_tokens), on the GPU, so the next step reads it without the host.
//
//   n      = candidates before the first padding slot (id INT32_MAX), at most count
//   chosen = candidates[0].id                                   count == 1 (greedy)
//          = candidates[pick_weighted(w, n, draw, u)].id        else (token_draw.h), with
//            w_j = candidate_weight(value_j, value_0, T), u = draw_uniform(seed, index)
//   *token = chosen (0 when n == 0: the next step reads a valid id), *chosen = chosen or -1
// Shapes:   candidates [count] Candidate (device; top_candidates' output, descending) ·
//           token, chosen [1] int32 (device) · count <= kMaxTopCandidates.
// Kernel:   one block of kMaxTopCandidates threads: the weights (an exp each) in parallel into
//           shared memory, then thread 0 sums and walks them in candidate order, the host
//           sampler's arithmetic to the bit (exp aside).
// Tested:   tests/cuda/test_top_candidates.cu (ChooseToken*: the host draw over random rows,
//           greedy, filters, no candidate) and test_cuda_forward.cpp (chains = stepwise tokens).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/next_token.h"

#include <climits>

namespace lily::cuda {

namespace {

__global__ void __launch_bounds__(kMaxTopCandidates)
    choose_token_kernel(const Candidate* candidates, ChooseArgs args, int32_t* token, int32_t* chosen) {
  __shared__ double w[kMaxTopCandidates];
  __shared__ int n;
  if (threadIdx.x == 0) {
    n = 0;
    while (n < args.count && candidates[n].id != INT32_MAX) ++n;
  }
  __syncthreads();
  const int j = int(threadIdx.x);
  if (args.count > 1 && j < n) w[j] = candidate_weight(candidates[j].value, candidates[0].value, args.draw.temperature);
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (n == 0) {
    *token = 0;
    *chosen = -1;
    return;
  }
  const int pick = args.count == 1 ? 0 : pick_weighted(w, n, args.draw, draw_uniform(args.seed, args.index));
  *token = *chosen = candidates[pick].id;
}

}  // namespace

void choose_token(const Candidate* candidates, const ChooseArgs& args, int32_t* token, int32_t* chosen,
                  cudaStream_t stream) {
  LILY_CHECK(args.count >= 1 && args.count <= kMaxTopCandidates, "choose_token: {} candidates (1 to {})", args.count,
             kMaxTopCandidates);
  LILY_CHECK(args.count == 1 || args.draw.temperature > 0, "choose_token: a draw at temperature {}",
             args.draw.temperature);
  choose_token_kernel<<<1, kMaxTopCandidates, 0, stream>>>(candidates, args, token, chosen);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
