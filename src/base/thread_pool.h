// thread_pool.h: a fixed pool of worker threads and a blocking parallel_for.
//
// The CPU backend splits loops over rows, heads or experts with parallel_for. Work items
// must be independent; the call returns when all of them are done.
#pragma once

#include <cstdint>
#include <functional>

namespace lily {

// Number of threads the CPU backend uses (LILY_THREADS, else the hardware concurrency).
int cpu_thread_count();

// Calls fn(begin, end) on disjoint sub-ranges covering [0, n), in parallel. Chunks are at
// least `min_chunk` items. Exceptions thrown by fn are rethrown in the caller.
void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lily
