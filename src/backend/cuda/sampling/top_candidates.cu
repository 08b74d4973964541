// top_candidates.cu: the k largest logits of one row (sampling candidates), exact and
// deterministic, optionally among the ids a grammar allows.
//
//   out = the first k of { (logits[i], i) : i < n, logits[i] not NaN, allowed == null or bit i
//         of allowed set } in "before" order: a before b iff a.value > b.value, or equal values
//         and a.id < b.id (the host sampler's order).
// Shapes:   logits [n] fp32 (device) · allowed [ceil(n / 64)] uint64 (device; bit i % 64 of
//           word i / 64: token i allowed) or null · out [k] Candidate (device) · k <= kMaxTopCandidates.
// Method:   rounds of one kernel, select_kernel: a block of 1024 threads loads 2048 entries into
//           shared memory, sorts them with a bitonic network (66 compare-exchange stages, one
//           pair per thread per stage) and keeps its first K2 = next_pow2(k). Round 0 reads
//           2048 logits per block (ceil(n / 2048) blocks: 122 at 248K); each later round merges
//           2048 / K2 lists per block, until one list is left (3 rounds at 248K and k = 20).
//           Ties and the padding (NaN, past n, past the last list: value -inf, id INT32_MAX) are
//           ordered by id, so the result does not depend on the block layout.
// Mask:     round 0 treats a disallowed id as it treats NaN (padding, never a candidate), so the
//           selection is over the allowed ids only: fewer than k allowed ids give fewer
//           candidates, none gives only padding. Chosen over a kernel that first writes the
//           disallowed logits to -inf: -inf logits stay candidates here (only NaN is left out),
//           so disallowed ids would fill the slots past the allowed ones; reading the mask in
//           round 0 is one more 31 KB read and no launch.
// Tested:   tests/cuda/test_top_candidates.cu against a host partial sort (ties, NaN, -inf, n at
//           the block edges, k from 1 to 256; masks: all, none, one, random, sparse).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/sampling/next_token.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace lily::cuda {

namespace {

constexpr int kSortSize = 2048;  // entries sorted per block
constexpr int kSortThreads = kSortSize / 2;

__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) { return av > bv || (av == bv && ai < bi); }

// FROM_LOGITS: block b reads logits [2048 b, 2048 b + 2048) of n = count, the ids `allowed`
// leaves out (when not null) as padding; otherwise lists [G b, G b + G) of `count` lists of k2
// entries (G = 2048 / k2). Writes its first `keep` entries to out[b].
template <bool FROM_LOGITS>
__global__ void __launch_bounds__(kSortThreads)
    select_kernel(const float* logits, const uint64_t* allowed, const Candidate* lists, int count, int k2, int keep,
                  Candidate* out) {
  __shared__ float v[kSortSize];
  __shared__ int id[kSortSize];
  const int t = threadIdx.x;
  for (int e = t; e < kSortSize; e += kSortThreads) {
    float value = -INFINITY;
    int index = INT_MAX;
    if constexpr (FROM_LOGITS) {
      const int i = blockIdx.x * kSortSize + e;
      if (i < count) {
        const float x = logits[i];
        const bool ok = allowed == nullptr || ((allowed[i >> 6] >> (i & 63)) & 1) != 0;
        if (ok && !isnan(x)) value = x, index = i;
      }
    } else {
      const int list = blockIdx.x * (kSortSize / k2) + e / k2;
      if (list < count) {
        const Candidate c = lists[size_t(list) * k2 + e % k2];
        value = c.value, index = c.id;
      }
    }
    v[e] = value, id[e] = index;
  }
  __syncthreads();
  for (int size = 2; size <= kSortSize; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      const int i = 2 * t - (t & (stride - 1)), j = i + stride;
      const bool forward = (i & size) == 0;  // this run is sorted in "before" order (else reversed)
      const float vi = v[i], vj = v[j];
      const int ii = id[i], ij = id[j];
      if (forward ? before(vj, ij, vi, ii) : before(vi, ii, vj, ij)) v[i] = vj, v[j] = vi, id[i] = ij, id[j] = ii;
      __syncthreads();
    }
  }
  for (int e = t; e < keep; e += kSortThreads) out[size_t(blockIdx.x) * keep + e] = Candidate{v[e], id[e]};
}

int next_pow2(int k) {
  int p = 1;
  while (p < k) p <<= 1;
  return p;
}

int first_round_blocks(int n) { return (n + kSortSize - 1) / kSortSize; }

}  // namespace

size_t top_candidates_scratch_bytes(int n) {
  return 2 * size_t(first_round_blocks(std::max(n, 1))) * kMaxTopCandidates * sizeof(Candidate);
}

void top_candidates(const float* logits, int n, int k, const uint64_t* allowed, void* scratch, Candidate* out,
                    cudaStream_t stream) {
  LILY_CHECK(n >= 1 && k >= 1 && k <= kMaxTopCandidates, "top_candidates: n = {}, k = {} (1 .. {})", n, k,
             kMaxTopCandidates);
  const int k2 = next_pow2(k);
  Candidate* buffer[2] = {static_cast<Candidate*>(scratch),
                          static_cast<Candidate*>(scratch) + size_t(first_round_blocks(n)) * kMaxTopCandidates};
  int lists = first_round_blocks(n);
  Candidate* dst = lists == 1 ? out : buffer[0];
  select_kernel<true><<<lists, kSortThreads, 0, stream>>>(logits, allowed, nullptr, n, k2, lists == 1 ? k : k2, dst);
  CUDA_CHECK_LAUNCH();
  for (int round = 1; lists > 1; ++round) {
    const int per_block = kSortSize / k2;
    const int blocks = (lists + per_block - 1) / per_block;
    const Candidate* src = dst;
    dst = blocks == 1 ? out : buffer[round % 2];
    select_kernel<false>
        <<<blocks, kSortThreads, 0, stream>>>(nullptr, nullptr, src, lists, k2, blocks == 1 ? k : k2, dst);
    CUDA_CHECK_LAUNCH();
    lists = blocks;
  }
}

}  // namespace lily::cuda
