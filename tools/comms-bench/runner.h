// comms-bench's measurement of one op at one size: buffers, the op through
// comms or its baseline (baseline.h), timing over ranks, and the result check.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend_buffer.h"
#include "backend_paths.h"
#include "baseline.h"
#include "bench_cuda.h"
#include "huge_pages.h"
#include "comms/comms.h"
#include "options.h"

namespace comms::bench {

struct Row {
  std::string op, dtype, redop, placement;
  size_t bytes = 0, count = 0;
  double mean_us = 0, p50_us = 0, p99_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
  bool raw = false;
  std::string algorithm;
  // --overhead: the same op through the baseline, timed in alternation
  // with it.
  double raw_mean_us = 0, raw_p50_us = 0;
  // --floor: the p50 of the same bytes moved by threads of one process
  // (floor.h), p50_us / floor_us, and the floor's p99 (the machine's own
  // tail, beside the op's).
  double floor_us = 0, floor_ratio = 0, floor_p99_us = 0;
};

// Where the op's CPU buffers live: plain heap memory, the comm's allocator
// registered with the comm (-R 1), or huge pages (--huge-pages).
enum class HostMemory { kPlain, kBackend, kHugePages };

class Bench {
 public:
  // `cuda`: buffers on its device and ops on its stream; else CPU buffers.
  // `baseline`: what --raw-* and --overhead time (null: comms alone).
  // `paths`: the algorithm column of comms' rows (the comm's backend's own
  // report). `root`: of broadcast, reduce, gather and scatter (-r);
  // `average`: how an iteration's times on the ranks combine (-a).
  Bench(std::shared_ptr<Comm> comm, const OpInfo& op, DataType dtype, ReduceOp redop, int root, Average average,
        int iters, int warmup, bool check, Baseline* baseline, CudaBench* cuda, BackendPaths paths, bool overhead,
        bool graph = false, bool floor = false, HostMemory memory = HostMemory::kPlain)
      : comm_(std::move(comm)), op_(op), dtype_(dtype), redop_(redop), root_(root), average_(average),
        iters_(iters), warmup_(warmup), check_(check), baseline_(baseline), cuda_(cuda), paths_(std::move(paths)),
        overhead_(overhead), graph_(graph), floor_(floor), memory_(memory) {}

  Row run(size_t bytes, bool in_place);

 private:
  // One row's buffers and op arguments.
  struct Shape {
    int n = 1, rank = 0, peer = 0;
    size_t es = 0, count = 0, big = 0;
    bool in_place = false;
    uint8_t* in_base = nullptr;
    uint8_t* out_base = nullptr;
    Device device;
    OpOptions opts;
  };
  Shape prepare(size_t bytes, bool in_place);
  // The row's op, as both comms and the baseline get it.
  BenchOp op_of(const Shape& s) const;
  void fill(const Shape& s);
  void issue(const Shape& s, bool use_raw);
  // One op until it is done, in microseconds.
  double timed(const Shape& s, bool use_raw);
  // The checked run(s) before timing: the wrong elements over all ranks.
  int64_t check(const Shape& s, bool primary_raw);
  Row summarize(const Shape& s, std::vector<double>& times, std::vector<double>& raw_times, int64_t wrong,
                bool primary_raw) const;
  // --floor: rank 0 times the floor with the row's iterations while the
  // other ranks sleep on the store (no rank's poll steals a core from the
  // floor's threads); every rank returns its p50 and p99.
  std::pair<double, double> floor_p50_p99(const Shape& s);
  // -R 1: what the backend counted on its zero-copy path (backend_paths.h).
  std::optional<int64_t> zero_copy_ops() const;
  // Combines each iteration's time over the ranks as -a says.
  void combine_over_ranks(std::vector<double>& times) const;
  // Checks the output against the closed form for the values fill() wrote.
  int64_t count_wrong(size_t count, bool in_place, int rank, int n, int peer) const;

  std::shared_ptr<Comm> comm_;
  const OpInfo& op_;
  DataType dtype_;
  ReduceOp redop_;
  int root_;
  Average average_;
  int iters_, warmup_;
  bool check_;
  Baseline* baseline_;
  CudaBench* cuda_;
  BackendPaths paths_;
  bool overhead_;
  bool graph_;  // time replays of the op captured in a CUDA graph (cuda_ only)
  bool floor_;
  int floor_rows_ = 0;  // names each row's floor result in the store
  std::vector<uint8_t> in_, out_;
  // Other than kPlain: the op's buffers are these, of which in_ and out_ are
  // mirrors (as on cuda).
  HostMemory memory_;
  BackendBuffer registered_in_, registered_out_;
  HugePageBuffer huge_in_, huge_out_;
  bool warned_small_pages_ = false;
  // The op's CPU buffers where in_ and out_ are their mirrors, else null.
  uint8_t* placed_in() const;
  uint8_t* placed_out() const;
};

}  // namespace comms::bench
