// The CPU backends' plans (backends/gloo/op_rules.h, backends/ucx/ucx_plan.h)
// and the path tables describe() prints from them (path_table.h): at every
// byte count checked, the table names the path the plan picks, for comms of
// several sizes with and without a sync mesh, shared memory and direct
// copies; and the plans keep the paths the backends have always taken.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "op_rules.h"
#include "path_table.h"
#include "ucx_plan.h"

namespace comms::cpu_algorithms {
namespace {

using plugin::OpType;
using Table = std::vector<std::pair<size_t, std::string>>;  // (max_bytes, path); kUnbounded for null

// One op's runs from the JSON, checked to ascend and to end unbounded.
Table runs_of(const nlohmann::json& paths, OpType type) {
  const std::string op(plugin::op_name(type));
  Table t;
  for (const auto& run : paths.at(op)) {
    const size_t max = run.at("max_bytes").is_null() ? kUnbounded : run.at("max_bytes").get<size_t>();
    EXPECT_TRUE(t.empty() || t.back().first < max) << op << ": runs must ascend";
    EXPECT_TRUE(t.empty() || t.back().second != run.at("path").get<std::string>()) << op << ": runs must differ";
    t.emplace_back(max, run.at("path").get<std::string>());
  }
  EXPECT_FALSE(t.empty()) << op;
  if (!t.empty()) {
    EXPECT_EQ(t.back().first, kUnbounded) << op << ": the last run must be unbounded";
  }
  return t;
}

std::string_view lookup(const Table& t, size_t bytes) {
  for (const auto& [max, path] : t) {
    if (bytes <= max) return path;
  }
  return "(past the table)";
}

// Every count up to 4 KiB, a grid up to 2 MiB, powers of two and every
// limit the plans read, each with its neighbours, scaled by the ranks.
std::vector<size_t> byte_counts(int size) {
  std::vector<size_t> b;
  for (size_t x = 0; x <= 1024; ++x) b.push_back(x);
  for (size_t x = 1024; x <= (2u << 20); x += 509) b.push_back(x);
  const size_t n = static_cast<size_t>(size);
  std::vector<size_t> points;
  for (int p = 0; p < 40; ++p) points.push_back(size_t{1} << p);
  for (size_t k : {kExchangeMaxBytes, kSyncPathMaxBytes, kAllReduceDirectMinSegmentBytes, kBroadcastDirectMinBytes,
                   kBroadcastPiecedMaxBytes, ucx_backend::kShmMaxBytes}) {
    points.insert(points.end(), {k, k / n, k * n});
  }
  for (size_t p : points) {
    for (size_t d = 0; d <= 4; ++d) b.insert(b.end(), {p + d, p >= d ? p - d : 0});
  }
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

// The first byte count checked at which the table and the plan disagree, or
// kUnbounded.
template <class Name>
size_t first_mismatch(const Table& table, OpType type, const Name& name, const std::vector<size_t>& counts) {
  for (size_t bytes : counts) {
    if (lookup(table, bytes) != name(type, bytes)) return bytes;
  }
  return kUnbounded;
}

template <class Name>
void expect_table_matches(const nlohmann::json& paths, int size, const Name& name, const std::string& what) {
  ASSERT_EQ(paths.size(), static_cast<size_t>(plugin::kNumOpTypes)) << what;
  const std::vector<size_t> counts = byte_counts(size);
  for (int t = 0; t < plugin::kNumOpTypes; ++t) {
    const auto type = static_cast<OpType>(t);
    const size_t bytes = first_mismatch(runs_of(paths, type), type, name, counts);
    EXPECT_EQ(bytes, kUnbounded) << what << " " << plugin::op_name(type) << ": at " << bytes << " bytes the plan says '"
                                 << name(type, bytes) << "', the table "
                                 << paths.at(std::string(plugin::op_name(type))).dump();
  }
}

TEST(PathTable, TheGlooTableNamesThePlansPathAtEveryByteCount) {
  for (int size : {1, 2, 3, 4, 7, 8}) {
    for (bool sync_mesh : {true, false}) {
      const gloo_backend::GlooShape comm{size, sync_mesh};
      auto name = [&](OpType type, size_t bytes) {
        return gloo_backend::path_name(type, gloo_backend::plan(type, bytes, comm));
      };
      expect_table_matches(paths_json<nlohmann::json>(name, size, {}), size, name,
                           "gloo size " + std::to_string(size) + " sync mesh " + std::to_string(sync_mesh));
    }
  }
}

TEST(PathTable, TheUcxTableNamesThePlansPathAtEveryByteCount) {
  for (int size : {1, 2, 3, 4, 7, 8}) {
    for (size_t shm : {size_t{0}, ucx_backend::kShmMaxBytes}) {
      for (bool direct : {true, false}) {
        for (size_t zero_copy_min : {size_t{0}, size_t{1000}, size_t{256} * 1024}) {
          ucx_backend::UcxShape comm{size, shm, direct};
          comm.zero_copy = shm != 0 && zero_copy_min != 0;
          comm.zero_copy_min_bytes = zero_copy_min;
          auto name = [&](OpType type, size_t bytes) {
            return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
          };
          expect_table_matches(paths_json<nlohmann::json>(name, size, {shm, zero_copy_min}), size, name,
                               "ucx size " + std::to_string(size) + " shm " + std::to_string(shm) + " direct " +
                                   std::to_string(direct) + " zero-copy from " + std::to_string(zero_copy_min));
        }
      }
    }
  }
}

// The zero-copy path is the plan's: tried first from its size on, for the
// ops it has kernels for, and named in the table before the path taken
// where some rank's buffers are not the comm's memory.
TEST(UcxPlan, TriesZeroCopyFirstFromItsSizeForTheOpsItHasKernelsFor) {
  ucx_backend::UcxShape comm{2, ucx_backend::kShmMaxBytes, true};
  comm.zero_copy = true;
  comm.zero_copy_min_bytes = 256 * 1024;
  for (OpType type : {OpType::kAllReduce, OpType::kReduce, OpType::kReduceScatter, OpType::kAllGather,
                      OpType::kBroadcast}) {
    EXPECT_FALSE(ucx_backend::plan(type, 256 * 1024 - 1, comm).zero_copy_first) << plugin::op_name(type);
    const Plan p = ucx_backend::plan(type, 256 * 1024, comm);
    EXPECT_TRUE(p.zero_copy_first) << plugin::op_name(type);
    EXPECT_EQ(p.path, ucx_backend::usual_plan(type, 256 * 1024, comm).path) << plugin::op_name(type);
  }
  for (OpType type : {OpType::kAllToAll, OpType::kBarrier, OpType::kSend, OpType::kGather, OpType::kScatter}) {
    EXPECT_FALSE(ucx_backend::plan(type, 1 << 20, comm).zero_copy_first) << plugin::op_name(type);
  }
  comm.zero_copy = false;  // no shared-memory collectives, no zero-copy
  EXPECT_FALSE(ucx_backend::plan(OpType::kAllReduce, 1 << 20, comm).zero_copy_first);
  comm.zero_copy = true;
  comm.zero_copy_min_bytes = 0;  // every size but an empty op
  EXPECT_TRUE(ucx_backend::plan(OpType::kAllReduce, 4, comm).zero_copy_first);
  EXPECT_FALSE(ucx_backend::plan(OpType::kAllReduce, 0, comm).zero_copy_first);
  comm.zero_copy_min_bytes = 256 * 1024;
  auto name = [&](OpType type, size_t bytes) {
    return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
  };
  EXPECT_EQ(paths_json<nlohmann::json>(name, 2, {comm.shm_max_bytes, comm.zero_copy_min_bytes}).at("all_reduce").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":16384,"path":"shm"},{"max_bytes":32768,"path":"sync exchange + local reduce"},{"max_bytes":65535,"path":"sync pipelined ring"},{"max_bytes":262143,"path":"direct copies: each rank reduces its segment"},{"max_bytes":null,"path":"zero-copy where every rank's buffers are the comm's memory, else direct copies: each rank reduces its segment"}])");
}

// The checks above catch a table off by one byte at any of its limits: each
// run's end moved one byte either way disagrees with the plan.
TEST(PathTable, ATableOffByOneByteAtAnyLimitDisagreesWithThePlan) {
  for (int size : {2, 3}) {
    const ucx_backend::UcxShape comm{size, ucx_backend::kShmMaxBytes, true};
    auto name = [&](OpType type, size_t bytes) {
      return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
    };
    const auto paths = paths_json<nlohmann::json>(name, size, {comm.shm_max_bytes});
    const std::vector<size_t> counts = byte_counts(size);
    for (OpType type : {OpType::kAllReduce, OpType::kBroadcast, OpType::kReduceScatter, OpType::kAllToAll}) {
      const Table table = runs_of(paths, type);
      ASSERT_EQ(first_mismatch(table, type, name, counts), kUnbounded);
      for (size_t i = 0; i + 1 < table.size(); ++i) {
        for (int shift : {-1, 1}) {
          Table wrong = table;
          wrong[i].first += static_cast<size_t>(shift);
          EXPECT_NE(first_mismatch(wrong, type, name, counts), kUnbounded)
              << plugin::op_name(type) << " at " << size << " ranks: run " << i << " ending at " << wrong[i].first;
        }
      }
    }
  }
}

// The paths the backends took before there were plans, at 2 ranks.
TEST(PathTable, TwoRankPlansKeepTheBackendsPaths) {
  const auto gloo = paths_json<nlohmann::json>(
      [](OpType type, size_t bytes) {
        return gloo_backend::path_name(type, gloo_backend::plan(type, bytes, {2, true}));
      },
      2, {});
  EXPECT_EQ(gloo.at("all_reduce").dump(),
            R"([{"max_bytes":0,"path":"options-style collective"},{"max_bytes":32768,"path":"sync exchange + local reduce"},{"max_bytes":null,"path":"sync pipelined ring"}])");
  EXPECT_EQ(gloo.at("broadcast").dump(),
            R"([{"max_bytes":0,"path":"options-style collective"},{"max_bytes":262144,"path":"sync broadcast from root"},{"max_bytes":null,"path":"options-style collective"}])");
  EXPECT_EQ(gloo.at("reduce_scatter_v").dump(), R"([{"max_bytes":null,"path":"alltoall(v) + local reduce"}])");
  const ucx_backend::UcxShape comm{2, ucx_backend::kShmMaxBytes, true};
  const auto ucx = paths_json<nlohmann::json>(
      [&](OpType type, size_t bytes) {
        return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
      },
      2, {comm.shm_max_bytes});
  EXPECT_EQ(ucx.at("all_reduce").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":16384,"path":"shm"},{"max_bytes":32768,"path":"sync exchange + local reduce"},{"max_bytes":65535,"path":"sync pipelined ring"},{"max_bytes":null,"path":"direct copies: each rank reduces its segment"}])");
  EXPECT_EQ(ucx.at("broadcast").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":16384,"path":"shm"},{"max_bytes":65535,"path":"sync broadcast from root"},{"max_bytes":null,"path":"direct copies: root and receivers split"}])");
  EXPECT_EQ(ucx.at("all_gather").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":8191,"path":"shm"},{"max_bytes":null,"path":"direct copies: each rank reads every peer's block"}])");
  EXPECT_EQ(ucx.at("barrier").dump(), R"([{"max_bytes":null,"path":"shm"}])");
  EXPECT_EQ(ucx.at("send").dump(), R"([{"max_bytes":null,"path":"ucp tag send/recv"}])");
}

// Across hosts all_reduce takes the hierarchy except in the flat band;
// other ops keep their paths.
TEST(PathTable, AllReduceOverSeveralHostsIsHierarchicalOutsideTheFlatBand) {
  ucx_backend::UcxShape comm{4, 0, false};
  comm.hierarchical = true;
  const auto ucx = paths_json<nlohmann::json>(
      [&](OpType type, size_t bytes) {
        return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
      },
      4, {ucx_backend::kFlatAcrossHostsMinBytes, ucx_backend::kFlatAcrossHostsMaxBytes});
  const std::string hierarchical = "hierarchical: reduce in each host, all_reduce between hosts, broadcast";
  EXPECT_EQ(ucx.at("all_reduce").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":131071,"path":")" + hierarchical +
                R"("},{"max_bytes":262144,"path":"sync pipelined ring"},{"max_bytes":null,"path":")" + hierarchical +
                R"("}])");
  EXPECT_EQ(ucx.at("all_gather").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":16384,"path":"sync exchange"},{"max_bytes":null,"path":"sync pipelined ring"}])");
}

// Over hosts of equal size all_gather takes the hierarchy up to its limit.
TEST(PathTable, AllGatherOverHostsOfEqualSizeIsHierarchicalUpToItsLimit) {
  ucx_backend::UcxShape comm{4, 0, false};
  comm.hierarchical = true;
  comm.hierarchical_all_gather = true;
  auto name = [&](OpType type, size_t bytes) {
    return ucx_backend::path_name(type, bytes, ucx_backend::plan(type, bytes, comm), comm);
  };
  const auto ucx = paths_json<nlohmann::json>(
      name, 4,
      {ucx_backend::kFlatAcrossHostsMinBytes, ucx_backend::kFlatAcrossHostsMaxBytes,
       ucx_backend::kHierarchicalAllGatherMaxBytes});
  EXPECT_EQ(ucx.at("all_gather").dump(),
            R"([{"max_bytes":0,"path":"pairwise exchange"},{"max_bytes":16384,"path":"hierarchical: all_gather in each host, all_gather between hosts, broadcast"},{"max_bytes":null,"path":"sync pipelined ring"}])");
  expect_table_matches(ucx, 4, name, "ucx over hosts of equal size");
}

}  // namespace
}  // namespace comms::cpu_algorithms
