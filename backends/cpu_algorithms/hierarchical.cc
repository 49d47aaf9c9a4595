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
void phase(const SubsetTransport& t, const char* name, F&& run) {
  try {
    run();
  } catch (const CountMismatch& e) {
    std::string members;
    for (int r = 0; r < t.size(); ++r) members += (r ? "," : "") + std::to_string(t.base_rank(r));
    throw CountMismatch(t.base_rank(e.peer()), std::string("hierarchical all_reduce, ") + name + " among ranks [" +
                                                   members + "] (numbered 0.." + std::to_string(t.size() - 1) +
                                                   " here): " + e.what());
  }
}

}  // namespace

bool spans_hosts_with_neighbours(const std::vector<int>& host_of) {
  const size_t hosts = leaders_of(host_of).size();
  return hosts > 1 && hosts < host_of.size();
}

Hierarchical::Hierarchical(Transport& transport, const std::vector<int>& host_of)
    : local_transport_(transport, host_members(host_of, transport.rank())),
      local_(local_transport_, std::chrono::milliseconds(0)) {
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
    phase(local_transport_, "the reduce inside the host", [&] {
      local_.reduce(algorithm_for(OpType::kReduce, bytes, local, in_place), in, out, count, es, fn, 0);
    });
  } else if (in != out) {
    std::copy_n(static_cast<const unsigned char*>(in), bytes, static_cast<unsigned char*>(out));
  }
  if (leaders_) {
    time_left(*leaders_, deadline);
    phase(*leaders_transport_, "the all_reduce between hosts", [&] {
      leaders_->all_reduce(algorithm_for(OpType::kAllReduce, bytes, leaders_->size(), in_place), out, out, count, es,
                           fn);
    });
  }
  if (local > 1) {
    time_left(local_, deadline);
    local_.broadcast(algorithm_for(OpType::kBroadcast, bytes, local, in_place), out, out, bytes, 0);
  }
}

}  // namespace comms::cpu_algorithms
