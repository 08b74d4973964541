// next_token.h: the next token from one row of logits on the GPU: its arg max (the greedy decode
// graph, argmax.cu), or the k largest logits for samplers that need only them
// (Backend::forward_candidates, top_candidates.cu), among the ids a grammar allows when it has a
// mask: k (value, id) pairs leave the device instead of the row.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace lily::cuda {

// out[0] = argmax over logits[0 : vocab_limit) (ties to the lowest id, NaN never), written as
// int32: the next decode step reads its token from there.
void argmax(const float* logits, int vocab_limit, int32_t* out, cudaStream_t stream);

constexpr int kMaxTopCandidates = 256;

struct Candidate {
  float value;
  int32_t id;  // INT32_MAX: no candidate (NaN logits, fewer than k ids)
};

// Device scratch that top_candidates needs for a row of n logits, in bytes.
size_t top_candidates_scratch_bytes(int n);

// out[0 .. k) = the k largest of logits[0 .. n) in descending order, ties to the lower id; NaN
// logits are never candidates (their slots, and any past n, hold id INT32_MAX, value -inf).
// allowed: null, or a device bitmask of ceil(n / 64) words (bit i % 64 of word i / 64: token i
// allowed; a grammar's mask); the ids it leaves out are never candidates either, like NaN ones.
// 1 <= k <= kMaxTopCandidates. out: device memory for k candidates. Several launches, no sync.
void top_candidates(const float* logits, int n, int k, const uint64_t* allowed, void* scratch, Candidate* out,
                    cudaStream_t stream);

}  // namespace lily::cuda
