// choose_token.cu: the token a chained decode step chooses from its candidates
// (Backend::chain_tokens), on the GPU, so the next step reads it without the host; and the
// penalties on the logits of the tokens the chain generated, before the candidates are selected.
//
//   n      = candidates before the first padding slot (id INT32_MAX), at most count, and
//            before the first at -inf when usable_only (a grammar's mask)
//   chosen = candidates[0].id                                   count == 1 (greedy)
//          = candidates[pick_weighted(w, n, draw, u)].id        else (token_draw.h), with
//            w_j = candidate_weight(value_j, value_0, T), u = draw_uniform(seed, index)
//   *token = chosen (0 when n == 0: the next step reads a valid id), *chosen = chosen or -1;
//            counted (counts[chosen] += 1, appended to seen on its first use) when counting
//   penalize_logits: logits[t] = penalized_logit(logits[t], counts[t]) for t in seen
//   logprobs (asked for): log Z of the raw row from log_partition_partials' parts, then the
//            pick's raw logit - log Z and the raw row's best candidates' - log Z
// Shapes:   candidates [count] Candidate (device; top_candidates' output, descending) ·
//           token, chosen [1] int32 (device) · count <= kMaxTopCandidates.
// Kernels:  choose_token_kernel: one block of kMaxTopCandidates threads: the weights (an exp
//           each) in parallel into shared memory, then thread 0 sums and walks them in candidate
//           order, the host sampler's arithmetic to the bit (exp aside), and counts the pick.
//           penalize_kernel: a thread per token seen (grid-stride). count_kernel: one thread.
//           partition_kernel: kPartitionBlocks blocks, each its share's max then its sum in
//           double (a block reduction each).
// Tested:   tests/cuda/test_top_candidates.cu (CudaChooseToken*: the host draw over random rows,
//           greedy, filters, no candidate; counts and penalties against host loops) and
//           test_cuda_forward.cpp (chains = stepwise tokens, penalties included).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/sampling/next_token.h"

#include <cfloat>
#include <climits>

namespace lily::cuda {

namespace {

__global__ void __launch_bounds__(kMaxTopCandidates)
    choose_token_kernel(const Candidate* candidates, ChooseArgs args, int32_t* token, int32_t* chosen) {
  __shared__ double w[kMaxTopCandidates];
  __shared__ int n;
  if (threadIdx.x == 0) {
    n = 0;
    while (n < args.count && candidates[n].id != INT32_MAX && (!args.usable_only || candidates[n].value > -INFINITY))
      ++n;
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
  const int32_t id = candidates[pick].id;
  *token = *chosen = id;
  const ChooseLogprobs& lp = args.logprobs;
  if (lp.top >= 0) {
    double m = -INFINITY;
    for (int b = 0; b < kPartitionBlocks; ++b) m = fmax(m, lp.partials[2 * b]);
    double total = 0;
    for (int b = 0; b < kPartitionBlocks; ++b)
      if (lp.partials[2 * b] > -INFINITY) total += lp.partials[2 * b + 1] * exp(lp.partials[2 * b] - m);
    const double log_z = m + log(total);
    const bool penalized = lp.raw && args.counts.counts && args.counts.counts[id] > 0;
    *lp.logprob = float(double(penalized ? lp.raw[id] : lp.logits[id]) - log_z);
    for (int j = 0; j < lp.top; ++j) lp.top_out[j] = {float(double(lp.raw_top[j].value) - log_z), lp.raw_top[j].id};
  }
  if (args.counts.counts && args.counts.counts[id]++ == 0) args.counts.seen[(*args.counts.seen_count)++] = id;
}

constexpr int kPartitionThreads = 256;

__global__ void __launch_bounds__(kPartitionThreads) partition_kernel(const float* logits, int n, double* partials) {
  __shared__ float block_max[kPartitionThreads / 32];
  __shared__ double block_sum[kPartitionThreads / 32];
  const int share = (n + kPartitionBlocks - 1) / kPartitionBlocks;
  const int begin = int(blockIdx.x) * share, end = min(n, begin + share);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = -INFINITY;
  for (int i = begin + int(threadIdx.x); i < end; i += kPartitionThreads) m = fmaxf(m, logits[i]);  // NaN ignored
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (lane == 0) block_max[warp] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kPartitionThreads / 32; ++w) m = fmaxf(m, block_max[w]);
  double s = 0;
  if (m > -INFINITY)
    for (int i = begin + int(threadIdx.x); i < end; i += kPartitionThreads) s += exp(double(logits[i]) - double(m));
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  if (lane == 0) block_sum[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kPartitionThreads / 32; ++w) total += block_sum[w];
    partials[2 * blockIdx.x] = double(m);
    partials[2 * blockIdx.x + 1] = total;
  }
}

__global__ void count_kernel(const int32_t* tokens, int n, TokenCounts c) {
  for (int i = 0; i < n; ++i)
    if (c.counts[tokens[i]]++ == 0) c.seen[(*c.seen_count)++] = tokens[i];
}

__global__ void penalize_kernel(float* logits, TokenCounts c, Penalties p, float* raw) {
  const int seen = *c.seen_count;
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < seen; i += int(gridDim.x * blockDim.x)) {
    const int32_t t = c.seen[i];
    if (raw) raw[t] = logits[t];
    logits[t] = penalized_logit(logits[t], c.counts[t], p);
  }
}

}  // namespace

void choose_token(const Candidate* candidates, const ChooseArgs& args, int32_t* token, int32_t* chosen,
                  cudaStream_t stream) {
  LILY_CHECK(args.count >= 1 && args.count <= kMaxTopCandidates, "choose_token: {} candidates (1 to {})", args.count,
             kMaxTopCandidates);
  LILY_CHECK(args.count == 1 || args.draw.temperature > 0, "choose_token: a draw at temperature {}",
             args.draw.temperature);
  LILY_CHECK(!args.counts.counts || (args.counts.seen && args.counts.seen_count),
             "choose_token: counts without their list of tokens seen");
  const ChooseLogprobs& lp = args.logprobs;
  LILY_CHECK(lp.top < 0 || (lp.top <= kMaxChainLogprobs && lp.logits && lp.partials && lp.logprob &&
                            (lp.top == 0 || (lp.raw_top && lp.top_out))),
             "choose_token: {} logprobs without their inputs and outputs (at most {})", lp.top, kMaxChainLogprobs);
  choose_token_kernel<<<1, kMaxTopCandidates, 0, stream>>>(candidates, args, token, chosen);
  CUDA_CHECK_LAUNCH();
}

void count_tokens(const int32_t* tokens, int n, const TokenCounts& counts, cudaStream_t stream) {
  LILY_CHECK(counts.counts && counts.seen && counts.seen_count, "count_tokens: no counts");
  if (n <= 0) return;
  count_kernel<<<1, 1, 0, stream>>>(tokens, n, counts);
  CUDA_CHECK_LAUNCH();
}

void penalize_logits(float* logits, const TokenCounts& counts, const Penalties& p, float* raw, cudaStream_t stream) {
  LILY_CHECK(counts.counts && counts.seen && counts.seen_count, "penalize_logits: no counts");
  // The tokens seen are at most the generation's length: a few blocks cover thousands at once.
  penalize_kernel<<<8, 256, 0, stream>>>(logits, counts, p, raw);
  CUDA_CHECK_LAUNCH();
}

void log_partition_partials(const float* logits, int n, double* partials, cudaStream_t stream) {
  LILY_CHECK(n >= 1, "log_partition_partials: {} logits", n);
  partition_kernel<<<kPartitionBlocks, kPartitionThreads, 0, stream>>>(logits, n, partials);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
