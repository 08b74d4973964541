// cpu_clones.h: LILY_CPU_CLONES compiles a hot portable loop once per x86-64 level: the
// baseline, x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512); the dynamic loader picks the widest
// clone the processor runs (an ifunc). The default build is for any x86-64 (LILY_NATIVE off),
// so the loops the compiler vectorizes keep their speed where the processor has wide vectors,
// and one binary runs everywhere. Hand-written SIMD kernels use target attributes instead
// (backend/cpu_fast/gemv_avx2.cpp, gemv_avx512.cpp).
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && !defined(LILY_NATIVE_BUILD)
#define LILY_CPU_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LILY_CPU_CLONES  // -march=native builds (and other targets) compile the loop once
#endif
