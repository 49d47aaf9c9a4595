// The rank generator against Megatron-LM's documented examples, the plan of a
// collection, and the communicator-config YAML.
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <string>

#include "comms/parallel.h"

namespace comms::dist {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

#define EXPECT_ERROR_MENTIONS(expr, text)                                   \
  do {                                                                       \
    const std::string msg = error_of([&] { (void)(expr); });                 \
    EXPECT_NE(msg.find(text), std::string::npos) << "error: " << msg;        \
  } while (0)

TEST(RankGenerator, Gives16GpuTp2Pp4GroupsOfMegatronsDocstring) {
  // initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4, dp=2.
  RankGenerator g(/*tp=*/2, /*ep=*/1, /*dp=*/2, /*pp=*/4, /*cp=*/1);
  EXPECT_EQ(g.order(), "tp-cp-ep-dp-pp");
  EXPECT_EQ(g.get_ranks("tp"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.get_ranks("dp"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.get_ranks("pp"), (RankLists{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
}

TEST(RankGenerator, GivesTheMaskedOrthogonalGroupsDocstringExample) {
  // generate_masked_orthogonal_rank_groups' docstring: [tp, dp, pp] = [2, 3, 4].
  RankGenerator g(2, 1, 3, 4, 1, "tp-dp-pp");
  const RankLists dp = g.get_ranks("dp");
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

TEST(RankGenerator, Gives8RankTp2Pp2Dp2Groups) {
  RankGenerator g(2, 1, 2, 2, 1);
  EXPECT_EQ(g.get_ranks("tp"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.get_ranks("dp"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.get_ranks("pp"), (RankLists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.get_ranks("cp"), (RankLists{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(g.get_ranks("tp-pp"), (RankLists{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(g.get_ranks("tp-dp"), (RankLists{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(g.get_ranks("dp-cp"), g.get_ranks("dp"));
  EXPECT_EQ(g.get_ranks("cp-dp"), g.get_ranks("dp-cp")) << "a token's axis order does not matter";
}

TEST(RankGenerator, TpPpDpAndTpDpPpOrdersSwapTheDataAndPipelineStrides) {
  // The docstring's 8-GPU 'tp-pp-dp' example: dp groups [[0,4],[1,5],[2,6],[3,7]].
  RankGenerator pp_inner(2, 1, 2, 2, 1, "tp-pp-dp");
  EXPECT_EQ(pp_inner.get_ranks("dp"), (RankLists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(pp_inner.get_ranks("pp"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(pp_inner.get_ranks("tp"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  RankGenerator dp_inner(2, 1, 2, 2, 1, "tp-dp-pp");
  EXPECT_EQ(dp_inner.get_ranks("dp"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(dp_inner.get_ranks("pp"), (RankLists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(dp_inner.order(), "tp-dp-pp-ep-cp") << "size-1 axes left out are appended";
}

TEST(RankGenerator, ExpertShapesWithEpAboveOne) {
  // world 8, expert tp 1, ep 2 -> expert dp 4.
  RankGenerator e1(/*tp=*/1, /*ep=*/2, /*dp=*/4, /*pp=*/1, /*cp=*/1);
  EXPECT_EQ(e1.get_ranks("ep"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(e1.get_ranks("dp"), (RankLists{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(e1.get_ranks("tp").size(), 8u);
  // world 8, expert tp 2, ep 2 -> expert dp 2.
  RankGenerator e2(2, 2, 2, 1, 1);
  EXPECT_EQ(e2.get_ranks("tp"), (RankLists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(e2.get_ranks("ep"), (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(e2.get_ranks("tp-ep"), (RankLists{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(e2.get_ranks("dp"), (RankLists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // world 16 with pp 2: tp-ep-pp spans a whole model replica.
  RankGenerator e3(2, 2, 2, 2, 1);
  EXPECT_EQ(e3.get_ranks("tp-ep-pp"), (RankLists{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
}

TEST(RankGenerator, AddsTheRankOffsetToEveryRank) {
  RankGenerator g(2, 1, 2, 1, 1, "tp-dp", 4);
  EXPECT_EQ(g.get_ranks("tp"), (RankLists{{4, 5}, {6, 7}}));
  EXPECT_EQ(g.get_ranks("dp"), (RankLists{{4, 6}, {5, 7}}));
  RankGenerator big(2, 1, 2, 4, 1, "tp-cp-ep-dp-pp", 16);
  EXPECT_EQ(big.get_ranks("pp")[3], (std::vector<int>{19, 23, 27, 31}));
}

TEST(RankGenerator, RejectsBadConfigurationsSayingWhy) {
  EXPECT_ERROR_MENTIONS(RankGenerator(2, 1, 2, 2, 1, "tp-dp"), "pp is 2 but the order 'tp-dp' does not place it");
  EXPECT_ERROR_MENTIONS(RankGenerator(1, 2, 2, 1, 2, "tp-cp-ep-dp-pp"), "cannot both be above 1");
  EXPECT_ERROR_MENTIONS(RankGenerator(1, 1, 2, 1, 1, "tp-xp-dp"), "names 'xp'");
  EXPECT_ERROR_MENTIONS(RankGenerator(1, 1, 2, 1, 1, "tp-dp-tp"), "'tp' twice");
  EXPECT_ERROR_MENTIONS(RankGenerator(0, 1, 2, 1, 1), "tp must be at least 1");
  EXPECT_ERROR_MENTIONS(RankGenerator(1, 1, 2, 1, 1, "tp-dp", -1), "rank_offset");
  RankGenerator g(2, 1, 2, 1, 1);
  EXPECT_ERROR_MENTIONS(g.get_ranks("tp-zz"), "names 'zz'");
}

TEST(RankGenerator, SizesAndOffsetsBeyondTheMaximumWorldAreRefusedBeforeAnyRankOverflows) {
  static_assert(kMaxWorldSize == 1 << 20);
  EXPECT_ERROR_MENTIONS(RankGenerator(1, 1, kMaxWorldSize + 1, 1, 1), "dp = 1048577 is more than the largest supported world, 1048576 ranks");
  // 2^16 * 2^16 = 2^32 overflows an int; the product is refused instead.
  EXPECT_ERROR_MENTIONS(RankGenerator(1 << 16, 1, 1 << 16, 1, 1), "tp*pp*dp*ep*cp = 65536*1*65536*1*1 is more than the largest supported world");
  EXPECT_ERROR_MENTIONS(RankGenerator(2, 1, 2, 1, 1, "tp-dp", INT32_MAX - 1), "rank_offset 2147483646 + 4 ranks goes past the largest supported world");
  const RankGenerator last(2, 1, 2, 1, 1, "tp-dp", kMaxWorldSize - 4);
  EXPECT_EQ(last.get_ranks("tp").back(), (std::vector<int>{kMaxWorldSize - 2, kMaxWorldSize - 1}));
}

// ---------------------------------------------------------------------------

TEST(ParallelPlan, AWorldBeyondTheMaximumIsRefusedNotAllocated) {
  ParallelConfig c;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 2147483647), "the world size = 2147483647 is more than the largest supported world, 1048576 ranks");
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 100000000), "the world size = 100000000 is more than");
  c.tp = 2000000000;
  c.pp = 2000000000;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 2000000000), "is more than the largest supported world");
  // Within the bound, products of sizes never overflow: 2^10 * 2^10 * 2^10 is
  // refused as not dividing the world, with the true product.
  c.tp = c.pp = c.cp = 1 << 10;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 1 << 20), "not divisible by tp*pp*cp = 1024*1024*1024 = 1073741824");
  c = {};
  c.rank_offset = 2147483000;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 1000), "rank_offset 2147483000 + 1000 ranks goes past the largest supported world");
}

TEST(ParallelPlan, DerivesDpFromTheWorldAndRejectsAnIndivisibleWorld) {
  ParallelConfig c;
  c.tp = 2;
  c.pp = 4;
  const ParallelPlan p = plan_model_parallel(c, 16);
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.find("dp")->rank_lists,
            (RankLists{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(p.find("embd")->rank_lists[0], (std::vector<int>{0, 12}));
  EXPECT_EQ(p.find("pos_embd")->rank_lists[0], (std::vector<int>{0}));
  EXPECT_EQ(p.find("dp_cp_ag"), nullptr) << "opt-in";
  c.tp = 3;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 16), "not divisible by tp*pp*cp = 3*4*1 = 12");
  c.tp = 2;
  c.ep = 3;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 16), "expert_tp*ep*pp");
}

TEST(ParallelPlan, AllGatherTwinsFollowTheConfiguredOrderAndOffsetNotADefault) {
  ParallelConfig c;
  c.tp = 2;
  c.pp = 2;
  c.order = "tp-pp-dp";
  c.rank_offset = 8;
  c.create_all_gather_groups = true;
  const ParallelPlan p = plan_model_parallel(c, 8);
  const RankLists expected = RankGenerator(2, 1, 2, 2, 1, "tp-pp-dp", 8).get_ranks("dp-cp");
  EXPECT_EQ(expected, (RankLists{{8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(p.find("dp_cp")->rank_lists, expected);
  EXPECT_EQ(p.find("dp_cp_ag")->rank_lists, expected);
  EXPECT_NE(p.find("dp_cp_ag")->rank_lists, RankGenerator(2, 1, 2, 2, 1, "tp-cp-ep-dp-pp", 0).get_ranks("dp-cp"));
  EXPECT_EQ(p.find("expt_dp_ag")->rank_lists, p.find("expt_dp")->rank_lists);
  EXPECT_EQ(p.find("expt_dp")->rank_lists, expected);
}

TEST(ParallelPlan, NcclOptionsNeedAnNcclBackend) {
  ParallelConfig c;
  c.group_options["dp"].nccl.max_ctas = 8;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 4, "cpu:gloo"), "group 'dp' is given NCCL options (nccl.max_ctas)");
  const ParallelPlan p = plan_model_parallel(c, 4, "cpu:gloo,cuda:nccl");
  EXPECT_EQ(to_hints(p.find("dp")->options).at("nccl.max_ctas"), "8");
  c.high_priority_groups = {"ep_dp"};  // Megatron's name for expt_dp
  EXPECT_EQ(to_hints(plan_model_parallel(c, 4, "nccl").find("expt_dp")->options).at("nccl.high_priority_stream"), "1");
  c.high_priority_groups = {"nope"};
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 4, "nccl"), "unknown group 'nope'");
  c.high_priority_groups.clear();
  c.group_options["dp_cp_ag"].nccl.min_ctas = 2;
  EXPECT_ERROR_MENTIONS(plan_model_parallel(c, 4, "nccl"), "set create_all_gather_groups");
}

TEST(ParallelFlags, ParseEveryKeyAndRejectUnknownOnes) {
  const ParallelFlags f = parse_parallel_flags("world=16,tp=2,pp=4,cp=1,ep=2,etp=1,dp=2,order=tp-pp-dp,rank_offset=3");
  EXPECT_EQ(*f.world, 16);
  EXPECT_EQ(f.config.tp, 2);
  EXPECT_EQ(f.config.pp, 4);
  EXPECT_EQ(f.config.ep, 2);
  EXPECT_EQ(*f.config.expert_tp, 1);
  EXPECT_EQ(*f.dp, 2);
  EXPECT_EQ(f.config.order, "tp-pp-dp");
  EXPECT_EQ(f.config.rank_offset, 3);
  EXPECT_ERROR_MENTIONS(parse_parallel_flags("tp=2,zz=1"), "unknown key 'zz'");
  EXPECT_ERROR_MENTIONS(parse_parallel_flags("tp=two"), "not an integer");
  EXPECT_ERROR_MENTIONS(parse_parallel_flags("tp=2,tp=4"), "given twice");
}

// ---------------------------------------------------------------------------

TEST(CommunicatorConfig, ReadsMegatronsLayoutIntoTypedOptions) {
  const auto cfg = parse_communicator_config(R"(
dp_cp:
  cga_cluster_size: 2
  max_ctas: 16
  min_ctas: 4
  net_name: IB
  is_high_priority_stream: true
tp:
  max_ctas: 8
ep_dp:
  min_ctas: 2
dp_gloo:
  gloo: {busy_poll: true, interface: lo}
)");
  ASSERT_EQ(cfg.size(), 4u);
  const Hints h = to_hints(cfg.at("dp_cp"));
  EXPECT_EQ(h.at("nccl.cga_cluster_size"), "2");
  EXPECT_EQ(h.at("nccl.max_ctas"), "16");
  EXPECT_EQ(h.at("nccl.min_ctas"), "4");
  EXPECT_EQ(h.at("nccl.net_name"), "IB");
  EXPECT_EQ(h.at("nccl.high_priority_stream"), "1");
  EXPECT_EQ(h.size(), 5u);
  EXPECT_EQ(to_hints(cfg.at("tp")), (Hints{{"nccl.max_ctas", "8"}}));
  EXPECT_EQ(cfg.at("dp_gloo").gloo.busy_poll, true);
  EXPECT_EQ(cfg.at("dp_gloo").gloo.interface, "lo");

  ParallelConfig c;
  c.create_gloo_groups = true;
  c.group_options = cfg;
  const ParallelPlan p = plan_model_parallel(c, 4, "cpu:gloo,cuda:nccl");
  EXPECT_EQ(p.find("expt_dp")->options.nccl.min_ctas, 2) << "ep_dp is Megatron's name for expt_dp";
  EXPECT_EQ(p.find("dp_gloo")->backend, "gloo");
}

// Every key Megatron-LM's parallel_state.py passes to get_nccl_options, each
// with its own max_ctas: the file loads, each alias reaches the group
// Megatron configures with it (tp_ep_mp: the tp-ep group, not tp-ep-pp), and
// tp_ep_mp with tp_ep_pp together is not a duplicate.
TEST(CommunicatorConfig, AMegatronFileWithEveryGroupKeyLoadsAndEachKeyReachesItsGroup) {
  const std::vector<std::string> megatron_keys = {
      "dp_cp", "intra_dp_cp", "dp",       "cp",    "hcp",   "mp",       "tp",    "pp",
      "embd",  "pos_embd",    "tp_dp_cp", "tp_dp", "tp_cp", "ep",       "ep_tp", "tp_ep_mp",
      "tp_ep_pp", "ep_dp",    "intra_ep_dp", "inter_ep_dp", "intra_dist_opt_instance"};
  std::string yaml;
  std::map<std::string, int> ctas;
  for (size_t i = 0; i < megatron_keys.size(); ++i) {
    ctas[megatron_keys[i]] = static_cast<int>(i) + 1;
    yaml += megatron_keys[i] + ":\n  max_ctas: " + std::to_string(i + 1) + "\n";
  }
  const auto cfg = parse_communicator_config(yaml);
  EXPECT_EQ(cfg.size(), megatron_keys.size());
  ParallelConfig c;
  c.tp = 2;
  c.pp = 2;
  c.ep = 2;
  c.group_options = cfg;
  const ParallelPlan p = plan_model_parallel(c, 8, "cpu:gloo,cuda:nccl");
  const std::map<std::string, std::string> ours = {
      {"dp_cp", "dp_cp"}, {"dp", "dp"},       {"cp", "cp"},       {"mp", "mp"},         {"tp", "tp"},
      {"pp", "pp"},       {"embd", "embd"},   {"pos_embd", "pos_embd"}, {"tp_dp_cp", "tp_dp_cp"},
      {"tp_dp", "tp_dp"}, {"tp_cp", "tp_cp"}, {"ep", "ep"},       {"ep_tp", "expt_tp"}, {"tp_ep_mp", "tp_ep"},
      {"tp_ep_pp", "tp_ep_pp"}, {"ep_dp", "expt_dp"}};
  for (const auto& [key, group] : ours) {
    const PlannedGroup* g = p.find(group);
    ASSERT_NE(g, nullptr) << group;
    EXPECT_EQ(g->options.nccl.max_ctas, ctas.at(key)) << "Megatron's '" << key << "' configures our '" << group << "'";
  }
  // tp_ep_mp and tp_ep name the same group: giving both is refused.
  EXPECT_ERROR_MENTIONS(parse_communicator_config("tp_ep_mp: {max_ctas: 1}\ntp_ep: {max_ctas: 2}\n"),
                        "group 'tp_ep' is given twice");
}

TEST(CommunicatorConfig, AnEmptyFileGivesNoOptions) { EXPECT_TRUE(parse_communicator_config("").empty()); }

TEST(CommunicatorConfig, RejectsUnknownGroupsKeysValuesAndTypesNamingThem) {
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dpp:\n  max_ctas: 1\n"), "'dpp' (line 1): unknown group");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp:\n  max_cta: 1\n"), "'dp.max_cta' (line 2): unknown key");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp:\n  max_ctas: many\n"), "'many' is not an integer");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp:\n  net_name: Eth\n"), "accepted: IB, Socket");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp: [1, 2]\n"), "expected a map");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp: {gloo: {speed: 1}}\n"), "gloo keys are");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp: {max_ctas: [1\n"), "not valid YAML");
  try {
    load_communicator_config("/nonexistent/comms.yaml");
    ADD_FAILURE() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(CommunicatorConfig, AKeyThatIsAListOrMapIsAnErrorNamingTheLineNotAnAbort) {
  // yaml-cpp's as<std::string>() threw YAML::BadConversion on these.
  EXPECT_ERROR_MENTIONS(parse_communicator_config("[dp]: {max_ctas: 1}\n"),
                        "communicator config (line 1): a key must be a plain name, not a map, list or null");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp:\n  {a: 1}: 2\n"),
                        "communicator config 'dp' (line 2): a key must be a plain name");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp_gloo:\n  gloo:\n    [x]: 1\n"),
                        "communicator config 'dp_gloo.gloo' (line 3): a key must be a plain name");
}

TEST(CommunicatorConfig, AKeyGivenTwiceIsAnErrorNotLastOneWins) {
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp: {max_ctas: 1}\ntp: {}\ndp: {max_ctas: 2}\n"),
                        "communicator config (line 3): key 'dp' is given twice");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("dp:\n  max_ctas: 1\n  max_ctas: 2\n"),
                        "communicator config 'dp' (line 3): key 'max_ctas' is given twice");
  EXPECT_ERROR_MENTIONS(parse_communicator_config("expt_dp: {}\nep_dp: {}\n"),
                        "group 'expt_dp' is given twice (by its name and by Megatron's alias)");
}

TEST(CommunicatorConfig, APathThatIsNotARegularFileIsRefusedNamingIt) {
  const std::string dir = ::testing::TempDir();
  EXPECT_ERROR_MENTIONS(load_communicator_config(dir), "communicator config '" + dir + "' is not a regular file (a directory)");
  EXPECT_ERROR_MENTIONS(load_communicator_config("/dev/null"),
                        "communicator config '/dev/null' is not a regular file (a device, pipe or socket)");
}

TEST(CommunicatorConfig, ErrorsFromAFileNameTheFile) {
  const std::string path = ::testing::TempDir() + "/comms_config_list_key.yaml";
  std::ofstream(path) << "tp: {max_ctas: 8}\n[dp]: {max_ctas: 1}\n";
  EXPECT_ERROR_MENTIONS(load_communicator_config(path), path + ": communicator config (line 2): a key must be a plain name");
  std::remove(path.c_str());
}

// Recovery: a loss of whole data-parallel replicas re-derives; anything
// else says why, and drop_replicas() picks the rest of each hit replica.
TEST(ParallelRecovery, WholeReplicasShrinkAndOtherLossesSayWhy) {
  ParallelConfig tp2;
  tp2.tp = 2;
  EXPECT_EQ(why_layout_cannot_shrink(tp2, 8, {2, 3}), "");
  const std::string odd = why_layout_cannot_shrink(tp2, 8, {3});
  EXPECT_NE(odd.find("losing ranks [3] of 8 leaves 7 ranks"), std::string::npos) << odd;
  EXPECT_NE(odd.find("not divisible by tp*pp*cp = 2*1*1 = 2"), std::string::npos) << odd;
  const std::string split = why_layout_cannot_shrink(tp2, 8, {1, 2});
  EXPECT_NE(split.find("the loss of [1] breaks tp group [0,1]"), std::string::npos) << split;
  EXPECT_NE(split.find("would make ranks [0,3]"), std::string::npos) << split;

  ParallelConfig pp2;  // tp=1, dp=4, pp=2: replica d is {d, d+4}
  pp2.pp = 2;
  pp2.order = "tp-dp-pp";
  EXPECT_EQ(why_layout_cannot_shrink(pp2, 8, {1, 5}), "");
  const std::string stage = why_layout_cannot_shrink(pp2, 8, {1, 4});
  EXPECT_NE(stage.find("the loss of [4] breaks pp group [0,4]"), std::string::npos) << stage;

  const ParallelPlan plan8 = plan_model_parallel(tp2, 8);
  EXPECT_EQ(drop_replicas()(LayoutLoss{&tp2, &plan8, 8, {3}}), (std::vector<int>{2}));
  EXPECT_EQ(drop_replicas()(LayoutLoss{&tp2, &plan8, 8, {0, 7}}), (std::vector<int>{1, 6}));
  const ParallelPlan pplan = plan_model_parallel(pp2, 8);
  EXPECT_EQ(drop_replicas()(LayoutLoss{&pp2, &pplan, 8, {5}}), (std::vector<int>{1}));
}

}  // namespace
}  // namespace comms::dist
