// grow_only_scratch.cu: see grow_only_scratch.h.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/grow_only_scratch.h"

namespace lily::cuda {

void* GrowOnlyScratch::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= size_) return buffer_;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  LILY_CHECK(capturing == cudaStreamCaptureStatusNone, "{}: run once before graph capture (scratch of {} bytes)",
             owner_, bytes);
  if (buffer_) CUDA_CHECK(cudaFreeAsync(buffer_, stream));
  CUDA_CHECK(cudaMallocAsync(&buffer_, bytes, stream));
  if (zero_fill_) CUDA_CHECK(cudaMemsetAsync(buffer_, 0, bytes, stream));
  size_ = bytes;
  return buffer_;
}

}  // namespace lily::cuda
