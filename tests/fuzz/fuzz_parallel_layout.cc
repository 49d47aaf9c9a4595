// The model-parallel layout string "world=16,tp=2,pp=4,...,order=tp-pp-dp"
// (comms::dist::parse_parallel_flags) and what comms-info and the trainer do
// with it: plan_model_parallel, i.e. Megatron's RankGenerator.
//   - Rejections are comms::Error kInvalidArgument, from parsing and planning.
//   - Sizes whose products pass the world, or a rank_offset + world past
//     kMaxWorldSize, are refused (no int overflow makes them look valid).
//   - Accepted flags, written back as a string, parse to the same flags.
//   - A plan's sizes multiply to the world; every group kind but embd and
//     pos_embd partitions [rank_offset, rank_offset + world) into groups of
//     its size; each tp group lies in one mp and one tp_dp_cp group, each dp
//     and cp group in one dp_cp group, each pp group in one tp_ep_pp group;
//     embd/pos_embd are each pp group's ends/first stage.
//   - RankGenerator's normalised order gives the same generator again, and a
//     token's axes in any order give the same groups.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "comms/parallel.h"
#include "fuzz_check.h"

namespace {

using comms::ErrorCode;
using namespace comms::dist;

// Planning is O(world * groups); larger worlds only make the run slower.
constexpr int kMaxPlannedWorld = 512;

std::string describe(const ParallelFlags& f) {
  auto opt = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("-"); };
  return "world=" + opt(f.world) + " tp=" + std::to_string(f.config.tp) + " pp=" + std::to_string(f.config.pp) +
         " cp=" + std::to_string(f.config.cp) + " ep=" + std::to_string(f.config.ep) + " etp=" +
         opt(f.config.expert_tp) + " dp=" + opt(f.dp) + " order='" + f.config.order + "' rank_offset=" +
         std::to_string(f.config.rank_offset);
}

std::string flags_string(const ParallelFlags& f) {
  std::string s = "tp=" + std::to_string(f.config.tp) + ",pp=" + std::to_string(f.config.pp) +
                  ",cp=" + std::to_string(f.config.cp) + ",ep=" + std::to_string(f.config.ep) +
                  ",rank_offset=" + std::to_string(f.config.rank_offset) + ",order=" + f.config.order;
  if (f.world) s += ",world=" + std::to_string(*f.world);
  if (f.dp) s += ",dp=" + std::to_string(*f.dp);
  if (f.config.expert_tp) s += ",etp=" + std::to_string(*f.config.expert_tp);
  return s;
}

bool same(const ParallelFlags& a, const ParallelFlags& b) {
  return a.world == b.world && a.dp == b.dp && a.config.tp == b.config.tp && a.config.pp == b.config.pp &&
         a.config.cp == b.config.cp && a.config.ep == b.config.ep && a.config.expert_tp == b.config.expert_tp &&
         a.config.order == b.config.order && a.config.rank_offset == b.config.rank_offset;
}

// Whether every group of `inner` lies inside one group of `outer`.
bool nested(const RankLists& inner, const RankLists& outer) {
  std::map<int, size_t> group_of;
  for (size_t g = 0; g < outer.size(); ++g)
    for (int r : outer[g]) group_of[r] = g;
  for (const auto& list : inner)
    for (int r : list)
      if (!group_of.count(r) || group_of[r] != group_of[list.front()]) return false;
  return true;
}

void check_plan(const ParallelPlan& plan, const ParallelFlags& f, int world) {
  const auto& c = f.config;
  const int off = c.rank_offset;
  const int etp = plan.expert_tp;
  const std::string why = describe(f);
  FUZZ_CHECK(plan.world_size == world, why);
  FUZZ_CHECK(plan.dp * c.tp * c.pp * c.cp == world, "dense sizes do not multiply to the world: " + why);
  FUZZ_CHECK(plan.expert_dp * etp * c.ep * c.pp == world, "expert sizes do not multiply to the world: " + why);
  const std::map<std::string, int> size_of = {
      {"dp_cp", plan.dp * c.cp}, {"dp_cp_ag", plan.dp * c.cp}, {"dp_cp_gloo", plan.dp * c.cp},
      {"dp", plan.dp}, {"dp_gloo", plan.dp}, {"cp", c.cp}, {"mp", c.tp * c.pp}, {"tp", c.tp}, {"pp", c.pp},
      {"tp_dp_cp", c.tp * plan.dp * c.cp}, {"tp_dp", c.tp * plan.dp}, {"tp_cp", c.tp * c.cp}, {"ep", c.ep},
      {"expt_tp", etp}, {"tp_ep", etp * c.ep}, {"tp_ep_pp", etp * c.ep * c.pp}, {"expt_dp", plan.expert_dp},
      {"expt_dp_ag", plan.expert_dp}, {"expt_dp_gloo", plan.expert_dp}};
  for (const auto& g : plan.groups) {
    if (g.name == "embd" || g.name == "pos_embd") continue;
    FUZZ_CHECK(size_of.count(g.name), "unexpected group '" + g.name + "'");
    const int size = size_of.at(g.name);
    std::vector<int> seen(static_cast<size_t>(world), 0);
    for (const auto& list : g.rank_lists) {
      FUZZ_CHECK(static_cast<int>(list.size()) == size,
                 g.name + " has a group of " + std::to_string(list.size()) + ", not " + std::to_string(size) + ": " + why);
      for (int r : list) {
        FUZZ_CHECK(r >= off && r - off < world, g.name + " holds rank " + std::to_string(r) + " outside the collection: " + why);
        ++seen[static_cast<size_t>(r - off)];
      }
    }
    FUZZ_CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }),
               g.name + " does not hold every rank exactly once: " + why);
  }
  auto lists = [&](const char* name) { return plan.find(name)->rank_lists; };
  FUZZ_CHECK(nested(lists("tp"), lists("mp")) && nested(lists("pp"), lists("mp")), "tp/pp outside mp: " + why);
  FUZZ_CHECK(nested(lists("tp"), lists("tp_dp_cp")) && nested(lists("dp_cp"), lists("tp_dp_cp")), why);
  FUZZ_CHECK(nested(lists("dp"), lists("dp_cp")) && nested(lists("cp"), lists("dp_cp")), "dp/cp outside dp_cp: " + why);
  FUZZ_CHECK(nested(lists("tp"), lists("tp_dp")) && nested(lists("tp"), lists("tp_cp")), why);
  FUZZ_CHECK(nested(lists("ep"), lists("tp_ep")) && nested(lists("expt_tp"), lists("tp_ep")), why);
  FUZZ_CHECK(nested(lists("tp_ep"), lists("tp_ep_pp")) && nested(lists("pp"), lists("tp_ep_pp")), why);
  const auto pp = lists("pp"), embd = lists("embd"), pos = lists("pos_embd");
  FUZZ_CHECK(embd.size() == pp.size() && pos.size() == pp.size(), why);
  for (size_t i = 0; i < pp.size(); ++i) {
    const auto& s = pp[i];
    FUZZ_CHECK(embd[i] == (s.size() == 1 ? s : std::vector<int>{s.front(), s.back()}), "embd: " + why);
    FUZZ_CHECK(pos[i] == std::vector<int>{s.front()}, "pos_embd: " + why);
  }
}

void check_generator(const ParallelFlags& f, const ParallelPlan& plan) {
  const auto& c = f.config;
  const RankGenerator dense(c.tp, 1, plan.dp, c.pp, c.cp, c.order, c.rank_offset);
  const RankGenerator again(c.tp, 1, plan.dp, c.pp, c.cp, dense.order(), c.rank_offset);
  FUZZ_CHECK(again.order() == dense.order(), "order '" + dense.order() + "' does not normalise to itself");
  FUZZ_CHECK(again.get_ranks("tp-dp") == dense.get_ranks("dp-tp") &&
                 again.get_ranks("tp-pp-cp") == dense.get_ranks("cp-tp-pp"),
             "a token's axis order changes its groups: " + describe(f));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParallelFlags f;
  if (!fuzz::accepts([&] { f = parse_parallel_flags(text); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE)) return 0;
  const std::string written = flags_string(f);
  ParallelFlags back;
  FUZZ_CHECK(fuzz::accepts([&] { back = parse_parallel_flags(written); }, {}, "", FUZZ_HERE) && same(back, f),
             "'" + written + "' does not parse back to " + describe(f));

  if (!f.world || *f.world > kMaxPlannedWorld) return 0;
  // Sizes are bounded (kMaxWorldSize) and multiplied without overflow: a
  // layout whose products or rank_offset + world go past the world (in
  // 64-bit arithmetic, so no wrapped product can look valid) is refused.
  const auto& c = f.config;
  const int64_t model = int64_t{c.tp} * c.pp * c.cp;
  const int64_t expert_model = int64_t{c.expert_tp.value_or(c.tp)} * c.ep * c.pp;
  const bool too_big =
      model > *f.world || expert_model > *f.world || int64_t{c.rank_offset} + *f.world > kMaxWorldSize;
  if (too_big) {
    FUZZ_CHECK(!fuzz::accepts([&] { plan_model_parallel(c, *f.world); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE),
               "a layout larger than its world was planned: " + describe(f));
    return 0;
  }
  ParallelPlan plan;
  if (!fuzz::accepts([&] { plan = plan_model_parallel(c, *f.world); }, {ErrorCode::kInvalidArgument}, "", FUZZ_HERE)) {
    return 0;
  }
  check_plan(plan, f, *f.world);
  check_generator(f, plan);
  return 0;
}
