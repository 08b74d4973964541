// deltanet_params.cu: the argument check of the Gated DeltaNet core (deltanet.h): what its kernels
// implement, checked by the decode and prefill launchers and by the kernel plan when the backend
// is built.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/deltanet/deltanet_common.cuh"

namespace lily::cuda {

namespace {

// (fmt's compile-time format check does not build here under nvcc: fmt::runtime.)
void check(bool ok, const char* what, int value) {
  if (!ok) ::lily::fail(fmt::runtime("gated DeltaNet: {} = {} is not implemented"), what, value);
}

}  // namespace

void check_deltanet_params(const DeltaNetParams& p) {
  using namespace deltanet_detail;
  check(p.T >= 1, "T", p.T);
  check(p.head_dim == kHeadDim, "head_dim (only 128)", p.head_dim);
  check(p.conv_kernel == kConvK, "conv_kernel (only 4)", p.conv_kernel);
  check(p.num_key_heads >= 1 && p.num_value_heads % p.num_key_heads == 0, "num_value_heads (a multiple of Hk)",
        p.num_value_heads);
  // The decode cluster holds every block reading one q/k head: 4 slices x (Hv/Hk) <= 8 (portable size).
  check(p.num_value_heads / p.num_key_heads * kSlices <= 8, "Hv/Hk (at most 2)", p.num_value_heads / p.num_key_heads);
}

}  // namespace lily::cuda
