// The process-wide state behind comms::dist (internal).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "comms/dist.h"
#include "comms/parallel.h"

namespace comms::dist {

class GroupState {
 public:
  GroupSpec spec;
  std::shared_ptr<Comm> comm;   // null on ranks that are not members
  std::optional<Device> device; // the bound device, kept for replays
  bool destroyed = false;
  // Created while a Session was alive (or the world a Session created):
  // shutdown() destroys exactly these.
  bool library_owned = false;
  // Device types released by offload_groups and not yet reloaded. Kept on
  // non-members too, so every rank replays the same collective splits.
  std::set<DeviceType> offloaded;
  // Made by split_group: non-members do not know its rank list, so a
  // recovery splits it again from its parent on every rank.
  bool from_split_group = false;
};

struct Registry {
  std::mutex mu;
  std::shared_ptr<GroupState> world;
  std::vector<std::shared_ptr<GroupState>> groups;  // creation order, world first
  uint64_t next_index = 0;
  int next_name = 0;  // pg<N>: every rank counts every new_group call alike
  int collections = 0;  // mp<N>: model-parallel collections made since init
  Route route = Route::kDirect;
  int sessions = 0;  // live Session objects
};

Registry& registry();
void destroy_state(GroupState& s);
// An abandoned comm (recovery, growth): its peers abandon it too, so abort
// (local) and release; a failure to release is logged.
void retire(std::shared_ptr<Comm>& comm, const std::string& why);
// Creates the communicator of a group spec on this rank, named `comm_name`
// ("" = spec.name). Collective over the members (direct route) or the
// parent (split route); null on non-members.
std::shared_ptr<Comm> create_group_comm(const GroupSpec& spec, const GroupState& parent, int member_rank,
                                        const std::string& comm_name = "");

// new_group's work under a given name (options.name, never empty): the
// spec checked, the comm created (named `comm_name`, "" = the group's name)
// and the group registered. Collective as new_group; the state of a
// non-member has no comm.
std::shared_ptr<GroupState> create_group(std::span<const int> ranks, const GroupOptions& options,
                                         const std::string& comm_name = "");

// The options of a model-parallel collection's group `index` of kind
// `planned`, named "<prefix>.<kind>.<index>".
GroupOptions collection_group_options(const ParallelConfig& config, const std::string& prefix,
                                      const PlannedGroup& planned, size_t index);

// Growth (grow.cc): a collection that admit() reshapes for the grown world.
struct CollectionGrowth {
  std::string record;  // what the newcomer needs to build it (parallel_grow.cc)
  std::function<void(uint64_t epoch, AdmitResult& out)> reshape;
};
AdmitResult admit_world(const AdmitOptions& options, const CollectionGrowth* collection);
// On a newcomer: the collection of `record`, reshaped as the members did.
std::shared_ptr<ProcessGroupCollection> join_collection(const std::string& record, uint64_t epoch, AdmitResult& out);

// What recovery and growth both ask of a collection before reshaping it:
// usable, and covering the whole world (else kInvalidArgument or
// kUnsupported, naming `reshape`: "recovery" or "growth").
void check_reshapable(const ProcessGroupCollection& c, const char* reshape);

// Megatron's communicator-config keys for our groups (parallel_state.py's
// get_nccl_options names): ep_tp -> expt_tp, tp_ep_mp -> tp_ep (Megatron's
// tp-ep group, EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP), ep_dp -> expt_dp;
// any other name is returned as is.
std::string canonical_group_name(const std::string& name);
bool is_megatron_alias(const std::string& name);
// Megatron keys of groups this library does not create (hierarchical
// context parallel, partial distributed-optimizer instances): a Megatron
// file with them loads, and their options are ignored with a warning.
bool is_megatron_only_group(const std::string& name);

}  // namespace comms::dist
