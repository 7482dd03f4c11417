// Event timer: warm-up, then the median of many launches, each bracketed by CUDA events.
// Between launches the L2 is flushed (a read of twice its size), unless the caller rotates
// over enough input sets that nothing it reads can still sit in L2. Or back to back
// (time_back_to_back): batches of launches with nothing between them, as a decoder's stream runs
// its kernels, events around each batch; the caller rotates the input sets. Or in a CUDA graph
// (time_in_graph): a batch captured once, the graph launched again and again.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "lkw/buffer.h"
#include "lkw/check.h"

namespace lkw {

namespace detail {
// Reads every word and never writes (the condition is never true for data we filled with 0x01):
// afterwards the L2 holds clean lines of this buffer, nothing dirty to write back during the
// next kernel.
template <int kUnused = 0>
__global__ void flush_l2_kernel(const ::int4* buf, int64_t n, int* sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    ::int4 v = buf[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}
}  // namespace detail

struct TimerOptions {
  int warmup = 5;
  int iters = 50;
  bool flush_l2 = true;
};

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int iters = 0;
};

inline size_t l2_bytes() {
  int dev = 0, l2 = 0;
  LKW_CUDA_CHECK(cudaGetDevice(&dev));
  LKW_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  return static_cast<size_t>(l2);
}

class Timer {
 public:
  explicit Timer(cudaStream_t stream = nullptr) : stream_(stream) {
    flush_ = DeviceBuffer(2 * l2_bytes());
    LKW_CUDA_CHECK(cudaMemset(flush_.data(), 0x01, flush_.bytes()));
    sink_ = DeviceBuffer(sizeof(int));
    // The memset leaves up to an L2 of the buffer's tail dirty, and one read pass ends by hitting
    // exactly those lines. A second pass evicts them (written back now), so no later kernel
    // pays for the buffer's own write-back, which ncu would count as that kernel's DRAM bytes.
    flush();
    flush();
    LKW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // launch(i) runs the i-th launch (i picks the input set when rotating); it returns a Status.
  Timing time(const std::function<Status(int)>& launch, const TimerOptions& opt) {
    for (int i = 0; i < opt.warmup; ++i) LKW_STATUS_CHECK(launch(i));
    std::vector<cudaEvent_t> start(opt.iters), stop(opt.iters);
    for (int i = 0; i < opt.iters; ++i) {
      LKW_CUDA_CHECK(cudaEventCreate(&start[i]));
      LKW_CUDA_CHECK(cudaEventCreate(&stop[i]));
    }
    for (int i = 0; i < opt.iters; ++i) {
      if (opt.flush_l2) flush();
      LKW_CUDA_CHECK(cudaEventRecord(start[i], stream_));
      LKW_STATUS_CHECK(launch(opt.warmup + i));
      LKW_CUDA_CHECK(cudaEventRecord(stop[i], stream_));
    }
    LKW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> us(opt.iters);
    for (int i = 0; i < opt.iters; ++i) {
      float ms = 0;
      LKW_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
      us[i] = 1000.0 * ms;
      cudaEventDestroy(start[i]);
      cudaEventDestroy(stop[i]);
    }
    return summarize(us);
  }

  // Back to back: `batch` launches queued with nothing between them (launch(i) picks input set
  // i), two events around the batch; Timing holds the per-launch time (batch time / batch) of
  // `iters` batches after `warmup` launches. Where a launch lets the next one start early
  // (programmatic dependent launch), the overlap counts, as it would in a decoder's stream.
  Timing time_back_to_back(const std::function<Status(int)>& launch, int warmup, int iters, int batch) {
    int next = 0;
    for (int i = 0; i < warmup; ++i) LKW_STATUS_CHECK(launch(next++));
    std::vector<cudaEvent_t> start(iters), stop(iters);
    for (int i = 0; i < iters; ++i) {
      LKW_CUDA_CHECK(cudaEventCreate(&start[i]));
      LKW_CUDA_CHECK(cudaEventCreate(&stop[i]));
    }
    for (int i = 0; i < iters; ++i) {
      LKW_CUDA_CHECK(cudaEventRecord(start[i], stream_));
      for (int j = 0; j < batch; ++j) LKW_STATUS_CHECK(launch(next++));
      LKW_CUDA_CHECK(cudaEventRecord(stop[i], stream_));
    }
    LKW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> us(iters);
    for (int i = 0; i < iters; ++i) {
      float ms = 0;
      LKW_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
      us[i] = 1000.0 * ms / batch;
      cudaEventDestroy(start[i]);
      cudaEventDestroy(stop[i]);
    }
    return summarize(us);
  }

  // In a CUDA graph, as a decoder that captures its step runs: `batch` launches (launch(i, s)
  // picks input set i and launches on stream s) captured once into a graph, the graph launched
  // `iters` times with events around each, on a stream of its own; Timing holds the per-launch
  // time of each graph launch. `warmup` launches run on that stream before the capture (a version
  // sets its attributes and workspaces there, outside the graph), and the graph runs twice before
  // it is timed. Dependent launches keep their programmatic edges as graph edges.
  Timing time_in_graph(const std::function<Status(int, cudaStream_t)>& launch, int warmup, int iters,
                       int batch) {
    cudaStream_t s = nullptr;
    LKW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::vector<cudaEvent_t> start(iters), stop(iters);
    auto release = [&] {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      for (int i = 0; i < iters; ++i) {
        if (start[i]) cudaEventDestroy(start[i]);
        if (stop[i]) cudaEventDestroy(stop[i]);
      }
      cudaStreamDestroy(s);
    };
    std::vector<double> us(iters);
    try {
      for (int i = 0; i < warmup; ++i) LKW_STATUS_CHECK(launch(i, s));
      LKW_CUDA_CHECK(cudaStreamSynchronize(s));
      LKW_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        for (int i = 0; i < batch; ++i) LKW_STATUS_CHECK(launch(i, s));
      } catch (...) {
        cudaStreamEndCapture(s, &graph);  // leave the stream usable; the partial graph is dropped
        throw;
      }
      LKW_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      LKW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      LKW_CUDA_CHECK(cudaGraphUpload(exec, s));
      for (int i = 0; i < 2; ++i) LKW_CUDA_CHECK(cudaGraphLaunch(exec, s));
      for (int i = 0; i < iters; ++i) {
        LKW_CUDA_CHECK(cudaEventCreate(&start[i]));
        LKW_CUDA_CHECK(cudaEventCreate(&stop[i]));
      }
      for (int i = 0; i < iters; ++i) {
        LKW_CUDA_CHECK(cudaEventRecord(start[i], s));
        LKW_CUDA_CHECK(cudaGraphLaunch(exec, s));
        LKW_CUDA_CHECK(cudaEventRecord(stop[i], s));
      }
      LKW_CUDA_CHECK(cudaStreamSynchronize(s));
      for (int i = 0; i < iters; ++i) {
        float ms = 0;
        LKW_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
        us[i] = 1000.0 * ms / batch;
      }
    } catch (...) {
      release();
      throw;
    }
    release();
    return summarize(us);
  }

  void flush() {
    int64_t n = static_cast<int64_t>(flush_.bytes() / sizeof(::int4));
    detail::flush_l2_kernel<<<1024, 256, 0, stream_>>>(static_cast<const ::int4*>(flush_.data()), n,
                                                        static_cast<int*>(sink_.data()));
    LKW_CUDA_CHECK(cudaGetLastError());
  }

 private:
  static Timing summarize(std::vector<double> us) {
    std::sort(us.begin(), us.end());
    const int n = static_cast<int>(us.size());
    Timing t;
    t.iters = n;
    t.min_us = us.front();
    t.max_us = us.back();
    t.median_us = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
    return t;
  }

  cudaStream_t stream_;
  DeviceBuffer flush_, sink_;
};

}  // namespace lkw
