// core_params.cu: the argument checks of the attention and DeltaNet cores (attention.h,
// deltanet.h): what their kernels implement, checked by both paths' launchers and by the kernel
// plan when the backend is built.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/attention_common.cuh"
#include "backend/cuda/common/deltanet_common.cuh"

namespace lily::cuda {

namespace {

// (fmt's compile-time format check does not build here under nvcc: fmt::runtime.)
void check(bool ok, const char* core, const char* what, int value) {
  if (!ok) ::lily::fail(fmt::runtime("{}: {} = {} is not implemented"), core, what, value);
}

}  // namespace

void check_attention_params(const AttentionParams& p) {
  using namespace attention_detail;
  const char* core = "gated attention";
  check(p.T >= 1, core, "T", p.T);
  check(p.head_dim == kHeadDim, core, "head_dim (only 256)", p.head_dim);
  check(p.num_kv_heads >= 1 && p.num_heads % p.num_kv_heads == 0, core, "num_heads (a multiple of nkv)", p.num_heads);
  check(p.num_heads / p.num_kv_heads <= kGroup, core, "query heads per KV head (at most 8)",
        p.num_heads / p.num_kv_heads);
  check(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= kHeadDim, core, "rotary_dim", p.rotary_dim);
  check(p.capacity >= 1, core, "capacity", p.capacity);
}

void check_deltanet_params(const DeltaNetParams& p) {
  using namespace deltanet_detail;
  const char* core = "gated DeltaNet";
  check(p.T >= 1, core, "T", p.T);
  check(p.head_dim == kHeadDim, core, "head_dim (only 128)", p.head_dim);
  check(p.conv_kernel == kConvK, core, "conv_kernel (only 4)", p.conv_kernel);
  check(p.num_key_heads >= 1 && p.num_value_heads % p.num_key_heads == 0, core, "num_value_heads (a multiple of Hk)",
        p.num_value_heads);
  // The decode cluster holds every block reading one q/k head: 4 slices x (Hv/Hk) <= 8 (portable size).
  check(p.num_value_heads / p.num_key_heads * kSlices <= 8, core, "Hv/Hk (at most 2)",
        p.num_value_heads / p.num_key_heads);
}

}  // namespace lily::cuda
