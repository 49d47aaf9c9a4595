// comms::dist under commsrun, run once with COMMS_ROUTE=direct and once with
// COMMS_ROUTE=split: the same memberships, rank orders, effective options and
// results on both routes, and the documented errors of the split path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms::dist {
namespace {

bool split_route() { return route_from_environment() == Route::kSplit; }

class Dist : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InitOptions init;
    init.device = Device::cpu();
    init.options.gloo.busy_poll = false;  // an option every group must inherit
    init_process_group(init);
  }
  static void TearDownTestSuite() { destroy_process_group(); }
};

TEST_F(Dist, NewGroupGivesMembersTheirRanksAndNonMembersAnEmptyHandle) {
  Group w = world();
  const int n = w.size();
  std::vector<int> odd;
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == 1) odd.push_back(r);  // descending: group rank order follows the list
  if (odd.empty()) odd.push_back(0);
  GroupOptions o;
  o.description = "odd ranks, descending";
  Group g = new_group(odd, o);
  auto it = std::find(odd.begin(), odd.end(), w.rank());
  ASSERT_EQ(bool(g), it != odd.end());
  if (g) {
    EXPECT_EQ(g.rank(), int(it - odd.begin()));
    EXPECT_EQ(g.size(), int(odd.size()));
    EXPECT_EQ(g.global_ranks(), odd);
    EXPECT_EQ(g.route(), route_from_environment());
    int64_t v = w.rank();
    g->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
    EXPECT_EQ(v, std::accumulate(odd.begin(), odd.end(), int64_t(0)));
    std::vector<int32_t> gathered(odd.size());
    int32_t mine = w.rank();
    g->all_gather(BufferView::of(&mine, 1), BufferView::of(gathered));
    EXPECT_EQ(std::vector<int>(gathered.begin(), gathered.end()), odd);
    auto d = nlohmann::json::parse(g.describe());
    EXPECT_EQ(d["route"], std::string(to_string(route_from_environment())));
    EXPECT_EQ(d["comm"]["backends"]["cpu"]["hints"]["busy_poll"], "0") << g.describe();
    EXPECT_EQ(d["comm"]["backends"]["cpu"]["config"]["busy_poll_enabled"], false) << g.describe();
  }
  w->barrier();
}

TEST_F(Dist, GroupOptionsReachTheCommunicatorOnBothRoutes) {
  Group w = world();
  std::vector<int> all(static_cast<size_t>(w.size()));
  std::iota(all.begin(), all.end(), 0);
  GroupOptions o;
  o.options.gloo.busy_poll = true;
  o.timeout = std::chrono::seconds(42);
  Group g = new_group(all, o);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->op_timeout(), std::chrono::seconds(42));
  auto d = nlohmann::json::parse(g.describe());
  EXPECT_EQ(d["comm"]["op_timeout_ms"], 42000);
  EXPECT_EQ(d["comm"]["backends"]["cpu"]["hints"]["busy_poll"], "1");
  EXPECT_EQ(d["comm"]["backends"]["cpu"]["config"]["busy_poll_enabled"], true);
  EXPECT_EQ(g.spec().hints.at("gloo.busy_poll"), "1");
  float x = 1.5f;
  g->all_reduce(BufferView::of(&x, 1), ReduceOp::max());
  EXPECT_EQ(x, 1.5f);
}

// An nccl option on a cpu:gloo world is refused on every rank, members or
// not (non-members used to get an empty handle silently), and the error
// names the group, the op and the rank.
TEST_F(Dist, AHintForAnAbsentBackendIsRefusedOnEveryRankWithTheErrorsFields) {
  Group w = world();
  GroupOptions o;
  o.name = "nccl_on_cpu";
  o.options.nccl.max_ctas = 16;
  try {
    (void)new_group({0}, o);
    ADD_FAILURE() << "rank " << w.rank() << ": an nccl hint on a cpu:gloo group was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("'nccl.max_ctas' is for backend 'nccl'"), std::string::npos) << e.what();
    EXPECT_EQ(e.comm(), "nccl_on_cpu");
    EXPECT_EQ(e.op(), "new_group");
    EXPECT_EQ(e.seq(), 0u);
    EXPECT_EQ(e.rank(), w.rank());
  }
  w->barrier();  // every rank is still in step
}

TEST_F(Dist, SplitGroupGivesEachRankItsListInOrder) {
  Group w = world();
  const int n = w.size();
  std::vector<std::vector<int>> lists(2);
  for (int r = 0; r < n; ++r) lists[r < (n + 1) / 2 ? 0 : 1].push_back(r);
  if (lists[1].empty()) lists.pop_back();
  SplitGroupOptions o;
  o.backend = "cpu:gloo";
  Group half = split_group(w, lists, o);
  ASSERT_TRUE(half);
  const auto& mine = lists[w.rank() < (n + 1) / 2 ? 0 : 1];
  EXPECT_EQ(half.global_ranks(), mine);
  EXPECT_EQ(half.route(), Route::kSplit);
  int32_t v = 1;
  half->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  EXPECT_EQ(v, int(mine.size()));
}

TEST_F(Dist, SplitPathRulesGiveErrorsThatNameTheGroupAndSayWhatToDo) {
  if (!split_route()) GTEST_SKIP() << "the split-path rules apply under COMMS_ROUTE=split";
  Group w = world();
  std::vector<int> all(static_cast<size_t>(w.size()));
  std::iota(all.begin(), all.end(), 0);
  // A device type the parent lacks.
  GroupOptions cuda;
  cuda.backend = "cuda:nccl";
  cuda.name = "wants-cuda";
  try {
    new_group(all, cuda);
    ADD_FAILURE() << "a device the parent lacks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'wants-cuda'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(
                  "Requested backend for device 'cuda' is not present in the parent group (parent backends: cpu:gloo)"),
              std::string::npos) << e.what();
  }
  // split_group's filter must be device-qualified.
  SplitGroupOptions bare;
  bare.backend = "gloo";
  bare.name = "bare-filter";
  try {
    split_group(w, std::vector<std::vector<int>>{all}, bare);
    ADD_FAILURE() << "an unqualified filter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'bare-filter'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("must be device-qualified, e.g. 'cpu:gloo'"), std::string::npos) << e.what();
  }
  // The world still works after the rejected calls.
  int32_t v = 1;
  w->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  EXPECT_EQ(v, w.size());
}

TEST_F(Dist, SplitRouteNeedsABoundParent) {
  if (!split_route()) GTEST_SKIP() << "only the split route needs a bound parent";
  destroy_process_group();
  init_process_group({});  // no device: the world is not bound
  std::vector<int> all(static_cast<size_t>(world().size()));
  std::iota(all.begin(), all.end(), 0);
  GroupOptions o;
  o.name = "from-unbound";
  try {
    new_group(all, o);
    ADD_FAILURE() << "an unbound parent was split";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'from-unbound'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pass a device to init_process_group"), std::string::npos) << e.what();
  }
  destroy_process_group();
  InitOptions init;
  init.device = Device::cpu();
  init.options.gloo.busy_poll = false;
  init_process_group(init);
}

TEST_F(Dist, DestroyingAGroupTwiceIsHarmlessAndItsHandleThenSaysSo) {
  Group w = world();
  std::vector<int> all(static_cast<size_t>(w.size()));
  std::iota(all.begin(), all.end(), 0);
  Group g = new_group(all);
  ASSERT_TRUE(g);
  destroy_process_group(g);
  destroy_process_group(g);
  EXPECT_FALSE(g);
  EXPECT_THROW(g.rank(), Error);
  w->barrier();
}

}  // namespace
}  // namespace comms::dist
