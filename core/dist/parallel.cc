#include "comms/parallel.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>

#include "dist_state.h"
#include "util/log.h"
#include "util/strutil.h"

namespace comms::dist {
namespace {

[[noreturn]] void invalid(const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, str::cat("comms::dist model parallel: ", why));
}

constexpr std::array<std::string_view, 5> kAxes = {"tp", "pp", "dp", "ep", "cp"};

// Mixed-radix digits of `index`, the first digit varying fastest.
std::vector<int> digits(int index, const std::vector<int>& radices) {
  std::vector<int> out(radices.size());
  for (size_t i = 0; i < radices.size(); ++i) {
    out[i] = index % radices[i];
    index /= radices[i];
  }
  return out;
}

// An axis or world size: 1..kMaxWorldSize.
void check_size(std::string_view what, int64_t v) {
  if (v < 1) invalid(str::cat(what, " must be at least 1, got ", v));
  if (v > kMaxWorldSize) {
    invalid(str::cat(what, " = ", v, " is more than the largest supported world, ", kMaxWorldSize, " ranks"));
  }
}

// The highest rank, rank_offset + world - 1, must stay below kMaxWorldSize.
void check_offset(int64_t rank_offset, int64_t world) {
  if (rank_offset < 0) invalid(str::cat("rank_offset must not be negative, got ", rank_offset));
  if (rank_offset + world > kMaxWorldSize) {
    invalid(str::cat("rank_offset ", rank_offset, " + ", world, " ranks goes past the largest supported world, ",
                     kMaxWorldSize, " ranks"));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// RankGenerator

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order,
                             int rank_offset)
    : rank_offset_(rank_offset) {
  const std::array<int, 5> size_by_axis = {tp, pp, dp, ep, cp};  // kAxes order
  int64_t world = 1;
  for (size_t i = 0; i < kAxes.size(); ++i) {
    check_size(kAxes[i], size_by_axis[i]);
    world *= size_by_axis[i];  // both at most 2^20 here: no overflow in 64 bits
    if (world > kMaxWorldSize) {
      invalid(str::cat("tp*pp*dp*ep*cp = ", tp, "*", pp, "*", dp, "*", ep, "*", cp,
                       " is more than the largest supported world, ", kMaxWorldSize, " ranks"));
    }
  }
  if (ep > 1 && cp > 1) {
    invalid(str::cat("ep (", ep, ") and cp (", cp,
                     ") cannot both be above 1 in one rank generator: cp belongs to the dense "
                     "generator, ep to the expert one"));
  }
  check_offset(rank_offset, world);
  auto size_of_axis = [&](std::string_view axis) {
    return size_by_axis[static_cast<size_t>(std::find(kAxes.begin(), kAxes.end(), axis) - kAxes.begin())];
  };
  const std::string lowered_order = str::lower(order);  // outlives the views split returns
  for (std::string_view raw : str::split(lowered_order, '-', true)) {
    const std::string axis(str::strip(raw));
    if (std::find(kAxes.begin(), kAxes.end(), axis) == kAxes.end()) {
      invalid(str::cat("order '", order, "' names '", axis, "'; the axes are tp, pp, dp, ep, cp"));
    }
    if (std::find(axes_.begin(), axes_.end(), axis) != axes_.end()) {
      invalid(str::cat("order '", order, "' names '", axis, "' twice"));
    }
    axes_.push_back(axis);
  }
  for (std::string_view axis : kAxes) {
    if (std::find(axes_.begin(), axes_.end(), axis) != axes_.end()) continue;
    if (size_of_axis(axis) != 1) {
      invalid(str::cat(axis, " is ", size_of_axis(axis), " but the order '", order,
                       "' does not place it; add it to the order"));
    }
    axes_.emplace_back(axis);  // size 1: its position changes no rank
  }
  for (const auto& axis : axes_) {
    sizes_.push_back(size_of_axis(axis));
    world_size_ *= sizes_.back();
  }
  order_ = str::join(axes_, "-");
}

int RankGenerator::size_of(std::string_view axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i] == axis) return sizes_[i];
  invalid(str::cat("'", axis, "' is not an axis; the axes are tp, pp, dp, ep, cp"));
}

RankLists RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> in_group(axes_.size(), false);
  const std::string lowered_token = str::lower(token);  // outlives the views split returns
  for (std::string_view raw : str::split(lowered_token, '-', true)) {
    const std::string axis(str::strip(raw));
    auto it = std::find(axes_.begin(), axes_.end(), axis);
    if (it == axes_.end()) invalid(str::cat("token '", token, "' names '", axis, "'; the axes are tp, pp, dp, ep, cp"));
    const size_t i = static_cast<size_t>(it - axes_.begin());
    if (in_group[i]) invalid(str::cat("token '", token, "' names '", axis, "' twice"));
    in_group[i] = true;
  }
  // A rank is sum(coordinate[axis] * stride[axis]), the stride of an axis
  // being the product of the sizes before it in the order. Members of one
  // group differ only in the token's axes; groups differ in the others.
  std::vector<int> member_sizes, member_strides, group_sizes, group_strides;
  int stride = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    (in_group[i] ? member_sizes : group_sizes).push_back(sizes_[i]);
    (in_group[i] ? member_strides : group_strides).push_back(stride);
    stride *= sizes_[i];
  }
  int group_size = 1;
  for (int s : member_sizes) group_size *= s;
  const int num_groups = world_size_ / group_size;
  RankLists out(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    const std::vector<int> gd = digits(g, group_sizes);
    int base = rank_offset_;
    for (size_t i = 0; i < gd.size(); ++i) base += gd[i] * group_strides[i];
    auto& list = out[static_cast<size_t>(g)];
    list.reserve(static_cast<size_t>(group_size));
    for (int m = 0; m < group_size; ++m) {
      const std::vector<int> md = digits(m, member_sizes);
      int rank = base;
      for (size_t i = 0; i < md.size(); ++i) rank += md[i] * member_strides[i];
      list.push_back(rank);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Planning

const std::vector<std::string>& group_names() {
  static const std::vector<std::string> names = {
      "dp_cp", "dp_cp_ag", "dp_cp_gloo", "dp",      "dp_gloo",  "cp",     "mp",      "tp",
      "pp",    "embd",     "pos_embd",   "tp_dp_cp", "tp_dp",   "tp_cp",  "ep",      "expt_tp",
      "tp_ep", "tp_ep_pp", "expt_dp",    "expt_dp_ag", "expt_dp_gloo"};
  return names;
}

std::string canonical_group_name(const std::string& name) {
  if (name == "ep_tp") return "expt_tp";
  if (name == "tp_ep_mp") return "tp_ep";
  if (name == "ep_dp") return "expt_dp";
  return name;
}

bool is_megatron_alias(const std::string& name) { return canonical_group_name(name) != name; }

bool is_megatron_only_group(const std::string& name) {
  static const std::set<std::string> kNames = {"intra_dp_cp", "hcp", "intra_ep_dp", "inter_ep_dp",
                                               "intra_dist_opt_instance"};
  return kNames.count(name) > 0;
}

namespace {

void check_group_name(const std::string& name, std::string_view what) {
  const auto& names = group_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    invalid(str::cat(what, " names an unknown group '", name, "'; the groups are ", str::join(names, ", "),
                     " (Megatron's ep_tp, tp_ep_mp, ep_dp are accepted too)"));
  }
}

bool has_nccl(std::string_view backend) { return str::lower(backend).find("nccl") != std::string::npos; }

}  // namespace

const PlannedGroup* ParallelPlan::find(std::string_view name) const {
  for (const auto& g : groups)
    if (g.name == name) return &g;
  return nullptr;
}

namespace {

// The data-parallel sizes (dense and expert) the world size leaves.
ParallelPlan plan_sizes(const ParallelConfig& c, int world_size) {
  check_size("the world size", world_size);
  for (auto [axis, v] : {std::pair{"tp", c.tp}, {"pp", c.pp}, {"cp", c.cp}, {"ep", c.ep}}) check_size(axis, v);
  check_offset(c.rank_offset, world_size);
  ParallelPlan plan;
  plan.world_size = world_size;
  // Each factor is at most 2^20: their products fit in 64 bits.
  const int64_t model = int64_t{c.tp} * c.pp * c.cp;
  if (world_size % model != 0) {
    invalid(str::cat("the world size ", world_size, " is not divisible by tp*pp*cp = ", c.tp, "*", c.pp, "*",
                     c.cp, " = ", model));
  }
  plan.dp = static_cast<int>(world_size / model);
  plan.expert_tp = c.expert_tp.value_or(c.tp);
  check_size("expert_tp", plan.expert_tp);
  const int64_t expert_model = int64_t{plan.expert_tp} * c.ep * c.pp;
  if (world_size % expert_model != 0) {
    invalid(str::cat("the world size ", world_size, " is not divisible by expert_tp*ep*pp = ", plan.expert_tp,
                     "*", c.ep, "*", c.pp, " = ", expert_model));
  }
  plan.expert_dp = static_cast<int>(world_size / expert_model);
  return plan;
}

// The options of each group by its canonical name (high-priority groups
// included), checked against the group names.
std::map<std::string, BackendOptions> options_by_group(const ParallelConfig& c) {
  std::map<std::string, BackendOptions> options;
  for (const auto& [raw, o] : c.group_options) {
    const std::string name = canonical_group_name(raw);
    if (is_megatron_only_group(name)) {
      log::warning(str::cat("comms::dist model parallel: group_options for Megatron's '", name,
                            "' are ignored: comms does not create that group"));
      continue;
    }
    check_group_name(name, "group_options");
    if (options.count(name)) invalid(str::cat("group_options gives '", name, "' twice (directly and by alias)"));
    options[name] = o;
  }
  for (const auto& raw : c.high_priority_groups) {
    const std::string name = canonical_group_name(raw);
    check_group_name(name, "high_priority_groups");
    options[name].nccl.is_high_priority_stream = true;
  }
  return options;
}

}  // namespace

ParallelPlan plan_model_parallel(const ParallelConfig& c, int world_size, std::string_view world_backend) {
  ParallelPlan plan = plan_sizes(c, world_size);
  const RankGenerator dense(c.tp, 1, plan.dp, c.pp, c.cp, c.order, c.rank_offset);
  const RankGenerator expert(plan.expert_tp, c.ep, plan.expert_dp, c.pp, 1, c.order, c.rank_offset);
  // Both Megatron invariants: pipeline stages are shared by dense and expert
  // layers, so their pp groups must coincide.
  if (!str::lower(c.order).ends_with("pp") && c.pp > 1 && plan.expert_dp != plan.dp) {
    invalid(str::cat("with an order that does not end in pp ('", c.order,
                     "') the dense and expert data-parallel sizes must match (dp ", plan.dp, ", expert dp ",
                     plan.expert_dp, ")"));
  }
  if (dense.get_ranks("pp") != expert.get_ranks("pp")) {
    invalid(str::cat("order '", c.order, "' gives the dense and expert layers different pipeline groups"));
  }

  const std::map<std::string, BackendOptions> options = options_by_group(c);
  auto add = [&](std::string name, RankLists lists, std::string backend = {}, std::string options_from = {}) {
    PlannedGroup g;
    g.name = name;
    g.rank_lists = std::move(lists);
    g.backend = std::move(backend);
    if (auto it = options.find(name); it != options.end()) {
      g.options = it->second;
    } else if (!options_from.empty()) {
      if (auto from = options.find(options_from); from != options.end()) g.options = from->second;
    }
    const std::string effective = !g.backend.empty() ? g.backend : !c.backend.empty() ? c.backend : std::string(world_backend);
    if (g.options.nccl != NcclOptions{} && !effective.empty() && !has_nccl(effective)) {
      BackendOptions nccl_only;
      nccl_only.nccl = g.options.nccl;
      std::vector<std::string> keys;
      for (const auto& [k, v] : to_hints(nccl_only)) keys.push_back(k);
      invalid(str::cat("group '", name, "' is given NCCL options (", str::join(keys, ", "),
                       ") but its backend '", effective,
                       "' has no nccl; a Gloo communicator would reject them. Drop them for a CPU-only run, "
                       "or create the world with 'cpu:gloo,cuda:nccl'"));
    }
    plan.groups.push_back(std::move(g));
  };

  // Megatron's creation order; the opt-in twins follow the group they copy.
  const RankLists dp_cp = dense.get_ranks("dp-cp");
  add("dp_cp", dp_cp);
  if (c.create_all_gather_groups) add("dp_cp_ag", dp_cp, {}, "dp_cp");
  if (c.create_gloo_groups) add("dp_cp_gloo", dp_cp, "gloo");
  const RankLists dp = dense.get_ranks("dp");
  add("dp", dp);
  if (c.create_gloo_groups) add("dp_gloo", dp, "gloo");
  add("cp", dense.get_ranks("cp"));
  add("mp", dense.get_ranks("tp-pp"));
  add("tp", dense.get_ranks("tp"));
  const RankLists pp = dense.get_ranks("pp");
  add("pp", pp);
  RankLists embd, pos_embd;
  for (const auto& stages : pp) {
    embd.push_back(stages.size() == 1 ? stages : std::vector<int>{stages.front(), stages.back()});
    pos_embd.push_back({stages.front()});
  }
  add("embd", embd);
  add("pos_embd", pos_embd);
  add("tp_dp_cp", dense.get_ranks("tp-dp-cp"));
  add("tp_dp", dense.get_ranks("tp-dp"));
  add("tp_cp", dense.get_ranks("tp-cp"));
  add("ep", expert.get_ranks("ep"));
  add("expt_tp", expert.get_ranks("tp"));
  add("tp_ep", expert.get_ranks("tp-ep"));
  add("tp_ep_pp", expert.get_ranks("tp-ep-pp"));
  const RankLists expt_dp = expert.get_ranks("dp");
  add("expt_dp", expt_dp);
  if (c.create_all_gather_groups) add("expt_dp_ag", expt_dp, {}, "expt_dp");
  if (c.create_gloo_groups) add("expt_dp_gloo", expt_dp, "gloo");

  for (const auto& [name, o] : options) {
    if (!plan.find(name)) {
      invalid(str::cat("options are given for '", name, "', which this configuration does not create (set ",
                       name.ends_with("_ag") ? "create_all_gather_groups" : "create_gloo_groups", ")"));
    }
  }
  return plan;
}

// ---------------------------------------------------------------------------
// The collection

const ProcessGroupCollection::Entry& ProcessGroupCollection::entry(std::string_view name) const {
  if (!unusable_.empty()) invalid(str::cat("collection '", prefix_, "' is unusable: ", unusable_));
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    invalid(str::cat("collection '", prefix_, "' has no group '", name, "'; the groups are ",
                     str::join(group_names(), ", ")));
  }
  return it->second;
}

const Group& ProcessGroupCollection::get(std::string_view name) const {
  const Entry& e = entry(name);
  if (!e.created) {
    invalid(str::cat("group '", name, "' of collection '", prefix_, "' was not created: set ParallelConfig::",
                     name.ends_with("_ag") ? "create_all_gather_groups" : "create_gloo_groups"));
  }
  if (!e.group) {
    invalid(str::cat("this rank (", is_initialized() ? world().rank() : -1, ") is in no '", name, "' group of collection '", prefix_,
                     "'; its groups are ", [&] {
                       std::vector<std::string> lists;
                       for (const auto& l : e.rank_lists) lists.push_back(str::cat("[", str::join(l, ","), "]"));
                       return str::join(lists, " ");
                     }()));
  }
  return e.group;
}

bool ProcessGroupCollection::has(std::string_view name) const {
  if (!unusable_.empty()) return false;
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.created && it->second.group;
}

const RankLists& ProcessGroupCollection::rank_lists(std::string_view name) const { return entry(name).rank_lists; }

GroupOptions collection_group_options(const ParallelConfig& config, const std::string& prefix,
                                      const PlannedGroup& planned, size_t index) {
  GroupOptions o;
  o.backend = planned.backend.empty() ? config.backend : planned.backend;
  o.timeout = config.timeout;
  o.options = planned.options;
  o.name = str::cat(prefix, ".", planned.name, ".", index);
  o.description = str::cat(planned.name, " group ", index, " of collection ", prefix, " (order ", config.order,
                           ", rank_offset ", config.rank_offset, ")");
  return o;
}

ProcessGroupCollection initialize_model_parallel(const ParallelConfig& config) {
  Group w = world();
  if (config.rank_offset < 0) invalid(str::cat("rank_offset must not be negative, got ", config.rank_offset));
  const int size = config.world_size.value_or(w.size() - config.rank_offset);
  if (size < 1 || int64_t{config.rank_offset} + size > w.size()) {
    invalid(str::cat("ranks [", config.rank_offset, ", ", config.rank_offset + size, ") do not fit in the world of ",
                     w.size(), " ranks"));
  }
  ProcessGroupCollection out;
  out.config_ = config;
  out.plan_ = plan_model_parallel(config, size, w.backend());

  // The default prefix counts collections made since init; every rank makes
  // them in the same order, so it agrees (a newcomer gets the count).
  int collections = 0;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    collections = ++reg.collections;
  }
  out.prefix_ = config.name.empty() ? str::cat("mp", collections) : config.name;
  for (const Group& g : groups()) {
    const std::string& existing = g.state()->spec.name;
    if (existing.starts_with(out.prefix_ + ".")) {
      invalid(str::cat("a collection named '", out.prefix_, "' already exists (group '", existing,
                       "'); give ParallelConfig::name a unique prefix"));
    }
  }

  for (const auto& name : group_names()) out.entries_[name] = {};
  for (const PlannedGroup& planned : out.plan_.groups) {
    auto& e = out.entries_[planned.name];
    e.created = true;
    e.rank_lists = planned.rank_lists;
    for (size_t i = 0; i < planned.rank_lists.size(); ++i) {
      const GroupOptions o = collection_group_options(config, out.prefix_, planned, i);
      Group g = new_group(planned.rank_lists[i], o);  // collective: every rank, every list
      if (g) e.group = g;
    }
  }
  // Opt-in groups not asked for stay listed (so reading one names the flag),
  // with their would-be rank lists left empty.
  return out;
}

// ---------------------------------------------------------------------------

ParallelFlags parse_parallel_flags(std::string_view text) {
  ParallelFlags f;
  std::set<std::string> seen;
  for (std::string_view item : str::split(text, ',', true)) {
    item = str::strip(item);
    const auto eq = item.find('=');
    if (eq == item.npos) invalid(str::cat("'", item, "' in '", text, "' is not KEY=VALUE"));
    const std::string key = str::lower(str::strip(item.substr(0, eq)));
    const std::string_view value = str::strip(item.substr(eq + 1));
    if (!seen.insert(key).second) invalid(str::cat("'", key, "' is given twice in '", text, "'"));
    if (key == "order") {
      f.config.order = std::string(value);
      continue;
    }
    int v = 0;
    if (!str::parse_int(value, &v)) invalid(str::cat("'", key, "=", value, "' is not an integer"));
    if (key == "world") f.world = v;
    else if (key == "tp") f.config.tp = v;
    else if (key == "pp") f.config.pp = v;
    else if (key == "cp") f.config.cp = v;
    else if (key == "ep") f.config.ep = v;
    else if (key == "etp") f.config.expert_tp = v;
    else if (key == "dp") f.dp = v;
    else if (key == "rank_offset") f.config.rank_offset = v;
    else invalid(str::cat("unknown key '", key, "' in '", text, "'; keys: world, tp, pp, cp, ep, etp, dp, order, rank_offset"));
  }
  return f;
}

}  // namespace comms::dist
