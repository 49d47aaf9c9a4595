#include "trace/recorder.h"

#include <unistd.h>

#include <bit>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/env.h"
#include "util/json_text.h"

namespace comms::trace {

std::string_view to_string(OpState s) {
  switch (s) {
    case OpState::kIssued: return "issued";
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "unknown";
}

std::string_view op_name(const OpRecord& r) {
  return r.window_op ? plugin::window_op_name(*r.window_op) : plugin::op_name(r.op);
}

namespace {

#if defined(__x86_64__)
// The TSC and now_ns() read together: a pair whose two now_ns() readings
// are more than 10 us apart (preempted in between) is read again.
void read_pair(int64_t* tick, int64_t* ns) {
  for (int tries = 0;; ++tries) {
    const int64_t before = now_ns();
    *tick = static_cast<int64_t>(__builtin_ia32_rdtsc());
    const int64_t after = now_ns();
    *ns = before + (after - before) / 2;
    if (after - before <= 10000 || tries == 100) return;
  }
}
#endif

}  // namespace

namespace internal {

TickClock g_tick_clock;

void start_tick_clock() {
  static const bool started = [] {
#if defined(__x86_64__)
    std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    if (source >> name && name == "tsc") {
      read_pair(&g_tick_clock.tick0, &g_tick_clock.ns0);
      g_tick_clock.tsc = true;
    }
#endif
    return true;
  }();
  (void)started;
}

}  // namespace internal

TicksToNs::TicksToNs() {
  internal::start_tick_clock();
  const internal::TickClock& c = internal::g_tick_clock;
  tsc_ = c.tsc;
#if defined(__x86_64__)
  if (!tsc_) return;
  // The rate from the first reading to now: the longer the process ran, the
  // finer. A converter made less than 1 ms after the first reading waits
  // for that 1 ms.
  do read_pair(&tick1_, &ns1_);
  while (ns1_ - c.ns0 < 1000000);
  ns_per_tick_ = static_cast<long double>(ns1_ - c.ns0) / static_cast<long double>(tick1_ - c.tick0);
#endif
}

int64_t TicksToNs::operator()(int64_t t) const {
  if (!tsc_ || t == 0) return t;
  return ns1_ - static_cast<int64_t>(static_cast<long double>(tick1_ - t) * ns_per_tick_);
}

size_t configured_capacity() {
  static const size_t capacity = static_cast<size_t>(env::get_int("COMMS_TRACE_BUFFER", 2000, 0, 1 << 24));
  return capacity;
}

namespace {
size_t ring_entries(size_t capacity) { return capacity ? std::bit_ceil(capacity) : 0; }
}  // namespace

Recorder::Recorder(CommInfo info, size_t capacity)
    : info_(std::move(info)),
      capacity_(capacity),
      mask_(capacity ? ring_entries(capacity) - 1 : 0),
      entries_(capacity ? new Entry[ring_entries(capacity)] : nullptr) {
  internal::start_tick_clock();
}

Recorder::Entry* Recorder::entry_of(uint64_t seq) const {
  if (capacity_ == 0) return nullptr;
  return &entries_[seq & mask_];
}

uint64_t Recorder::issued(const OpRecord& r, int64_t at, bool started) {
  last_entered_.store(r.seq, std::memory_order_relaxed);
  uint64_t collective = 0;
  if (is_collective(r)) {
    collective = last_entered_collective_.load(std::memory_order_relaxed) + 1;
    last_entered_collective_.store(collective, std::memory_order_relaxed);
    last_entered_collective_op_.store(static_cast<uint8_t>(r.op), std::memory_order_relaxed);
  }
  Entry* s = entry_of(r.seq);
  if (!s) return collective;
  s->seq.store(0, std::memory_order_relaxed);  // readers skip the entry while it changes
  std::atomic_thread_fence(std::memory_order_release);
  s->collective.store(collective, std::memory_order_relaxed);
  s->count.store(r.count, std::memory_order_relaxed);
  s->kinds.store(static_cast<uint32_t>(r.op) | static_cast<uint32_t>(r.dtype) << 8 |
                     static_cast<uint32_t>(r.reduction) << 16 | static_cast<uint32_t>(r.device) << 24,
                 std::memory_order_relaxed);
  s->root.store(r.root, std::memory_order_relaxed);
  s->peer.store(r.peer, std::memory_order_relaxed);
  s->issued.store(at, std::memory_order_relaxed);
  s->started.store(started ? at : 0, std::memory_order_relaxed);
  s->ended.store(0, std::memory_order_relaxed);
  s->async.store(r.async, std::memory_order_relaxed);
  s->state.store(static_cast<uint8_t>(started ? OpState::kStarted : OpState::kIssued), std::memory_order_relaxed);
  s->error.store(0, std::memory_order_relaxed);
  s->window_op.store(r.window_op ? static_cast<uint8_t>(1 + static_cast<uint8_t>(*r.window_op)) : 0,
                     std::memory_order_relaxed);
  s->seq.store(r.seq, std::memory_order_release);
  return collective;
}

void Recorder::started(uint64_t seq) {
  Entry* s = entry_of(seq);
  if (!s || s->seq.load(std::memory_order_relaxed) != seq) return;
  s->started.store(ticks(), std::memory_order_relaxed);
  s->state.store(static_cast<uint8_t>(OpState::kStarted), std::memory_order_release);
}

namespace {
// Ops complete in order on a comm, except async ones waited out of order:
// `last` only grows. True when n became the last.
bool raise_to(std::atomic<uint64_t>& last, uint64_t n) {
  uint64_t prev = last.load(std::memory_order_relaxed);
  while (prev < n && !last.compare_exchange_weak(prev, n, std::memory_order_relaxed)) {
  }
  return prev < n;
}
}  // namespace

void Recorder::completed(uint64_t seq, plugin::OpType op, uint64_t collective) {
  raise_to(last_completed_, seq);
  if (collective && raise_to(last_completed_collective_, collective)) {
    last_completed_collective_op_.store(static_cast<uint8_t>(op), std::memory_order_relaxed);
  }
  Entry* s = entry_of(seq);
  if (!s || s->seq.load(std::memory_order_relaxed) != seq) return;
  const int64_t now = ticks();
  if (s->started.load(std::memory_order_relaxed) == 0) s->started.store(now, std::memory_order_relaxed);
  s->ended.store(now, std::memory_order_relaxed);
  s->state.store(static_cast<uint8_t>(OpState::kCompleted), std::memory_order_release);
}

void Recorder::failed(uint64_t seq, ErrorCode code, int peer) {
  Entry* s = entry_of(seq);
  if (!s || s->seq.load(std::memory_order_relaxed) != seq) return;
  s->ended.store(ticks(), std::memory_order_relaxed);
  s->error.store(static_cast<uint8_t>(code), std::memory_order_relaxed);
  if (peer >= 0) s->peer.store(peer, std::memory_order_relaxed);
  s->state.store(static_cast<uint8_t>(OpState::kFailed), std::memory_order_release);
}

bool Recorder::read(const Entry& s, const TicksToNs& to_ns, OpRecord* out) const {
  const uint64_t seq = s.seq.load(std::memory_order_acquire);
  if (seq == 0) return false;
  OpRecord r;
  r.seq = seq;
  r.state = static_cast<OpState>(s.state.load(std::memory_order_acquire));
  r.collective = s.collective.load(std::memory_order_relaxed);
  r.count = s.count.load(std::memory_order_relaxed);
  const uint32_t kinds = s.kinds.load(std::memory_order_relaxed);
  r.op = static_cast<plugin::OpType>(kinds & 0xff);
  r.dtype = static_cast<DataType>((kinds >> 8) & 0xff);
  r.reduction = static_cast<ReduceKind>((kinds >> 16) & 0xff);
  r.device = static_cast<DeviceType>((kinds >> 24) & 0xff);
  r.root = s.root.load(std::memory_order_relaxed);
  r.peer = s.peer.load(std::memory_order_relaxed);
  const int64_t issued = s.issued.load(std::memory_order_relaxed);
  const int64_t started = s.started.load(std::memory_order_relaxed);
  const int64_t ended = s.ended.load(std::memory_order_relaxed);
  r.async = s.async.load(std::memory_order_relaxed) != 0;
  r.error = static_cast<ErrorCode>(s.error.load(std::memory_order_relaxed));
  if (const uint8_t w = s.window_op.load(std::memory_order_relaxed)) {
    r.window_op = static_cast<plugin::WindowOpType>(w - 1);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.seq.load(std::memory_order_relaxed) != seq) return false;  // rewritten while read
  r.issued_ns = to_ns(issued);
  r.started_ns = to_ns(started);
  r.ended_ns = to_ns(ended);
  *out = r;
  return true;
}

std::vector<OpRecord> Recorder::snapshot() const {
  std::vector<OpRecord> out;
  const uint64_t last = last_entered();
  if (capacity_ == 0 || last == 0) return out;
  const uint64_t first = last >= capacity_ ? last - capacity_ + 1 : 1;
  out.reserve(static_cast<size_t>(last - first + 1));
  const TicksToNs to_ns;
  for (uint64_t seq = first; seq <= last; ++seq) {
    OpRecord r;
    if (read(*entry_of(seq), to_ns, &r) && r.seq == seq) out.push_back(r);
  }
  return out;
}

bool Recorder::find(uint64_t seq, OpRecord* out) const {
  if (seq == 0 || capacity_ == 0) return false;
  return read(*entry_of(seq), TicksToNs(), out) && out->seq == seq;
}

std::string Recorder::to_json(const std::string& reason) const {
  // Steady times become wall-clock microseconds since the epoch.
  const int64_t wall_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  const int64_t offset_us = wall_us - now_ns() / 1000;
  auto wall = [&](int64_t ns) -> nlohmann::json { return ns ? nlohmann::json(ns / 1000 + offset_us) : nullptr; };
  nlohmann::json entries = nlohmann::json::array();
  for (const OpRecord& r : snapshot()) {
    nlohmann::json e = {{"seq", r.seq},
                        {"collective", r.collective},
                        {"op", op_name(r)},
                        {"dtype", comms::to_string(r.dtype)},
                        {"count", r.count},
                        {"root", r.root},
                        {"peer", r.peer},
                        {"reduction", comms::to_string(r.reduction)},
                        {"device", comms::to_string(r.device)},
                        {"async", r.async},
                        {"state", to_string(r.state)},
                        {"issued_us", wall(r.issued_ns)},
                        {"started_us", wall(r.started_ns)},
                        {"ended_us", wall(r.ended_ns)}};
    if (r.state == OpState::kFailed) e["error"] = comms::to_string(r.error);
    entries.push_back(std::move(e));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json out = {{"comm", info_.name},
                        {"rank", info_.rank},
                        {"size", info_.size},
                        {"host", host},
                        {"pid", static_cast<int>(::getpid())},
                        {"reason", reason},
                        {"dumped_us", wall_us},
                        {"capacity", capacity_},
                        {"last_entered", last_entered()},
                        {"last_completed", last_completed()},
                        {"last_entered_collective", last_entered_collective()},
                        {"last_completed_collective", last_completed_collective()},
                        {"entries", std::move(entries)}};
  return json_text(out, 1);
}

}  // namespace comms::trace
