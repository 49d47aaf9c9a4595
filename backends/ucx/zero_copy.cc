#include "zero_copy.h"

#include <cstring>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

#include "host_shared_memory.h"
#include "plan.h"
#include "zero_copy_kernels.h"

namespace comms::ucx_backend {

using plugin::OpType;

// What each rank publishes per op: where its buffers lie (inode 0: not
// host-shared, or not needed), and its released allocations so far.
struct ZeroCopy::Record {
  host_shared::Location input, output;
  uint64_t releases = 0;
  uint64_t ready = 0;  // all this rank needs is host-shared (step 1), mapped (step 2)
};
static_assert(std::is_trivially_copyable_v<host_shared::Location>, "records are copied through shared memory");

namespace {

bool same_place(const host_shared::Location& a, const host_shared::Location& b) {
  return a.fd == b.fd && a.inode == b.inode && a.alloc_bytes == b.alloc_bytes && a.offset == b.offset;
}

}  // namespace

bool ZeroCopy::all_ready(const Record& mine, size_t op_bytes, ShmCollectives::Deadline& deadline) {
  shm_.exchange_records(&mine, sizeof mine, op_bytes, records_.data(), deadline);
  for (const Record& r : records_) {
    if (!r.ready) {
      last_ran_ = false;  // the op falls back on every rank
      return false;
    }
  }
  return true;
}

bool ZeroCopy::same_as_last(const std::vector<Record>& now) const {
  if (!last_ran_) return false;
  for (size_t r = 0; r < now.size(); ++r) {
    const Record &a = now[r], &b = last_records_[r];
    if (!same_place(a.input, b.input) || !same_place(a.output, b.output) || a.releases != b.releases) return false;
  }
  return true;
}

ZeroCopy::ZeroCopy(ShmCollectives& shm, int rank, std::vector<int> pids, LogFn log)
    : shm_(shm),
      rank_(rank),
      size_(static_cast<int>(pids.size())),
      log_(std::move(log)),
      peers_(pids.size()),
      records_(pids.size()),
      inputs_(pids.size()),
      outputs_(pids.size()) {
  for (size_t p = 0; p < pids.size(); ++p) peers_[p].pid = pids[p];
}

ZeroCopy::~ZeroCopy() {
  for (Peer& p : peers_) drop_mappings(p);
}

void ZeroCopy::drop_mappings(Peer& p) {
  for (const Mapping& m : p.mappings) host_shared::unmap_peer(m.base, m.bytes);
  p.mappings.clear();
}

unsigned char* ZeroCopy::map(int peer, const Record& r, bool output) {
  const host_shared::Location& at = output ? r.output : r.input;
  Peer& p = peers_[static_cast<size_t>(peer)];
  for (const Mapping& m : p.mappings) {
    if (m.inode == at.inode && m.bytes == at.alloc_bytes) return m.base + at.offset;
  }
  std::string why_not;
  auto* base = static_cast<unsigned char*>(host_shared::map_peer(p.pid, at, &why_not));
  if (!base) {
    if (log_) {
      log_(2, ("ucx: rank " + std::to_string(peer) + "'s " + (output ? "output" : "input") +
               " is host-shared memory, but mapping it failed (" + why_not + "); the op takes the usual path")
                  .c_str());
    }
    return nullptr;
  }
  p.mappings.push_back({at.inode, base, at.alloc_bytes});
  return base + at.offset;
}

void ZeroCopy::abort() {
  // Tried in a loop, not with a timed mutex: libstdc++'s try_lock_for goes
  // through pthread_mutex_clocklock, which ThreadSanitizer does not see acquire.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (!lock.owns_lock() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)lock.try_lock();
  }
  if (!lock.owns_lock()) return;  // the destructor unmaps them at finalize
  aborted_ = true;
  for (Peer& p : peers_) drop_mappings(p);
}

bool ZeroCopy::run(const plugin::OpDesc& op) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw cpu_algorithms::TransportError(cpu_algorithms::TransportError::Kind::kAborted, -1, "aborted");
  ShmCollectives::Deadline deadline{op.timeout};
  const size_t op_bytes = cpu_algorithms::bytes_of(op);
  // 1. Where this rank's buffers lie.
  const cpu_algorithms::ZeroCopyNeeds need = cpu_algorithms::zero_copy_needs(op, rank_, size_);
  Record mine;
  bool ready = true;
  if (need.input_bytes) {
    const auto at = host_shared::find(op.input, need.input_bytes);
    ready = ready && at;
    if (at) mine.input = *at;
  }
  if (need.output_bytes) {
    const auto at = host_shared::find(op.output, need.output_bytes);
    ready = ready && at;
    if (at) mine.output = *at;
  }
  mine.releases = host_shared::releases();
  mine.ready = ready;
  if (!all_ready(mine, op_bytes, deadline)) return false;
  // 2. Every peer's buffers, mapped here. Every rank published the same
  // records as for the last op that ran here (the same allocations, nothing
  // freed since): every rank mapped them all then and holds them still, so
  // every rank skips asking, alike.
  const bool mapped_before = same_as_last(records_);
  ready = true;
  for (int q = 0; q < size_; ++q) {
    const auto i = static_cast<size_t>(q);
    if (q == rank_) {
      inputs_[i] = op.input;
      outputs_[i] = op.output;
      continue;
    }
    const Record& r = records_[i];
    Peer& p = peers_[i];
    if (r.releases != p.releases_seen) {
      drop_mappings(p);
      p.releases_seen = r.releases;
    }
    const cpu_algorithms::ZeroCopyNeeds theirs = cpu_algorithms::zero_copy_needs(op, q, size_);
    inputs_[i] = theirs.input_bytes ? map(q, r, false) : nullptr;
    outputs_[i] = theirs.output_bytes ? map(q, r, true) : nullptr;
    ready = ready && (inputs_[i] || !theirs.input_bytes) && (outputs_[i] || !theirs.output_bytes);
  }
  if (mapped_before && !ready) throw std::logic_error("a zero-copy mapping held since the last op is gone");
  if (!mapped_before) {
    last_records_ = records_;  // before the exchange below overwrites them
    mine.ready = ready;
    if (!all_ready(mine, op_bytes, deadline)) return false;
  }
  // 3. This rank's share, then every rank's.
  last_ran_ = false;  // until every rank is through: an op that throws leaves it so
  cpu_algorithms::run_zero_copy_share(op, rank_, size_, inputs_.data(), outputs_.data());
  shm_.sync(deadline);
  last_ran_ = true;
  if (mapped_before) held_ops_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace comms::ucx_backend
