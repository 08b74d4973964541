// attention_params.cu: the argument check of the attention core (attention.h): what its kernels
// implement, checked by the decode and prefill launchers and by the kernel plan when the backend
// is built.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/attention/attention_common.cuh"

namespace lily::cuda {

namespace {

// (fmt's compile-time format check does not build here under nvcc: fmt::runtime.)
void check(bool ok, const char* what, int value) {
  if (!ok) ::lily::fail(fmt::runtime("gated attention: {} = {} is not implemented"), what, value);
}

}  // namespace

void check_attention_params(const AttentionParams& p) {
  using namespace attention_detail;
  check(p.T >= 1, "T", p.T);
  check(p.head_dim == kHeadDim, "head_dim (only 256)", p.head_dim);
  check(p.num_kv_heads >= 1 && p.num_heads % p.num_kv_heads == 0, "num_heads (a multiple of nkv)", p.num_heads);
  check(p.num_heads / p.num_kv_heads <= kGroup, "query heads per KV head (at most 8)", p.num_heads / p.num_kv_heads);
  check(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= kHeadDim, "rotary_dim", p.rotary_dim);
  check(p.capacity >= 1, "capacity", p.capacity);
}

}  // namespace lily::cuda
