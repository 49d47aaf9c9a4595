// Model-parallel collections under commsrun -n 8, on both routes: every
// group's membership seen from each rank, the all-gather twins overlapping
// reduce-scatter, a configured order and offset honoured by the twins, and
// per-group options (from YAML) reaching the communicators across
// offload/reload.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms::dist {
namespace {

class Parallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InitOptions init;
    init.device = Device::cpu();  // the split route carves groups from a bound world
    init_process_group(init);
  }
  static void TearDownTestSuite() { destroy_process_group(); }
};

// For every planned group: this rank has a group exactly when a rank list
// holds it, with that list's members in that order, and an all_reduce over it
// sums exactly those members.
void expect_memberships_match_the_plan(const ProcessGroupCollection& pgs) {
  const int me = world().rank();
  for (const PlannedGroup& planned : pgs.plan().groups) {
    const std::vector<int>* mine = nullptr;
    for (const auto& list : planned.rank_lists)
      if (std::find(list.begin(), list.end(), me) != list.end()) mine = &list;
    SCOPED_TRACE(testing::Message() << "rank " << me << ", group " << planned.name);
    ASSERT_EQ(pgs.has(planned.name), mine != nullptr);
    if (!mine) {
      try {
        pgs.get(planned.name);
        ADD_FAILURE() << "a non-member read its group";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("is in no '" + planned.name + "' group"), std::string::npos) << e.what();
      }
      continue;
    }
    const Group& g = pgs.get(planned.name);
    EXPECT_EQ(g.global_ranks(), *mine);
    EXPECT_EQ(g.rank(), int(std::find(mine->begin(), mine->end(), me) - mine->begin()));
    EXPECT_EQ(g.route(), route_from_environment());
    int64_t sum = me;
    g->all_reduce(BufferView::of(&sum, 1), ReduceOp::sum());
    EXPECT_EQ(sum, std::accumulate(mine->begin(), mine->end(), int64_t(0)));
  }
}

TEST_F(Parallel, Tp2Pp2Dp2GroupsMatchMegatronsListsOnEveryRank) {
  ASSERT_EQ(world().size(), 8);
  ParallelConfig c;
  c.tp = 2;
  c.pp = 2;
  c.name = "dense";
  const ProcessGroupCollection pgs = initialize_model_parallel(c);
  EXPECT_EQ(pgs.plan().dp, 2);
  EXPECT_EQ(pgs.rank_lists("tp"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pgs.rank_lists("dp"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pgs.rank_lists("pp"), (RankLists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  expect_memberships_match_the_plan(pgs);
  try {
    pgs.dp_cp_ag();
    ADD_FAILURE() << "read an all-gather group that was not asked for";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("create_all_gather_groups"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pgs.tp().spec().name.rfind("dense.tp.", 0), 0u) << pgs.tp().spec().name;
  world()->barrier();
}

TEST_F(Parallel, ExpertShapeGroupsMatchTheExpertGeneratorOnEveryRank) {
  ParallelConfig c;
  c.tp = 2;
  c.ep = 2;
  c.expert_tp = 1;
  c.create_all_gather_groups = true;
  c.create_gloo_groups = true;
  c.name = "moe";
  const ProcessGroupCollection pgs = initialize_model_parallel(c);
  EXPECT_EQ(pgs.plan().expert_dp, 4);
  EXPECT_EQ(pgs.rank_lists("ep"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(pgs.rank_lists("expt_dp"), (RankLists{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(pgs.rank_lists("expt_dp_ag"), pgs.rank_lists("expt_dp"));
  expect_memberships_match_the_plan(pgs);
  EXPECT_NE(pgs.expt_dp_ag().state(), pgs.expt_dp().state()) << "the twin has its own communicator";
  world()->barrier();
}

TEST_F(Parallel, AllGatherOnDpCpAgOverlapsReduceScatterOnDpCp) {
  ParallelConfig c;
  c.tp = 2;
  c.create_all_gather_groups = true;
  c.name = "overlap";
  const ProcessGroupCollection pgs = initialize_model_parallel(c);
  const Group& rs_group = pgs.dp_cp();
  const Group& ag_group = pgs.dp_cp_ag();
  ASSERT_EQ(rs_group.global_ranks(), ag_group.global_ranks());
  ASSERT_NE(rs_group.state(), ag_group.state());
  const int n = rs_group.size();  // 4
  const int r = rs_group.rank();
  constexpr int kChunk = 1000;
  std::vector<float> rs_in(size_t(n) * kChunk), rs_out(kChunk);
  for (int i = 0; i < n * kChunk; ++i) rs_in[size_t(i)] = float(i + 1000 * r);
  std::vector<int32_t> ag_in(kChunk), ag_out(size_t(n) * kChunk);
  for (int i = 0; i < kChunk; ++i) ag_in[size_t(i)] = 100000 * r + i;

  // Half the ranks issue and wait in the opposite order: were the two groups
  // one communicator, the ops would pair up wrongly or deadlock.
  OpOptions async;
  async.async = true;
  Work ag, rs;
  if (r % 2 == 0) {
    ag = ag_group->all_gather(BufferView::of(ag_in), BufferView::of(ag_out), async);
    rs = rs_group->reduce_scatter(BufferView::of(rs_in), BufferView::of(rs_out), ReduceOp::sum(), async);
    rs.wait();
    ag.wait();
  } else {
    rs = rs_group->reduce_scatter(BufferView::of(rs_in), BufferView::of(rs_out), ReduceOp::sum(), async);
    ag = ag_group->all_gather(BufferView::of(ag_in), BufferView::of(ag_out), async);
    ag.wait();
    rs.wait();
  }
  for (int src = 0; src < n; ++src)
    for (int i = 0; i < kChunk; ++i)
      ASSERT_EQ(ag_out[size_t(src * kChunk + i)], 100000 * src + i) << "all_gather, rank " << r << " index " << src * kChunk + i;
  const float rank_sum = float(n * (n - 1) / 2 * 1000);
  for (int i = 0; i < kChunk; ++i)
    ASSERT_EQ(rs_out[size_t(i)], float(n * (r * kChunk + i)) + rank_sum) << "reduce_scatter, rank " << r << " index " << i;
  world()->barrier();
}

TEST_F(Parallel, AllGatherTwinsFollowTheConfiguredOrderAndRankOffset) {
  // Ranks 4..7 only, pipeline fastest after tp: dp groups {4,6} and {5,7}.
  // The default order would give {4,5},{6,7}; offset 0 would give 0..3.
  ParallelConfig c;
  c.pp = 2;
  c.order = "tp-pp-dp";
  c.rank_offset = 4;
  c.create_all_gather_groups = true;
  c.name = "offset";
  const ProcessGroupCollection pgs = initialize_model_parallel(c);
  EXPECT_EQ(pgs.rank_lists("dp_cp_ag"), (RankLists{{4, 6}, {5, 7}}));
  const int me = world().rank();
  if (me < 4) {
    EXPECT_FALSE(pgs.has("dp_cp_ag"));
    EXPECT_FALSE(pgs.has("tp"));
  } else {
    const std::vector<int> expected = me % 2 == 0 ? std::vector<int>{4, 6} : std::vector<int>{5, 7};
    EXPECT_EQ(pgs.dp_cp_ag().global_ranks(), expected);
    std::vector<int32_t> seen(2);
    int32_t mine = me;
    pgs.dp_cp_ag()->all_gather(BufferView::of(&mine, 1), BufferView::of(seen));
    EXPECT_EQ(std::vector<int>(seen.begin(), seen.end()), expected);
  }
  world()->barrier();
}

TEST_F(Parallel, YamlOptionsReachEachGroupAndSurviveOffloadReload) {
  ParallelConfig c;
  c.tp = 2;
  c.create_gloo_groups = true;
  c.create_all_gather_groups = true;
  c.name = "opts";
  c.timeout = std::chrono::seconds(77);
  // Gloo options: this world is CPU-only (NCCL options are refused below).
  c.group_options = parse_communicator_config(R"(
dp_cp: {gloo: {busy_poll: true}}
tp: {gloo: {busy_poll: false}}
dp_gloo: {gloo: {busy_poll: true}}
)");
  const ProcessGroupCollection pgs = initialize_model_parallel(c);
  auto busy_poll = [](const Group& g) {
    const auto d = nlohmann::json::parse(g.describe());
    EXPECT_EQ(d["comm"]["op_timeout_ms"], 77000) << g.describe();
    return d["comm"]["backends"]["cpu"]["config"]["busy_poll_enabled"].get<bool>();
  };
  auto check = [&] {
    EXPECT_TRUE(busy_poll(pgs.dp_cp()));
    EXPECT_TRUE(busy_poll(pgs.dp_cp_ag())) << "the twin takes dp_cp's options";
    EXPECT_FALSE(busy_poll(pgs.tp()));
    EXPECT_TRUE(busy_poll(pgs.get("dp_gloo")));
    EXPECT_EQ(pgs.dp_cp().spec().hints.at("gloo.busy_poll"), "1");
    EXPECT_EQ(pgs.tp().spec().hints.at("gloo.busy_poll"), "0");
  };
  check();
  const OffloadReport off = offload_groups({DeviceType::kCpu});
  EXPECT_GT(off.groups_offloaded, 0);
  reload_groups();
  check();
  float x = 1;
  pgs.dp_cp()->all_reduce(BufferView::of(&x, 1), ReduceOp::sum());
  EXPECT_EQ(x, float(pgs.dp_cp().size()));
  world()->barrier();
}

TEST_F(Parallel, NcclOptionsOnACpuOnlyWorldAreRefusedBeforeAnyGroupIsCreated) {
  const size_t before = groups().size();
  ParallelConfig c;
  c.name = "refused";
  c.group_options = parse_communicator_config("dp: {max_ctas: 16, net_name: IB}\n");
  try {
    initialize_model_parallel(c);
    ADD_FAILURE() << "NCCL options were accepted for a Gloo group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'dp' is given NCCL options (nccl.max_ctas, nccl.net_name)"),
              std::string::npos) << e.what();
  }
  c.group_options.clear();
  c.high_priority_groups = {"dp_cp"};
  EXPECT_THROW(initialize_model_parallel(c), Error);
  EXPECT_EQ(groups().size(), before);
  c.high_priority_groups.clear();
  c.tp = 3;
  try {
    initialize_model_parallel(c);
    ADD_FAILURE() << "world 8 accepted tp=3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by tp*pp*cp"), std::string::npos) << e.what();
  }
  world()->barrier();
}

TEST_F(Parallel, TwoCollectionsCoexistAndANameIsNotReused) {
  ParallelConfig a;
  a.tp = 4;
  ParallelConfig b;
  b.tp = 2;
  b.pp = 2;
  const ProcessGroupCollection first = initialize_model_parallel(a);
  const ProcessGroupCollection second = initialize_model_parallel(b);
  EXPECT_NE(first.prefix(), second.prefix());
  EXPECT_EQ(first.tp().size(), 4);
  EXPECT_EQ(second.tp().size(), 2);
  ParallelConfig again = a;
  again.name = first.prefix();
  EXPECT_THROW(initialize_model_parallel(again), Error);
  world()->barrier();
}

}  // namespace
}  // namespace comms::dist
