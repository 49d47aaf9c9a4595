#include "floor.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "plain_reductions.h"

namespace comms::bench {

using plugin::OpType;
using Clock = std::chrono::steady_clock;

namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex word is the atomic itself");

uint32_t* futex_word(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }

void futex_wait(std::atomic<uint32_t>* a, uint32_t expected) {
  syscall(SYS_futex, futex_word(a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* a) {
  syscall(SYS_futex, futex_word(a), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Work is split between threads in whole cache lines (no two threads write
// one line) and done in blocks that stay in L1/L2 while every source of a
// reduction and every destination of a copy passes over them.
constexpr size_t kLine = 64;
constexpr size_t kBlockBytes = 32 << 10;

// A barrier's waits: pure spinning first, then polling that yields, then
// a futex sleep (what comms' own waits do, docs/ENVIRONMENT.md).
constexpr auto kPureSpin = std::chrono::microseconds(2);
constexpr auto kSpinWindow = std::chrono::microseconds(200);

bool size_is_total(OpType t) {
  return t == OpType::kAllGather || t == OpType::kReduceScatter || t == OpType::kAllToAll ||
         t == OpType::kGather || t == OpType::kScatter;
}

}  // namespace

void ThreadBarrier::arrive_and_wait() {
  const uint32_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&generation_);
    return;
  }
  if (spin_) {
    // Spin, then keep polling but yield the core after each look: when the
    // scheduler has put both threads on one core (the machine busy), a pure
    // spinner would hold the core its releaser needs for the whole window.
    const auto start = Clock::now();
    bool yielding = false;
    for (unsigned i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != gen) return;
      if (yielding) {
        sched_yield();
        if (Clock::now() - start > kSpinWindow) break;
      } else {
        cpu_relax();
        // The clock every 64 looks: a look costs far less than a clock read.
        if (i % 64 == 0) yielding = Clock::now() - start > kPureSpin;
      }
    }
  }
  // The releaser bumps the generation, then looks for sleepers; a sleeper
  // counts itself, then looks at the generation (both seq_cst): one of the
  // two sees the other, and the futex re-checks the word in the kernel.
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  while (generation_.load(std::memory_order_seq_cst) == gen) futex_wait(&generation_, gen);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<int> online_cpus() {
  // "0-3,6,8-9"
  std::vector<int> cpus;
  std::ifstream in("/sys/devices/system/cpu/online");
  std::string range;
  while (std::getline(in, range, ',')) {
    int lo = 0, hi = 0;
    char dash = 0;
    std::istringstream r(range);
    if (!(r >> lo)) continue;
    hi = (r >> dash >> hi) ? hi : lo;
    for (int c = lo; c <= hi && c < CPU_SETSIZE; ++c) cpus.push_back(c);
  }
  if (cpus.empty()) {
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c) cpus.push_back(int(c));
  }
  return cpus;
}

Floor::Floor(const FloorShape& shape) : s_(shape) {
  if (s_.n < 1) throw std::invalid_argument("the floor needs at least one rank");
  es_ = element_size(s_.dtype);
  big_ = size_is_total(s_.type) ? s_.count * size_t(s_.n) : s_.count;
  const size_t bytes = std::max(kLine, (big_ * es_ + kLine - 1) / kLine * kLine);
  auto buffer = [&] {
    if (s_.huge_pages) {
      auto huge = std::make_shared<HugePageBuffer>(bytes);  // zeroed and touched
      storage_.emplace_back(huge, huge->data());
      return huge->data();
    }
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(kLine, bytes));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);  // touched now, not in the first timed iteration
    storage_.emplace_back(p, std::free);
    return p;
  };
  for (int r = 0; r < s_.n; ++r) {
    in_.push_back(buffer());
    out_.push_back(s_.in_place ? in_.back() : buffer());
  }
  plan();
}

// The pieces mirror the buffers Bench::op_of gives the op (runner.cc).
void Floor::plan() {
  const int n = s_.n;
  const size_t c = s_.count, S = c * es_;
  const bool ip = s_.in_place;
  auto copy = [&](const uint8_t* src, std::vector<uint8_t*> dsts) {
    pieces_.push_back({Piece::Kind::kCopy, {src}, std::move(dsts), c});
  };
  auto swap = [&](uint8_t* a, uint8_t* b) { pieces_.push_back({Piece::Kind::kSwap, {}, {a, b}, c}); };
  auto reduce = [&](std::vector<const uint8_t*> srcs, std::vector<uint8_t*> dsts) {
    // A source that is the first destination (in place) is read first,
    // before the partial result overwrites it.
    auto alias = std::find(srcs.begin(), srcs.end(), dsts[0]);
    if (alias != srcs.end()) std::iter_swap(srcs.begin(), alias);
    pieces_.push_back({Piece::Kind::kReduce, std::move(srcs), std::move(dsts), c});
  };
  const auto all_in = [&](size_t offset) {
    std::vector<const uint8_t*> v;
    for (int q = 0; q < n; ++q) v.push_back(in_[size_t(q)] + offset);
    return v;
  };
  const size_t root = size_t(s_.root);
  if (s_.root < 0 || s_.root >= n) throw std::invalid_argument("the floor's root is not a rank");
  switch (s_.type) {
    case OpType::kAllReduce: reduce(all_in(0), out_); break;
    case OpType::kReduce: reduce(all_in(0), {out_[root]}); break;
    case OpType::kBroadcast: {  // comms-bench broadcasts in each rank's input
      std::vector<uint8_t*> dsts;
      for (int r = 0; r < n; ++r)
        if (size_t(r) != root) dsts.push_back(in_[size_t(r)]);
      copy(in_[root], dsts);
      break;
    }
    case OpType::kAllGather:
      for (int r = 0; r < n; ++r) {
        const size_t at = size_t(r) * S;
        std::vector<uint8_t*> dsts;
        for (int q = 0; q < n; ++q)
          if (!ip || q != r) dsts.push_back(out_[size_t(q)] + at);
        copy(ip ? out_[size_t(r)] + at : in_[size_t(r)], dsts);
      }
      break;
    case OpType::kReduceScatter:
      for (int r = 0; r < n; ++r) reduce(all_in(size_t(r) * S), {ip ? in_[size_t(r)] + size_t(r) * S : out_[size_t(r)]});
      break;
    case OpType::kAllToAll:
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          if (!ip) copy(in_[size_t(r)] + size_t(q) * S, {out_[size_t(q)] + size_t(r) * S});
          else if (r < q) swap(in_[size_t(r)] + size_t(q) * S, in_[size_t(q)] + size_t(r) * S);
        }
      }
      break;
    case OpType::kGather:
      for (int r = 0; r < n; ++r)
        if (!ip || size_t(r) != root) copy(in_[size_t(r)], {out_[root] + size_t(r) * S});
      break;
    case OpType::kScatter:
      for (int r = 0; r < n; ++r)
        if (!ip || size_t(r) != root) copy(in_[root] + size_t(r) * S, {out_[size_t(r)]});
      break;
    case OpType::kSend:  // comms-bench's send_recv: rank r and r ^ 1 exchange
      if (n % 2) throw std::invalid_argument("send_recv needs an even number of ranks");
      for (int r = 0; r < n; r += 2) {
        if (ip) {
          swap(in_[size_t(r)], in_[size_t(r) + 1]);
        } else {
          copy(in_[size_t(r)], {out_[size_t(r) + 1]});
          copy(in_[size_t(r) + 1], {out_[size_t(r)]});
        }
      }
      break;
    case OpType::kBarrier: break;  // nothing to move: the end barrier is the whole floor
    default: throw std::invalid_argument("the floor does not define this op");
  }
  for (const Piece& p : pieces_) {
    if (p.kind == Piece::Kind::kReduce && !plain_reduce_fn(s_.dtype, s_.redop.kind)) {
      throw std::invalid_argument(std::string("the floor has no reduction ") + to_string(s_.redop) + " for " +
                                  std::string(to_string(s_.dtype)));
    }
  }
}

void Floor::run_piece(const Piece& p, size_t begin, size_t end) const {
  const size_t block = std::max<size_t>(1, kBlockBytes / es_);
  const auto fn = p.kind == Piece::Kind::kReduce ? plain_reduce_fn(s_.dtype, s_.redop.kind) : nullptr;
  for (size_t b = begin; b < end; b += block) {
    const size_t k = std::min(block, end - b), off = b * es_, bytes = k * es_;
    switch (p.kind) {
      case Piece::Kind::kCopy:
        for (uint8_t* d : p.dsts) std::memcpy(d + off, p.srcs[0] + off, bytes);
        break;
      case Piece::Kind::kSwap:
        std::swap_ranges(p.dsts[0] + off, p.dsts[0] + off + bytes, p.dsts[1] + off);
        break;
      case Piece::Kind::kReduce: {
        uint8_t* d0 = p.dsts[0] + off;
        if (p.srcs.size() == 1) {
          if (d0 != p.srcs[0] + off) std::memcpy(d0, p.srcs[0] + off, bytes);
        } else {
          fn(d0, p.srcs[0] + off, p.srcs[1] + off, k);
          for (size_t i = 2; i < p.srcs.size(); ++i) fn(d0, d0, p.srcs[i] + off, k);
        }
        finish_reduction(d0, s_.dtype, k, s_.redop, s_.n);
        for (size_t i = 1; i < p.dsts.size(); ++i) std::memcpy(p.dsts[i] + off, d0, bytes);
        break;
      }
    }
  }
}

void Floor::run_part(int t) const {
  const size_t unit = std::max<size_t>(1, kLine / es_);
  const size_t n = size_t(s_.n), tt = size_t(t);
  for (const Piece& p : pieces_) {
    const size_t units = (p.count + unit - 1) / unit;
    const size_t begin = std::min(p.count, units * tt / n * unit);
    const size_t end = std::min(p.count, units * (tt + 1) / n * unit);
    if (begin < end) run_piece(p, begin, end);
  }
}

void Floor::run_once() {
  std::vector<std::thread> threads;
  for (int t = 1; t < s_.n; ++t) threads.emplace_back([this, t] { run_part(t); });
  run_part(0);
  for (auto& th : threads) th.join();
}

std::vector<std::vector<double>> Floor::time(int warmup, int iters) {
  const int n = s_.n;
  std::vector<std::vector<double>> times(size_t(n), std::vector<double>(size_t(std::max(0, iters))));
  const std::vector<int> cpus = online_cpus();
  const bool bind = size_t(n) <= cpus.size();
  cpu_set_t caller;
  const bool saved = pthread_getaffinity_np(pthread_self(), sizeof caller, &caller) == 0;
  ThreadBarrier barrier(n, bind);
  auto body = [&](int t) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (size_t k = 0; k < cpus.size(); ++k)
      if (!bind || k == size_t(t)) CPU_SET(cpus[k], &set);
    // A CPU outside this container's cpuset refuses: the thread then
    // keeps the caller's CPUs, and the barrier's yielding covers sharing.
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    for (int i = -warmup; i < iters; ++i) {
      barrier.arrive_and_wait();
      const auto start = Clock::now();
      run_part(t);
      barrier.arrive_and_wait();
      if (i >= 0) times[size_t(t)][size_t(i)] = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t) threads.emplace_back(body, t);
  body(0);
  for (auto& th : threads) th.join();
  if (saved) pthread_setaffinity_np(pthread_self(), sizeof caller, &caller);
  return times;
}

}  // namespace comms::bench
