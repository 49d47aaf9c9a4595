#include "shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "algorithms.h"
#include "collectives.h"
#include "plan.h"
#include "reductions.h"

namespace comms::ucx_backend {

using cpu_algorithms::CountMismatch;
using cpu_algorithms::TransportError;
using Kind = TransportError::Kind;
using plugin::OpType;

namespace {

constexpr size_t kHeaderBytes = 16;  // the data: 16-byte aligned, enough for every dtype
constexpr size_t kFirstLineBytes = 64 - kHeaderBytes;  // the data that shares the op's cache line
constexpr size_t kSlotBytes = (kHeaderBytes + kShmMaxBytes + 63) / 64 * 64;
// Looks at the flags between pauses (a pause is ~25 ns here) before the
// wait reads the clock, checks the peers and may yield: a peer a few
// hundred ns behind is seen as soon as it publishes.
constexpr int kFastPolls = 64;
constexpr int kPollsPerCheck = 32;

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void relax() { __builtin_ia32_pause(); }

}  // namespace

// The segment: the bell, then one RankFlags per rank, then kDepth slots per rank.
struct alignas(64) ShmCollectives::Bell {
  std::atomic<uint32_t> word;  // bumped by a publish that finds sleepers; the futex word
  std::atomic<int32_t> sleepers;
};
// The first bytes of each slot. `op` is the flag readers wait on: the
// data follows in the same cache line, so a payload of up to 48 B reaches a
// reader as one line, and the op number with it.
struct ShmCollectives::Header {
  std::atomic<uint64_t> op;  // the last op whose data is in the slot; stored after the data
  uint64_t bytes;            // that op's bytes per block (CountMismatch)
};
struct alignas(64) ShmCollectives::RankFlags {
  // The last broadcast this rank finished reading as a non-root (or op
  // that threw): the root of a broadcast waits for no one, so its reuse
  // guard needs this; every other op proves itself (see reuse_guard).
  std::atomic<uint64_t> done;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the flags are shared between processes");

namespace {
size_t head_bytes(int size) { return 64 + 64 * static_cast<size_t>(size); }
}  // namespace

std::unique_ptr<ShmCollectives> ShmCollectives::create(UcxTransport& transport, Store& store,
                                                       std::chrono::milliseconds timeout,
                                                       const UcxSettings& settings, LogFn log) {
  const int rank = transport.rank(), size = transport.size();
  const size_t bytes = head_bytes(size) + kSlotBytes * ShmCollectives::kDepth * static_cast<size_t>(size);
  auto say = [&](const std::string& m) {
    if (log) log(1, ("ucx: shared-memory collectives off: " + m).c_str());
  };
  std::string name;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    name = "/comms-ucx-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + std::to_string(rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      fd = -1;
    }
    if (fd < 0) say("creating " + name + ": " + std::strerror(errno));
    store.set("ucx/shm/name", fd >= 0 ? name : "");
  } else {
    name = store.get("ucx/shm/name", timeout);
    if (!name.empty()) fd = ::shm_open(name.c_str(), O_RDWR, 0);
    struct stat st {};
    if (fd >= 0 && (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes)) {
      ::close(fd);
      fd = -1;
    }
  }
  void* base = fd >= 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) ::close(fd);
  store.set("ucx/shm/ok/" + std::to_string(rank), base != MAP_FAILED ? "1" : "0");
  bool all = true;
  for (int p = 0; p < size; ++p) all = store.get("ucx/shm/ok/" + std::to_string(p), timeout) == "1" && all;
  // Every rank that could map it has (it said so above): the name can go.
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());
  if (!all) {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    say("a rank could not map " + name);
    return nullptr;
  }
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(transport, base, bytes, settings));
}

ShmCollectives::ShmCollectives(UcxTransport& transport, void* base, size_t bytes, const UcxSettings& settings)
    : t_(transport),
      rank_(transport.rank()),
      size_(transport.size()),
      base_(base),
      bytes_(bytes),
      bell_(static_cast<Bell*>(base)),
      flags_(reinterpret_cast<RankFlags*>(static_cast<unsigned char*>(base) + 64)),
      slots_(static_cast<unsigned char*>(base) + head_bytes(transport.size())),
      seen_(static_cast<size_t>(transport.size()), 0),
      done_seen_(static_cast<size_t>(transport.size()), 0) {
  set_spin(settings);
}

ShmCollectives::~ShmCollectives() { ::munmap(base_, bytes_); }

// As the UCX waits: spin yielding, never a pure spin, since two ranks on one
// core would each pay the whole window per op (docs/DESIGN.md, "UCX: polling
// that yields").
void ShmCollectives::set_spin(const UcxSettings& s) {
  spin_forever_ = s.spin_forever;
  spin_us_ = s.spin.count();
  yield_ = s.yield;
  yield_after_us_ = s.yield_after.count();
}

unsigned char* ShmCollectives::slot(int rank, uint64_t op) const {
  return slots_ + (static_cast<size_t>(rank) * kDepth + op % kDepth) * kSlotBytes;
}

void ShmCollectives::write_slot(uint64_t op, const void* data, size_t bytes, size_t block_bytes) {
  unsigned char* s = slot(rank_, op);
  auto* h = reinterpret_cast<Header*>(s);
  // The lines after the first, then the first line's stores together: the
  // peers poll the first line, and each store to it while they do takes
  // the line back from them. Stores leave in order, so the op number,
  // last, still shows only with the whole payload.
  const auto* in = static_cast<const unsigned char*>(data);
  const size_t in_first_line = std::min(bytes, kFirstLineBytes);
  if (bytes > in_first_line) std::memcpy(s + kHeaderBytes + in_first_line, in + in_first_line, bytes - in_first_line);
  h->bytes = block_bytes;
  if (in_first_line) std::memcpy(s + kHeaderBytes, in, in_first_line);
  publish(h->op, op);
}

ShmCollectives::Header* ShmCollectives::header(int rank, uint64_t op) const {
  static_assert(sizeof(Header) <= kHeaderBytes, "the data follows the header");
  return reinterpret_cast<Header*>(slot(rank, op));
}

void ShmCollectives::check_lengths(uint64_t op, size_t block_bytes, int only_peer) const {
  for (int p = 0; p < size_; ++p) {
    if (only_peer >= 0 && p != only_peer) continue;
    const Header& h = *header(p, op);
    const uint64_t h_op = h.op.load(std::memory_order_relaxed);
    if (h.bytes == block_bytes && h_op == op) [[likely]] continue;
    throw_count_mismatch(p, block_bytes, h_op == op, h.bytes);
  }
}

void ShmCollectives::throw_count_mismatch(int p, size_t block_bytes, bool same_op, size_t sent) const {
  throw CountMismatch(p, "ranks passed different counts: rank " + std::to_string(rank_) + " expects " +
                             std::to_string(block_bytes) + " bytes from each peer, rank " + std::to_string(p) +
                             (same_op ? " sent " + std::to_string(sent) : " sent a message of another op") +
                             " (every rank must pass the same count and dtype)");
}

// The store, a full fence, then the sleepers load: a waiter either sees
// the flag or is counted there (it counts itself before its last look at
// the flag). The fence waits until the store has left this core, so it
// is deferred (ring_if_sleepers) until the op ends or this rank's own wait
// stops polling: by then the store is out and the fence is cheap, and a
// sleeper is still woken without a slice's delay.
void ShmCollectives::publish(std::atomic<uint64_t>& flag, uint64_t op) {
  flag.store(op, std::memory_order_release);
  ring_pending_ = true;
}

void ShmCollectives::ring_if_sleepers() {
  if (!ring_pending_) return;
  ring_pending_ = false;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell_->sleepers.load() > 0) {
    bell_->word.fetch_add(1);
    futex(&bell_->word, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

template <class Ready>
int ShmCollectives::first_missing(const Ready& ready, int only_peer) const {
  if (only_peer >= 0) return ready(only_peer) ? -1 : only_peer;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && !ready(p)) return p;
  }
  return -1;
}

// The first look is inlined into each op: when every peer is there already
// (a slot to reuse was read long ago, a peer published first), the op
// pays one load per peer and no call.
template <class Ready>
inline void ShmCollectives::wait_until(Ready ready, int only_peer, Deadline& deadline, const char* what) {
  const int p = first_missing(ready, only_peer);
  if (p >= 0) [[unlikely]] wait_for(ready, p, only_peer, deadline, what);
}

template <class Ready>
[[gnu::noinline]] void ShmCollectives::wait_for(Ready ready, int p, int only_peer, Deadline& deadline,
                                                const char* what) {
  auto missing = [&] { return first_missing(ready, only_peer); };
  const bool yielding = yield_.load(std::memory_order_relaxed);
  const int64_t spin_us = spin_us_.load(std::memory_order_relaxed);
  if (spin_forever_.load(std::memory_order_relaxed) ||
      (spin_us > 0 && (!yielding || yield_after_us_.load(std::memory_order_relaxed) > 0))) {
    for (int i = 0; i < kFastPolls; ++i) {
      relax();
      if ((p = missing()) < 0) return;
    }
  }
  ring_if_sleepers();  // this rank may now yield or sleep: its peers must not wait on its publish
  const auto start = Clock::now();
  const auto spin_until = start + std::chrono::microseconds(spin_us);
  const auto yield_from = start + std::chrono::microseconds(yield_after_us_.load(std::memory_order_relaxed));
  for (;;) {
    if (aborted_.load(std::memory_order_relaxed)) {
      throw TransportError(Kind::kAborted, p, std::string(what) + " (shared memory) aborted");
    }
    const auto now = Clock::now();
    if (now >= deadline.at(now)) {
      throw TransportError(Kind::kTimeout, p,
                           std::string(what) + " with rank " + std::to_string(p) + " (shared memory) timed out");
    }
    try {
      t_.check_peer(p);  // throws kPeerFailure once its process has exited
    } catch (const TransportError&) {
      if (!ready(p)) throw;
      // It published, then exited: its part is here.
      if ((p = missing()) < 0) return;
      continue;
    }
    // A peer may be waiting in UCX for a send this rank left in flight.
    const bool sending = t_.progress_in_flight();
    if (spin_forever_.load(std::memory_order_relaxed) || now < spin_until) {
      if (yielding && now >= yield_from) {
        sched_yield();
      } else {
        for (int i = 0; i < kPollsPerCheck; ++i) {
          relax();
          if (missing() < 0) return;
        }
      }
    } else {
      bell_->sleepers.fetch_add(1);
      const uint32_t bell = bell_->word.load();
      if (missing() >= 0) {
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.at(now) - now);
        // With sends in flight, wake soon to progress them.
        const auto slice = std::min<std::chrono::nanoseconds>(
            left, sending ? std::chrono::milliseconds(1) : std::chrono::milliseconds(kSliceMs));
        const timespec ts{static_cast<time_t>(slice.count() / 1000000000),
                          static_cast<long>(slice.count() % 1000000000)};
        futex(&bell_->word, FUTEX_WAIT, bell, &ts);
      }
      bell_->sleepers.fetch_sub(1);
    }
    if ((p = missing()) < 0) return;
  }
}

void ShmCollectives::wait_arrived(uint64_t op, int only_peer, Deadline& deadline) {
  wait_until([&](int p) { return header(p, op)->op.load(std::memory_order_acquire) >= op; }, only_peer,
             deadline, "waiting for the data");
  for (int p = 0; p < size_; ++p) {
    if (only_peer < 0 || p == only_peer) seen_[static_cast<size_t>(p)] = op;
  }
}

// A peer that published op m has finished every op before m, its reading
// included; one that published done has finished reading that op.
void ShmCollectives::reuse_guard(uint64_t op, Deadline& deadline) {
  if (op <= kDepth) return;
  const uint64_t last = op - kDepth;
  wait_until(
      [&](int p) {
        const auto i = static_cast<size_t>(p);
        if (seen_[i] > last || done_seen_[i] >= last) return true;
        done_seen_[i] = flags_[p].done.load(std::memory_order_acquire);
        return done_seen_[i] >= last;
      },
      -1, deadline, "waiting for a slot to be read");
}

ShmCollectives::Reading::~Reading() {
  if (always || !finished) s.publish(s.flags_[s.rank_].done, op);
}

void ShmCollectives::abort() {
  aborted_ = true;
  bell_->word.fetch_add(1);
  futex(&bell_->word, FUTEX_WAKE, INT_MAX, nullptr);
}

void ShmCollectives::run(const plugin::OpDesc& op) {
  Deadline deadline{op.timeout};
  // Whatever the op published, a sleeping peer hears of it before this
  // returns (or throws).
  struct Ring {
    ShmCollectives& s;
    ~Ring() { s.ring_if_sleepers(); }
  } ring{*this};
  switch (op.type) {
    case OpType::kBarrier: return barrier(deadline);
    case OpType::kBroadcast: return broadcast(op, deadline);
    case OpType::kAllReduce: return reduce(op, 1, deadline);
    case OpType::kAllGather: return all_gather(op, deadline);
    case OpType::kReduceScatter: return reduce(op, static_cast<size_t>(size_), deadline);
    default: throw std::logic_error("no shared-memory algorithm for this op");
  }
}

void ShmCollectives::barrier(Deadline& deadline) {
  exchange(nullptr, 0, 0, deadline);
}

void ShmCollectives::exchange_records(const void* record, size_t record_bytes, size_t op_bytes, void* all,
                                      Deadline& deadline) {
  if (record_bytes > kShmMaxBytes) throw std::logic_error("a record larger than a shared-memory slot");
  const uint64_t k = exchange(record, record_bytes, op_bytes, deadline);
  Reading reading(*this, k, false);
  check_lengths(k, op_bytes);
  auto* out = static_cast<unsigned char*>(all);
  for (int r = 0; r < size_; ++r) {
    std::memcpy(out + static_cast<size_t>(r) * record_bytes, slot(r, k) + kHeaderBytes, record_bytes);
  }
  reading.finish();
  ring_if_sleepers();  // this rank goes on to work, not to a wait: wake whoever sleeps on its record now
}

void ShmCollectives::sync(Deadline& deadline) {
  barrier(deadline);
  ring_if_sleepers();
}

void ShmCollectives::broadcast(const plugin::OpDesc& op, Deadline& deadline) {
  const uint64_t k = ++ops_;
  const size_t bytes = op.count * element_size(op.dtype);
  if (rank_ == op.root) {
    reuse_guard(k, deadline);
    write_slot(k, op.input, bytes, bytes);
    if (op.output != op.input) std::memmove(op.output, op.input, bytes);
    return;
  }
  wait_arrived(k, op.root, deadline);
  const Reading reading(*this, k, true);
  check_lengths(k, bytes, op.root);
  std::memcpy(op.output, slot(op.root, k) + kHeaderBytes, bytes);
}

// In rank order, whatever this rank's own: the same bits as the exchange's
// Collectives::reduce_blocks.
void ShmCollectives::reduce_slots(void* out, uint64_t op, size_t offset, size_t count,
                                  cpu_algorithms::ReduceFn fn) const {
  auto block = [&](int r) { return slot(r, op) + kHeaderBytes + offset; };
  fn(out, block(0), block(1), count);
  for (int r = 2; r < size_; ++r) fn(out, out, block(r), count);
}

uint64_t ShmCollectives::exchange(const void* in, size_t bytes, size_t block_bytes, Deadline& deadline) {
  const uint64_t k = ++ops_;
  reuse_guard(k, deadline);
  write_slot(k, in, bytes, block_bytes);
  wait_arrived(k, -1, deadline);
  return k;
}

// all_reduce (blocks 1) and reduce_scatter (blocks = size: each slot holds a
// rank's whole input, and this rank reduces its own block of each).
void ShmCollectives::reduce(const plugin::OpDesc& op, size_t blocks, Deadline& deadline) {
  const cpu_algorithms::ReduceFn fn = cpu_algorithms::reduction_of(op);
  const size_t bytes = op.count * element_size(op.dtype);  // this rank's result
  const uint64_t k = exchange(op.input, bytes * blocks, bytes, deadline);
  Reading reading(*this, k, false);
  check_lengths(k, bytes);
  reduce_slots(op.output, k, blocks > 1 ? static_cast<size_t>(rank_) * bytes : 0, op.count, fn);
  reading.finish();
  cpu_algorithms::finish_reduction(op, op.output, op.count, size_);
}

void ShmCollectives::all_gather(const plugin::OpDesc& op, Deadline& deadline) {
  const size_t bytes = op.count * element_size(op.dtype);
  const uint64_t k = exchange(op.input, bytes, bytes, deadline);
  Reading reading(*this, k, false);
  check_lengths(k, bytes);
  auto* out = static_cast<unsigned char*>(op.output);
  for (int r = 0; r < size_; ++r) std::memcpy(out + static_cast<size_t>(r) * bytes, slot(r, k) + kHeaderBytes, bytes);
  reading.finish();
}

}  // namespace comms::ucx_backend
