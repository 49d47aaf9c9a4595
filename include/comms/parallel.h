// comms::dist model-parallel groups: Megatron-LM's rank ordering and an
// explicit collection of the groups built from it.
//
//   comms::dist::init_process_group({.device = comms::Device::cpu()});
//   comms::dist::ParallelConfig cfg;
//   cfg.tp = 2;
//   cfg.pp = 2;                               // dp = world / (tp*pp*cp)
//   cfg.create_all_gather_groups = true;
//   auto pgs = comms::dist::initialize_model_parallel(cfg);
//   pgs.dp()->all_reduce(grads, comms::ReduceOp::avg());
//   pgs.get("dp_cp_ag")->all_gather(shard, full);   // overlaps a reduce_scatter on dp_cp
//
// Nothing here is global: several collections may coexist (each has its own
// name prefix). Every group goes through new_group, so COMMS_ROUTE, typed
// options and offload/reload (lifecycle.h) apply to them like to any group.
#pragma once

#include "comms/export.h"

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comms/dist.h"

namespace comms::dist {

using RankLists = std::vector<std::vector<int>>;

// The largest layout described here: every axis size, the world size, and
// rank_offset + world size are at most 2^20 (1,048,576) ranks. Larger values
// are kInvalidArgument errors, so products of axis sizes never overflow and
// a typo ("world=2147483647") cannot allocate without bound.
inline constexpr int kMaxWorldSize = 1 << 20;

// Megatron-LM's RankGenerator. The order string ("tp-cp-ep-dp-pp") lists the
// axes, leftmost varying fastest; axes of size 1 that it leaves out are
// appended; leaving out an axis larger than 1 is an error. ep and cp are never
// both above 1 (Megatron keeps cp in the dense generator, ep in the expert one).
class COMMS_API RankGenerator {
 public:
  // Throws kInvalidArgument naming the problem.
  RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order = "tp-cp-ep-dp-pp",
                int rank_offset = 0);

  // Every group of the axes in `token` ("tp", "dp-cp", "tp-ep-pp", ...; any
  // order of its axes gives the same groups), in Megatron's order, with
  // rank_offset added to every rank.
  RankLists get_ranks(std::string_view token) const;

  int world_size() const { return world_size_; }
  int rank_offset() const { return rank_offset_; }
  // The normalised order, with the appended axes: "tp-cp-ep-dp-pp".
  const std::string& order() const { return order_; }
  int size_of(std::string_view axis) const;

 private:
  std::vector<std::string> axes_;  // in order
  std::vector<int> sizes_;         // the size of each axis in axes_
  std::string order_;
  int world_size_ = 1;
  int rank_offset_ = 0;
};

struct ParallelConfig {
  int tp = 1;
  int pp = 1;
  int cp = 1;
  int ep = 1;
  std::optional<int> expert_tp;  // default: tp
  std::string order = "tp-cp-ep-dp-pp";
  // The collection covers global ranks [rank_offset, rank_offset + world_size).
  int rank_offset = 0;
  std::optional<int> world_size;  // default: the world's size minus rank_offset
  std::optional<std::chrono::milliseconds> timeout;  // default: the world's
  std::string backend;  // "" = the world's backends (as for new_group)
  bool create_gloo_groups = false;        // dp_gloo, dp_cp_gloo, expt_dp_gloo
  bool create_all_gather_groups = false;  // dp_cp_ag, expt_dp_ag
  // Per-group options keyed by group name (see group_names()); Megatron's
  // names ep_tp, tp_ep_mp, ep_dp are accepted for expt_tp, tp_ep, expt_dp
  // (tp_ep_mp configures Megatron's tp-ep group, not tp_ep_pp), and the
  // Megatron groups comms does not create (intra_dp_cp, hcp, intra_ep_dp,
  // inter_ep_dp, intra_dist_opt_instance) are ignored with a warning.
  // dp_cp_ag and expt_dp_ag take dp_cp's and expt_dp's unless given their own.
  std::map<std::string, BackendOptions> group_options;
  // Groups whose NCCL communicators get a high-priority stream (adds
  // is_high_priority_stream to their options).
  std::vector<std::string> high_priority_groups;
  // Prefix of every group name, unique per collection. "" = "mp<N>", N
  // counting the collections this process created since init.
  std::string name;
};

// The group names of a collection, in creation order.
COMMS_API const std::vector<std::string>& group_names();

// One planned group: what initialize_model_parallel creates, computed without
// any communicator (comms-info --parallel prints it).
struct PlannedGroup {
  std::string name;  // "tp", "dp_cp_ag", ...
  RankLists rank_lists;
  std::string backend;  // "" = the world's
  BackendOptions options;
};

struct COMMS_API ParallelPlan {
  int world_size = 0;  // of the collection (not counting rank_offset)
  int dp = 1;
  int expert_tp = 1;
  int expert_dp = 1;
  std::vector<PlannedGroup> groups;  // in creation order
  const PlannedGroup* find(std::string_view name) const;
};

// Validates `config` for a collection of `world_size` ranks and plans every
// group. `world_backend` is the backend the groups inherit when
// config.backend is empty; it decides whether NCCL options may be given (NCCL
// options for a group without an nccl backend are an error, since a Gloo
// communicator would reject them). Throws kInvalidArgument with the reason.
COMMS_API ParallelPlan plan_model_parallel(const ParallelConfig& config, int world_size,
                                 std::string_view world_backend = "");

class ProcessGroupCollection;

// Elastic recovery of a collection (dist.h's recover() for the world and
// plain groups). After a loss the layout is derived again by the rank
// generator for the new world size: dp (and expert dp) shrink, tp, pp, cp,
// ep and the groups made of them stay as they were. That works when the
// lost ranks make up whole data-parallel replicas; otherwise (the world
// size is no longer divisible, or a lost rank breaks a tp/pp/cp/ep group)
// a ShrinkRule picks alive ranks to drop as well.
struct LayoutLoss {
  const ParallelConfig* config = nullptr;
  const ParallelPlan* plan = nullptr;  // the layout before the loss
  int world_size = 0;                  // before the loss
  std::vector<int> lost;               // world ranks before the loss, ascending
};
// Returns the alive world ranks to drop (the same on every rank).
using ShrinkRule = std::function<std::vector<int>(const LayoutLoss&)>;
// The built-in rule: drop every data-parallel replica (every rank with the
// same dp coordinate, across tp, pp and cp) that holds a lost rank.
COMMS_API ShrinkRule drop_replicas();

// Why the layout cannot lose `gone` (world ranks) and be derived again for
// the rest, naming the world sizes and axes; "" when it can.
COMMS_API std::string why_layout_cannot_shrink(const ParallelConfig& config, int world_size,
                                               const std::vector<int>& gone);

// Recovers the world (dist::recover) and reshapes `collection` in place:
// its plan and rank lists become the new layout's, and each group handle of
// this rank refers to the group of the new layout (kept when it lost no rank,
// rebuilt otherwise). With no rule, a loss the layout cannot absorb makes it
// throw Error(kInvalidArgument) saying why (the world and plain groups are
// recovered first; the collection is then unusable: get() repeats the
// reason). Ranks the rule drops get RecoverResult::excluded and should exit.
// The collection must cover the whole world (rank_offset 0), else
// kUnsupported.
COMMS_API RecoverResult recover_model_parallel(ProcessGroupCollection& collection, const ShrinkRule& rule = {},
                                               const AgreeOptions& options = {});

// Growth (dist.h's admit()) with a collection: the members admit the
// waiting newcomers and reshape `collection` in place for the grown world,
// its layout derived again for the new size (dp grows; tp, pp, cp and ep
// stay); the newcomers get it from JoinResult::collection. A new world size
// the layout cannot take leaves the world grown and the collection unusable
// (get() says why): the members get Error(kInvalidArgument), a newcomer's
// JoinResult::collection is unusable alike.
// The collection must cover the whole world (rank_offset 0), else
// kUnsupported before anything happens.
COMMS_API AdmitResult admit_model_parallel(ProcessGroupCollection& collection, const AdmitOptions& options = {});

struct CollectionAccess;

class COMMS_API ProcessGroupCollection {
 public:
  struct Entry {
    Group group;           // this rank's group; empty if it is in none
    RankLists rank_lists;  // every group of this kind
    bool created = false;
  };

  // The group of this rank. Throws kInvalidArgument if the group was not
  // created (an opt-in group not asked for) or this rank is not in it.
  const Group& get(std::string_view name) const;
  // Whether the group was created and this rank is in it.
  bool has(std::string_view name) const;
  const RankLists& rank_lists(std::string_view name) const;
  const Entry& entry(std::string_view name) const;

  const Group& tp() const { return get("tp"); }
  const Group& pp() const { return get("pp"); }
  const Group& cp() const { return get("cp"); }
  const Group& dp() const { return get("dp"); }
  const Group& dp_cp() const { return get("dp_cp"); }
  const Group& mp() const { return get("mp"); }
  const Group& ep() const { return get("ep"); }
  const Group& expt_tp() const { return get("expt_tp"); }
  const Group& expt_dp() const { return get("expt_dp"); }
  const Group& dp_cp_ag() const { return get("dp_cp_ag"); }
  const Group& expt_dp_ag() const { return get("expt_dp_ag"); }

  const std::string& prefix() const { return prefix_; }
  const ParallelConfig& config() const { return config_; }
  const ParallelPlan& plan() const { return plan_; }

 private:
  friend ProcessGroupCollection initialize_model_parallel(const ParallelConfig&);
  friend RecoverResult recover_model_parallel(ProcessGroupCollection&, const ShrinkRule&, const AgreeOptions&);
  friend struct CollectionAccess;
  std::string prefix_;
  std::string unusable_;  // why, after a recovery the layout could not absorb
  ParallelConfig config_;
  ParallelPlan plan_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// Collective over the world: every rank calls it with the same config. Each
// group is created with new_group, named "<prefix>.<group>.<index>".
COMMS_API ProcessGroupCollection initialize_model_parallel(const ParallelConfig& config);

// Per-group communicator options in Megatron's --nccl-communicator-config-path
// layout:
//   dp_cp: {cga_cluster_size: 2, max_ctas: 16, min_ctas: 4, net_name: IB,
//           is_high_priority_stream: true}
//   tp:    {max_ctas: 8}
//   dp_gloo: {gloo: {busy_poll: true}}      # comms' extension for Gloo groups
// Unknown group names, unknown keys and mistyped values are errors naming
// them. Megatron accepts only IB or Socket as net_name; so does this.
COMMS_API std::map<std::string, BackendOptions> parse_communicator_config(std::string_view yaml_text);
COMMS_API std::map<std::string, BackendOptions> load_communicator_config(const std::string& path);

// "world=16,tp=2,pp=4,cp=1,ep=1,etp=1,dp=4,order=tp-pp-dp,rank_offset=0", as
// comms-info --parallel and the example trainer take it. dp, if given, must
// equal what the world gives (checked by the caller, which knows the world).
struct ParallelFlags {
  ParallelConfig config;
  std::optional<int> world;
  std::optional<int> dp;
};
COMMS_API ParallelFlags parse_parallel_flags(std::string_view text);

}  // namespace comms::dist
