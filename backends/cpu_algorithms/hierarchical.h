// all_reduce and all_gather over ranks grouped by host, as Open MPI's and
// NCCL's hierarchical collectives. all_reduce: reduce inside each host to
// its leader (its lowest rank; on UCX the data moves through shared memory
// or direct copies), all_reduce among the leaders (the only traffic between
// hosts: once per host rather than once per rank), broadcast inside each
// host. all_gather (hosts of equal size): all_gather inside each host, the
// leaders all_gather their hosts' blocks, each leader puts them in rank
// order and broadcasts the whole result inside its host.
// The leaders' all_reduce leaves the same bits on every leader (its
// reductions run in rank order) and the broadcast copies them, so every
// rank gets the same bits; they may differ from the flat algorithms' in the
// last place, since the sum is grouped by host.
//
// Each phase is a Collectives op on a SubsetTransport (subset_transport.h)
// with the algorithm algorithm_for gives at that phase's size and ranks,
// and the time left of the op's timeout: one deadline for the whole op.
// It needs a transport that sends in place (UCX's), whose broadcasts take
// any size.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "collectives.h"
#include "reductions.h"
#include "subset_transport.h"
#include "transport.h"

namespace comms::cpu_algorithms {

// Whether a comm whose ranks sit on hosts host_of[rank] gains from the
// hierarchy: more than one host, and some host with more than one rank.
bool spans_hosts_with_neighbours(const std::vector<int>& host_of);
// Whether every host has the same number of ranks (Hierarchical::all_gather's
// leaders then trade blocks of one size).
bool hosts_of_equal_size(const std::vector<int>& host_of);

class Hierarchical {
 public:
  // host_of[r]: the host of rank r, the same table on every rank (hosts
  // numbered in any order). The transport must outlive this object.
  Hierarchical(Transport& transport, const std::vector<int>& host_of);

  // out = reduction over every rank of in (in may equal out), finished by
  // the caller (finish_reduction over the whole comm's size).
  void all_reduce(const void* in, void* out, size_t count, size_t es, ReduceFn fn, std::chrono::milliseconds timeout);
  // out = every rank's `bytes` of in, in rank order (in may be out's block
  // of this rank). Needs hosts_of_equal_size.
  void all_gather(const void* in, void* out, size_t bytes, std::chrono::milliseconds timeout);

 private:
  // Gives `c` the time left until deadline (at least 1 ms: a wait then
  // fails with a timeout rather than never starting).
  static void time_left(Collectives& c, Clock::time_point deadline);

  SubsetTransport local_transport_;
  Collectives local_;
  bool equal_hosts_;
  // The comm's ranks in the order the leaders' all_gather leaves their
  // blocks (each host's ranks in rank order, hosts in their leaders'
  // order), and whether that is rank order itself.
  std::vector<int> gathered_order_;
  bool gathered_in_rank_order_;
  std::vector<unsigned char> host_blocks_, gathered_;  // all_gather's scratch
  std::optional<SubsetTransport> leaders_transport_;  // on a host's leader only
  std::unique_ptr<Collectives> leaders_;
};

}  // namespace comms::cpu_algorithms
