// arch.cuh: which instructions the device code being compiled may use. One build holds the
// kernels for every card lily supports (CMAKE_CUDA_ARCHITECTURES, docs/gpus.md); the Hopper-only
// instructions are compiled only where they exist, and a kernel with no other form compiles to a
// trap elsewhere (the kernel plan never launches it there: device_profile.h says what each
// profile may run).
//   LILY_SM90_CODE   sm_90 and later: griddepcontrol (PDL), thread-block clusters and distributed
//                    shared memory, bulk copies completing on an mbarrier (cp.async.bulk,
//                    mbarrier expect_tx / try_wait, fence.proxy.async)
//   LILY_SM90A_CODE  sm_90a only: wgmma (gemm_w4_wgmma.cu)
// Both are 0 in the host pass and for sm_80 / 86 / 89; the portable kernels use what sm_80 has
// (mma.sync, ldmatrix, cp.async, redux.sync).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LILY_SM90_CODE 1
#else
#define LILY_SM90_CODE 0
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LILY_SM90A_CODE 1
#else
#define LILY_SM90A_CODE 0
#endif
