// The flight recorder: the last N ops of one comm in a fixed ring, written on
// the hot path without locks or allocation, read by dumps from any thread.
// An op's entry is seq % N, so no index needs claiming; each entry's seq is
// stored last (release) and checked again after a read, so a dump skips a
// entry that is being rewritten instead of reporting a torn one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comms/plugin.h"
#include "comms/store.h"

namespace comms::trace {

enum class OpState : uint8_t { kIssued, kStarted, kCompleted, kFailed };
std::string_view to_string(OpState s);

// Point-to-point ops run on some ranks only, so their seq numbers (and the
// seq of every op after them) differ across ranks; collectives run on every
// rank in the same order, so their count lines ranks up (as torch's flight
// recorder's collective_seq_id does).
constexpr bool is_collective(plugin::OpType t) {
  return t != plugin::OpType::kSend && t != plugin::OpType::kRecv && t != plugin::OpType::kBatchP2P;
}

// What the ring keeps of one op, as a plain copy.
struct OpRecord {
  uint64_t seq = 0;  // 0: empty entry
  uint64_t collective = 0;  // 1, 2, ...: which of the comm's collectives; 0: a point-to-point or window op
  plugin::OpType op = plugin::OpType::kAllReduce;  // unused for a window op
  std::optional<plugin::WindowOpType> window_op;  // set for a window's put, signal, wait_signal or flush
  DataType dtype = DataType::kFloat32;
  ReduceKind reduction = ReduceKind::kSum;
  DeviceType device = DeviceType::kCpu;
  bool async = false;
  int32_t root = -1;
  int32_t peer = -1;  // the op's peer (send/recv) or the failing peer
  uint64_t count = 0;
  int64_t issued_ns = 0, started_ns = 0, ended_ns = 0;  // steady clock; 0: not yet
  OpState state = OpState::kIssued;
  ErrorCode error = ErrorCode::kOk;
};

// Whether every rank runs r in the same order (a window's ops are one-sided).
constexpr bool is_collective(const OpRecord& r) { return !r.window_op && is_collective(r.op); }
// "all_reduce", "send", ..., or a window op's "put", "wait_signal", ...
std::string_view op_name(const OpRecord& r);

// One comm's identity, for dumps and the culprit search.
struct CommInfo {
  std::string name;
  int rank = 0;
  int size = 1;
  std::string ns;  // the comm incarnation's store namespace
  std::shared_ptr<Store> store;
};

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The ring's clock, read three times per op. Where the kernel's own clock
// is the TSC (clocksource "tsc": invariant and the same on every core) it
// is the TSC itself: about 10 ns a read here against steady_clock's 27.
// Elsewhere it is now_ns(). A record is turned into steady_clock
// nanoseconds only when it is read (ticks_to_ns), so every reader of the
// ring sees now_ns()'s time base.
namespace internal {
struct TickClock {
  bool tsc = false;
  int64_t tick0 = 0, ns0 = 0;  // one reading of both, for the conversion
};
// Set once by start_tick_clock(), which every Recorder's constructor calls:
// whoever holds a recorder reads it without a guard.
extern TickClock g_tick_clock;
void start_tick_clock();
}  // namespace internal

inline int64_t ticks() {
#if defined(__x86_64__)
  if (internal::g_tick_clock.tsc) return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
  return now_ns();
}

// Turns ticks() readings into steady-clock nanoseconds (0 stays 0: "not
// yet"). One converter maps every reading with the same rate and origin, so
// the order of readings is kept; make one per batch read together.
class TicksToNs {
 public:
  TicksToNs();
  int64_t operator()(int64_t ticks) const;

 private:
  bool tsc_ = false;
  int64_t tick1_ = 0, ns1_ = 0;
  long double ns_per_tick_ = 1;
};

class Recorder {
 public:
  // capacity 0: records nothing (but still counts entered/completed).
  Recorder(CommInfo info, size_t capacity);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // r's fields but its times and collective number, which this assigns and
  // returns (0 for a point-to-point or window op); `at` (of ticks()) is the issue
  // time, and with `started` the start time too (one write of the entry).
  // One issuing thread at a time (comm.h).
  uint64_t issued(const OpRecord& r, int64_t at, bool started = false);
  uint64_t issued(const OpRecord& r) { return issued(r, capacity_ ? ticks() : 0); }
  void started(uint64_t seq);
  // `op` and `collective` (issued()'s answer) keep the last completed
  // collective known with the ring off.
  void completed(uint64_t seq, plugin::OpType op, uint64_t collective);
  void completed_window_op(uint64_t seq) { completed(seq, plugin::OpType::kBarrier, 0); }
  void failed(uint64_t seq, ErrorCode code, int peer);

  // Every live entry, oldest first (torn entries skipped).
  std::vector<OpRecord> snapshot() const;
  // The op recorded under `seq`, if the ring still holds it.
  bool find(uint64_t seq, OpRecord* out) const;
  uint64_t last_entered() const { return last_entered_.load(std::memory_order_relaxed); }
  uint64_t last_completed() const { return last_completed_.load(std::memory_order_relaxed); }
  // The same for collectives alone (numbers, not seq): what ranks compare.
  uint64_t last_entered_collective() const { return last_entered_collective_.load(std::memory_order_relaxed); }
  uint64_t last_completed_collective() const { return last_completed_collective_.load(std::memory_order_relaxed); }
  plugin::OpType last_entered_collective_op() const {
    return static_cast<plugin::OpType>(last_entered_collective_op_.load(std::memory_order_relaxed));
  }
  plugin::OpType last_completed_collective_op() const {
    return static_cast<plugin::OpType>(last_completed_collective_op_.load(std::memory_order_relaxed));
  }
  size_t capacity() const { return capacity_; }
  const CommInfo& info() const { return info_; }

  // The dump's JSON text (see docs/DEBUGGING.md for its fields).
  std::string to_json(const std::string& reason) const;

 private:
  struct Entry {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> collective{0};
    std::atomic<uint64_t> count{0};
    std::atomic<uint32_t> kinds{0};  // op, dtype, reduction, device (a byte each)
    std::atomic<int32_t> root{-1}, peer{-1};
    std::atomic<int64_t> issued{0}, started{0}, ended{0};  // ticks()
    std::atomic<uint8_t> async{0}, state{0}, error{0};
    std::atomic<uint8_t> window_op{0};  // 1 + plugin::WindowOpType; 0: not a window op
  };
  Entry* entry_of(uint64_t seq) const;
  bool read(const Entry& s, const TicksToNs& to_ns, OpRecord* out) const;

  CommInfo info_;
  size_t capacity_;
  // The ring holds a power of two >= capacity_ entries: an op's entry is
  // seq & mask_, not a division on every op. Dumps still show capacity_.
  uint64_t mask_ = 0;
  std::unique_ptr<Entry[]> entries_;
  std::atomic<uint64_t> last_entered_{0};
  std::atomic<uint64_t> last_completed_{0};
  std::atomic<uint64_t> last_entered_collective_{0};
  std::atomic<uint64_t> last_completed_collective_{0};
  std::atomic<uint8_t> last_entered_collective_op_{0}, last_completed_collective_op_{0};
};

// COMMS_TRACE_BUFFER (default 2000, 0: off), read once.
size_t configured_capacity();

}  // namespace comms::trace
