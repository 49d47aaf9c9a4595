#include "hierarchical.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "algorithms.h"

namespace comms::cpu_algorithms {
namespace {

using plugin::OpType;

// The ranks on `rank`'s host, in rank order.
std::vector<int> host_members(const std::vector<int>& host_of, int rank) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    if (host_of[static_cast<size_t>(r)] == host_of[static_cast<size_t>(rank)]) out.push_back(r);
  }
  return out;
}

// Each host's lowest rank, in rank order.
std::vector<int> leaders_of(const std::vector<int>& host_of) {
  std::vector<int> out;
  std::map<int, bool> seen;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    if (!seen[host_of[static_cast<size_t>(r)]]) {
      seen[host_of[static_cast<size_t>(r)]] = true;
      out.push_back(r);
    }
  }
  return out;
}

// Runs one phase on `t`; a CountMismatch (which numbers ranks within the
// phase) comes out naming the comm's rank and the phase's members.
template <class F>
void phase(const SubsetTransport& t, const char* op, const char* name, F&& run) {
  try {
    run();
  } catch (const CountMismatch& e) {
    std::string members;
    for (int r = 0; r < t.size(); ++r) members += (r ? "," : "") + std::to_string(t.base_rank(r));
    throw CountMismatch(t.base_rank(e.peer()), std::string("hierarchical ") + op + ", " + name + " among ranks [" +
                                                   members + "] (numbered 0.." + std::to_string(t.size() - 1) +
                                                   " here): " + e.what());
  }
}

}  // namespace

bool spans_hosts_with_neighbours(const std::vector<int>& host_of) {
  const size_t hosts = leaders_of(host_of).size();
  return hosts > 1 && hosts < host_of.size();
}

bool hosts_of_equal_size(const std::vector<int>& host_of) {
  const size_t first = host_members(host_of, 0).size();
  for (int leader : leaders_of(host_of)) {
    if (host_members(host_of, leader).size() != first) return false;
  }
  return true;
}

Hierarchical::Hierarchical(Transport& transport, const std::vector<int>& host_of)
    : local_transport_(transport, host_members(host_of, transport.rank())),
      local_(local_transport_, std::chrono::milliseconds(0)),
      equal_hosts_(hosts_of_equal_size(host_of)) {
  for (int leader : leaders_of(host_of)) {
    for (int r : host_members(host_of, leader)) gathered_order_.push_back(r);
  }
  gathered_in_rank_order_ = true;
  for (size_t i = 0; i < gathered_order_.size(); ++i) {
    gathered_in_rank_order_ = gathered_in_rank_order_ && gathered_order_[i] == static_cast<int>(i);
  }
  // The broadcast inside a host takes any size only where sends are in place.
  if (!transport.sends_in_place()) throw std::logic_error("the hierarchical all_reduce needs in-place sends (UCX)");
  const std::vector<int> leaders = leaders_of(host_of);
  if (local_transport_.rank() == 0) {
    leaders_transport_.emplace(transport, leaders);
    leaders_ = std::make_unique<Collectives>(*leaders_transport_, std::chrono::milliseconds(0));
  }
}

void Hierarchical::time_left(Collectives& c, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  c.set_timeout(std::max(left, std::chrono::milliseconds(1)));
}

void Hierarchical::all_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn,
                              std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const size_t bytes = count * es;
  const bool in_place = local_transport_.sends_in_place();
  const int local = local_transport_.size();
  if (local > 1) {
    time_left(local_, deadline);
    phase(local_transport_, "all_reduce", "the reduce inside the host", [&] {
      local_.reduce(algorithm_for(OpType::kReduce, bytes, local, in_place), in, out, count, es, fn, 0);
    });
  } else if (in != out) {
    std::copy_n(static_cast<const unsigned char*>(in), bytes, static_cast<unsigned char*>(out));
  }
  if (leaders_) {
    time_left(*leaders_, deadline);
    phase(*leaders_transport_, "all_reduce", "the all_reduce between hosts", [&] {
      leaders_->all_reduce(algorithm_for(OpType::kAllReduce, bytes, leaders_->size(), in_place), out, out, count, es,
                           fn);
    });
  }
  if (local > 1) {
    time_left(local_, deadline);
    local_.broadcast(algorithm_for(OpType::kBroadcast, bytes, local, in_place), out, out, bytes, 0);
  }
}

void Hierarchical::all_gather(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout) {
  if (!equal_hosts_) throw std::logic_error("the hierarchical all_gather needs hosts of equal size");
  const auto deadline = Clock::now() + timeout;
  const bool in_place = local_transport_.sends_in_place();
  const int local = local_transport_.size();
  const size_t host_bytes = bytes * static_cast<size_t>(local);
  const size_t total = bytes * gathered_order_.size();
  if (host_blocks_.size() < host_bytes) host_blocks_.resize(host_bytes);
  // Into scratch: `in` may be a block of `out`, which the later phases write.
  if (local > 1) {
    time_left(local_, deadline);
    phase(local_transport_, "all_gather", "the all_gather inside the host", [&] {
      local_.all_gather(algorithm_for(OpType::kAllGather, bytes, local, in_place), in, host_blocks_.data(), bytes);
    });
  } else {
    std::copy_n(static_cast<const unsigned char*>(in), bytes, host_blocks_.data());
  }
  if (leaders_) {
    unsigned char* const o = static_cast<unsigned char*>(out);
    if (!gathered_in_rank_order_ && gathered_.size() < total) gathered_.resize(total);
    unsigned char* const all = gathered_in_rank_order_ ? o : gathered_.data();
    time_left(*leaders_, deadline);
    phase(*leaders_transport_, "all_gather", "the all_gather between hosts", [&] {
      leaders_->all_gather(algorithm_for(OpType::kAllGather, host_bytes, leaders_->size(), in_place),
                           host_blocks_.data(), all, host_bytes);
    });
    if (!gathered_in_rank_order_) {
      for (size_t i = 0; i < gathered_order_.size(); ++i) {
        std::copy_n(all + i * bytes, bytes, o + static_cast<size_t>(gathered_order_[i]) * bytes);
      }
    }
  }
  if (local > 1) {
    time_left(local_, deadline);
    phase(local_transport_, "all_gather", "the broadcast inside the host", [&] {
      local_.broadcast(algorithm_for(OpType::kBroadcast, total, local, in_place), out, out, total, 0);
    });
  }
}

}  // namespace comms::cpu_algorithms
