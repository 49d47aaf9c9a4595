// comms-bench --floor's kernels (tools/comms-bench/floor.h) produce what
// the op they stand for produces: a floor that computes something else
// would time the wrong traffic. Every buffer of every rank is compared with
// a reference computed from a snapshot taken before the op, so a write to a
// wrong place shows as well as a wrong value. Nothing here is timed.
#include <gtest/gtest.h>
#include <sched.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comms/numeric.h"
#include "floor.h"

namespace comms::bench {
namespace {

using plugin::OpType;
using Buffers = std::vector<std::vector<double>>;

struct Snapshot {
  Buffers in, out;
};

Snapshot snapshot(Floor& f, const FloorShape& s) {
  Snapshot snap{Buffers(size_t(s.n)), Buffers(size_t(s.n))};
  for (int r = 0; r < s.n; ++r) {
    for (size_t j = 0; j < f.buffer_elements(); ++j) {
      snap.in[size_t(r)].push_back(numeric::load_as_double(f.input(r), s.dtype, j));
      snap.out[size_t(r)].push_back(numeric::load_as_double(f.output(r), s.dtype, j));
    }
  }
  return snap;
}

// Values that differ by rank and index, small enough that sums and products
// of four are exact in every type tested.
double value(int r, size_t j) { return double((j * 7 + size_t(r) * 3) % 11 + 1); }

bool is_integer(DataType t) { return t == DataType::kInt32 || t == DataType::kInt8 || t == DataType::kInt64; }

double reduced(const FloorShape& s, const Buffers& in, size_t j) {
  double acc = s.redop.kind == ReduceKind::kProduct ? 1 : 0, lo = 1e300, hi = -1e300;
  for (int q = 0; q < s.n; ++q) {
    const double v = in[size_t(q)][j];
    acc = s.redop.kind == ReduceKind::kProduct ? acc * v : acc + v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (s.redop.kind) {
    case ReduceKind::kMax: return hi;
    case ReduceKind::kMin: return lo;
    case ReduceKind::kAvg: return is_integer(s.dtype) ? std::trunc(acc / s.n) : acc / s.n;
    case ReduceKind::kPremulSum: return acc * s.redop.scalar;
    default: return acc;
  }
}

// What the op leaves in every buffer, computed from `before` alone. In
// place, a rank's output is its input (one buffer: `in`).
Snapshot expected(const FloorShape& s, const Snapshot& before) {
  Snapshot after = before;
  const size_t c = s.count;
  const auto n = size_t(s.n), root = size_t(s.root);
  const bool ip = s.in_place;
  auto out = [&](size_t r) -> std::vector<double>& { return ip ? after.in[r] : after.out[r]; };
  auto out_before = [&](size_t r) -> const std::vector<double>& { return ip ? before.in[r] : before.out[r]; };
  for (size_t i = 0; i < c; ++i) {
    switch (s.type) {
      case OpType::kAllReduce:
        for (size_t r = 0; r < n; ++r) out(r)[i] = reduced(s, before.in, i);
        break;
      case OpType::kReduce: out(root)[i] = reduced(s, before.in, i); break;
      case OpType::kBroadcast:
        for (size_t r = 0; r < n; ++r) after.in[r][i] = before.in[root][i];
        break;
      case OpType::kAllGather:
        for (size_t r = 0; r < n; ++r) {
          const double v = ip ? out_before(r)[r * c + i] : before.in[r][i];
          for (size_t q = 0; q < n; ++q) out(q)[r * c + i] = v;
        }
        break;
      case OpType::kReduceScatter:
        for (size_t r = 0; r < n; ++r) (ip ? after.in[r][r * c + i] : after.out[r][i]) = reduced(s, before.in, r * c + i);
        break;
      case OpType::kAllToAll:
        for (size_t r = 0; r < n; ++r)
          for (size_t q = 0; q < n; ++q) out(q)[r * c + i] = before.in[r][q * c + i];
        break;
      case OpType::kGather:
        for (size_t r = 0; r < n; ++r) out(root)[r * c + i] = ip && r == root ? before.in[root][root * c + i] : before.in[r][i];
        break;
      case OpType::kScatter:
        for (size_t r = 0; r < n; ++r) (ip && r == root ? after.in[root][root * c + i] : out(r)[i]) = before.in[root][r * c + i];
        break;
      case OpType::kSend:
        for (size_t r = 0; r < n; ++r) out(r ^ 1)[i] = before.in[r][i];
        break;
      default: break;
    }
  }
  return after;
}

std::string describe(const FloorShape& s) {
  return std::string(plugin::op_name(s.type)) + " n=" + std::to_string(s.n) + " count=" +
         std::to_string(s.count) + " " + std::string(to_string(s.dtype)) + " " + to_string(s.redop) + " root=" +
         std::to_string(s.root) + (s.in_place ? " in place" : " out of place");
}

// Fills every rank's input (and a distinct output, so a missed write shows),
// runs the floor once on n threads, and compares every buffer.
void check(const FloorShape& s) {
  SCOPED_TRACE(describe(s));
  Floor f(s);
  for (int r = 0; r < s.n; ++r) {
    for (size_t j = 0; j < f.buffer_elements(); ++j) {
      numeric::store_from_double(f.input(r), s.dtype, j, value(r, j));
      if (!s.in_place) numeric::store_from_double(f.output(r), s.dtype, j, 100 + double(r));
    }
  }
  const Snapshot before = snapshot(f, s);
  const Snapshot want = expected(s, before);
  f.run_once();
  const Snapshot got = snapshot(f, s);
  // bfloat16 keeps 8 significant bits: an average of 3 rounds.
  const double tolerance = s.dtype == DataType::kBfloat16 ? 1.0 / 128 : 1e-6;
  int64_t wrong = 0;
  for (int r = 0; r < s.n; ++r) {
    for (size_t j = 0; j < f.buffer_elements(); ++j) {
      for (auto [g, w, which] : {std::tuple{&got.in, &want.in, "input"}, {&got.out, &want.out, "output"}}) {
        if (s.in_place && g == &got.out) continue;  // the same buffer as the input
        const double gv = (*g)[size_t(r)][j], wv = (*w)[size_t(r)][j];
        if (std::fabs(gv - wv) > tolerance * std::max(1.0, std::fabs(wv))) {
          if (++wrong <= 5) ADD_FAILURE() << "rank " << r << " " << which << "[" << j << "] = " << gv << ", want " << wv;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// Counts of one element (fewer than one cache line per thread), one not a
// multiple of a line, and one over several 32 KiB blocks per thread.
const size_t kCounts[] = {1, 37, 40000};

TEST(BenchFloor, EveryOpMatchesItsReference) {
  const OpType ops[] = {OpType::kAllReduce, OpType::kReduce, OpType::kBroadcast, OpType::kAllGather,
                        OpType::kReduceScatter, OpType::kAllToAll, OpType::kGather, OpType::kScatter,
                        OpType::kSend, OpType::kBarrier};
  for (OpType op : ops) {
    for (int n : {1, 2, 3, 4}) {
      if (op == OpType::kSend && n % 2) continue;
      for (bool in_place : {false, true}) {
        for (size_t count : kCounts) {
          check({op, n, count, DataType::kFloat32, ReduceOp::sum(), n - 1, in_place});
        }
      }
    }
  }
}

// --huge-pages: the floor's buffers move to huge pages; every op's result stays.
TEST(BenchFloor, HugePageBuffersMatchTheReference) {
  for (OpType op : {OpType::kAllReduce, OpType::kBroadcast, OpType::kAllGather, OpType::kReduceScatter}) {
    for (bool in_place : {false, true}) {
      FloorShape s{op, 2, 300000, DataType::kFloat32, ReduceOp::sum(), 1, in_place};
      s.huge_pages = true;
      check(s);
      Floor f(s);
      for (int r = 0; r < s.n; ++r) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(f.input(r)) % (size_t(2) << 20), 0u) << "rank " << r << "'s input";
        EXPECT_EQ(reinterpret_cast<uintptr_t>(f.output(r)) % (size_t(2) << 20), 0u) << "rank " << r << "'s output";
      }
    }
  }
}

TEST(HugePageBuffer, AlignedZeroedAndMovable) {
  constexpr size_t kHuge = size_t(2) << 20;
  HugePageBuffer a(3 * kHuge + 5);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kHuge, 0u) << "not 2 MiB-aligned: no huge page can back it";
  EXPECT_EQ(a.size(), 3 * kHuge + 5);
  size_t nonzero = 0;
  for (size_t i = 0; i < a.size(); i += 4093) nonzero += a.data()[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  a.data()[a.size() - 1] = 7;  // the last byte is ours to write
  EXPECT_LE(a.huge_bytes(), 4 * kHuge);
  uint8_t* const at = a.data();
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.huge_bytes(), 0u);
  EXPECT_EQ(b.data(), at);
  EXPECT_EQ(b.data()[b.size() - 1], 7);
  b = HugePageBuffer();
  EXPECT_EQ(b.data(), nullptr);
}

TEST(BenchFloor, ReductionsAndTypes) {
  const ReduceOp redops[] = {ReduceOp::sum(), ReduceOp::product(), ReduceOp::max(), ReduceOp::min(),
                             ReduceOp::avg(), ReduceOp::premul_sum(2.0)};
  for (OpType op : {OpType::kAllReduce, OpType::kReduceScatter, OpType::kReduce}) {
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kBfloat16}) {
      for (const ReduceOp& redop : redops) {
        for (bool in_place : {false, true}) check({op, 3, 37, dtype, redop, 1, in_place});
      }
    }
  }
  // One byte per element: the split into cache lines is 64 elements.
  for (bool in_place : {false, true}) check({OpType::kAllReduce, 2, 1000, DataType::kInt8, ReduceOp::max(), 0, in_place});
}

TEST(BenchFloor, TimedIterationsKeepTheResult) {
  // Threads that fit the CPUs are bound and spin; 2 * CPUs + 1 sleep.
  for (int n : {2, 2 * int(online_cpus().size()) + 1}) {
    FloorShape s{OpType::kAllReduce, n, 5000, DataType::kFloat32, ReduceOp::sum(), 0, false};
    SCOPED_TRACE(describe(s));
    Floor f(s);
    for (int r = 0; r < n; ++r)
      for (size_t j = 0; j < f.buffer_elements(); ++j) numeric::store_from_double(f.input(r), s.dtype, j, value(r, j));
    cpu_set_t before, after;
    ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
    const auto times = f.time(2, 5);
    ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the calling thread's binding was not restored";
    ASSERT_EQ(times.size(), size_t(n));
    for (const auto& t : times) {
      ASSERT_EQ(t.size(), 5u);
      for (double us : t) EXPECT_TRUE(us >= 0 && std::isfinite(us)) << us;
    }
    Buffers in(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (size_t j = 0; j < s.count; ++j) in[size_t(r)].push_back(value(r, j));
    for (int r = 0; r < n; ++r) {
      for (size_t j = 0; j < s.count; ++j) {
        ASSERT_EQ(numeric::load_as_double(f.output(r), s.dtype, j), reduced(s, in, j)) << "rank " << r << " [" << j << "]";
      }
    }
  }
}

// Every thread writes the round into its slot before the barrier and reads
// every slot after it: a thread let through early sees an old round.
void barrier_rounds(int n, bool spin, int rounds) {
  ThreadBarrier barrier(n, spin);
  std::vector<std::atomic<int>> slots(static_cast<size_t>(n));
  std::atomic<int> stale{0};
  auto body = [&](int t) {
    for (int k = 1; k <= rounds; ++k) {
      slots[size_t(t)].store(k, std::memory_order_relaxed);
      barrier.arrive_and_wait();
      for (auto& v : slots)
        if (v.load(std::memory_order_relaxed) != k) stale.fetch_add(1);
      barrier.arrive_and_wait();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(body, t);
  body(0);
  for (auto& th : threads) th.join();
  EXPECT_EQ(stale.load(), 0) << n << " threads, spin " << spin;
}

TEST(BenchFloor, BarrierHoldsEveryThread) {
  barrier_rounds(2, true, 2000);
  barrier_rounds(2, false, 500);
  barrier_rounds(5, false, 300);
  barrier_rounds(5, true, 100);  // more spinners than cores: each falls back to the futex
}

TEST(BenchFloor, RefusesWhatItCannotDo) {
  EXPECT_THROW(Floor({OpType::kAllReduce, 2, 8, DataType::kFloat32, ReduceOp::band(), 0, false}), std::invalid_argument);
  EXPECT_THROW(Floor({OpType::kSend, 3, 8, DataType::kFloat32, ReduceOp::sum(), 0, false}), std::invalid_argument);
  EXPECT_THROW(Floor({OpType::kBroadcast, 2, 8, DataType::kFloat32, ReduceOp::sum(), 2, false}), std::invalid_argument);
}

}  // namespace
}  // namespace comms::bench
