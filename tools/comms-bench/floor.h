// comms-bench --floor: the memory-bound floor of an op at a size on this
// host. n threads of one process stand in for n ranks, each rank's buffers
// are plain memory of this process, and the threads move exactly the bytes
// the op must move (docs/BENCHMARKS.md#the-floor says what, per op) with
// plain loads and stores and plain reduction loops (plain_reductions.h). No transport,
// no copy through the kernel, no bounce buffer: what is left is what memory
// and one cross-core handoff cost.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "huge_pages.h"

#include "comms/plugin.h"
#include "comms/types.h"

namespace comms::bench {

// The op as comms-bench issues it (runner.cc, Bench::op_of): `count` is the
// per-rank element count of OpDesc; ops whose size is a total (all_gather,
// reduce_scatter, all_to_all, gather, scatter) have buffers of count * n.
struct FloorShape {
  plugin::OpType type = plugin::OpType::kAllReduce;
  int n = 1;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp redop;
  int root = 0;
  bool in_place = false;
  bool huge_pages = false;  // the buffers in huge pages, as the ranks' (--huge-pages)
};

// A barrier for the floor's threads that never spins for long: with at most
// as many threads as cores it spins for 2 us, polls yielding the core up to
// 200 us, then sleeps on a futex; with more threads than cores it sleeps at
// once (a spinner would hold the core the last arriver needs).
class ThreadBarrier {
 public:
  ThreadBarrier(int n, bool spin) : n_(n), spin_(spin) {}
  void arrive_and_wait();

 private:
  const int n_;
  const bool spin_;
  std::atomic<int> arrived_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<uint32_t> generation_{0};
};

// The host's online CPUs (/sys/devices/system/cpu/online), whatever this
// process is bound to.
std::vector<int> online_cpus();

class Floor {
 public:
  // Allocates every rank's input and output (the output is the input in
  // place), 64-byte aligned and zeroed; throws std::invalid_argument for an
  // op the floor does not define (barrier is defined: no bytes).
  explicit Floor(const FloorShape& shape);

  // Rank r's buffers, as that rank would pass them to comms-bench's op
  // (each holds buffer_elements() elements).
  uint8_t* input(int r) { return in_[size_t(r)]; }
  uint8_t* output(int r) { return out_[size_t(r)]; }
  size_t buffer_elements() const { return big_; }

  // Thread t's share (t in [0, n)): its 1/n of every copy and reduction.
  void run_part(int t) const;
  // All n threads, once (tests; the result is what the op would produce).
  void run_once();
  // warmup + iters iterations on n threads: each iteration starts from a
  // barrier, every thread does its part, and ends at a barrier; times[t][i]
  // is thread t's time from leaving the first barrier to leaving the second,
  // in microseconds. When the threads fit the host's online CPUs, thread t
  // runs bound to the t-th (as mpirun binds ranks; rank 0's own binding
  // would put them all on its core) and waits spinning; else they share
  // every online CPU and sleep at the barrier. The caller's binding is
  // restored.
  std::vector<std::vector<double>> time(int warmup, int iters);

 private:
  // One copy (one source, several destinations), reduction (several
  // sources into the first destination, then copied to the others) or
  // swap (in-place all_to_all: two equal ranges exchange contents).
  struct Piece {
    enum class Kind { kCopy, kReduce, kSwap } kind = Kind::kCopy;
    std::vector<const uint8_t*> srcs;
    std::vector<uint8_t*> dsts;
    size_t count = 0;  // elements
  };
  void plan();
  void run_piece(const Piece& p, size_t begin, size_t end) const;

  FloorShape s_;
  size_t es_ = 0, big_ = 0;
  std::vector<std::shared_ptr<uint8_t>> storage_;  // aligned_alloc'd, or a HugePageBuffer's
  std::vector<uint8_t*> in_, out_;
  std::vector<Piece> pieces_;
};

}  // namespace comms::bench
