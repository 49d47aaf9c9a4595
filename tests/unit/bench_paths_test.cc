// comms-bench's algorithm column (tools/comms-bench/backend_paths.h) reads
// the path a backend reports for an op and a size from the backend's own
// describe() "paths", and says nothing where the backend says nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend_paths.h"

namespace comms::bench {
namespace {

// A comm's describe() with a cpu backend reporting two ops' paths.
nlohmann::json described() {
  return nlohmann::json::parse(R"({
    "name": "bench",
    "backends": {
      "cpu": {"backend": "gloo", "config": {"busy_poll": "auto", "paths": {
        "all_reduce": [{"max_bytes": 4096, "path": "exchange"},
                       {"max_bytes": 262144, "path": "pipelined ring"},
                       {"max_bytes": null, "path": "gloo ring"}],
        "broadcast": [{"max_bytes": 0, "path": "nothing"}, {"max_bytes": 1024, "path": "tree"}]}}},
      "cuda": {"backend": "nccl", "config": {"nccl_version": "2.28.9"}}
    }})");
}

TEST(BenchPaths, EachSizeTakesTheFirstEntryWhoseBoundHoldsIt) {
  const auto paths = BackendPaths::from_describe(described(), DeviceType::kCpu);
  EXPECT_EQ(paths.path("all_reduce", 8), "exchange");
  EXPECT_EQ(paths.path("all_reduce", 4096), "exchange") << "max_bytes is inclusive";
  EXPECT_EQ(paths.path("all_reduce", 4097), "pipelined ring");
  EXPECT_EQ(paths.path("all_reduce", 262144), "pipelined ring");
  EXPECT_EQ(paths.path("all_reduce", 262145), "gloo ring") << "null: no bound";
  EXPECT_EQ(paths.path("all_reduce", size_t{1} << 40), "gloo ring");
  EXPECT_EQ(paths.path("broadcast", 0), "nothing");
  EXPECT_EQ(paths.path("broadcast", 1), "tree");
}

TEST(BenchPaths, AnOpOrSizeTheBackendDoesNotListHasNoPath) {
  const auto paths = BackendPaths::from_describe(described(), DeviceType::kCpu);
  EXPECT_EQ(paths.path("all_gather", 8), "") << "op not listed";
  EXPECT_EQ(paths.path("broadcast", 1025), "") << "past the last bound";
}

TEST(BenchPaths, ABackendWithoutPathsHasNone) {
  EXPECT_EQ(BackendPaths::from_describe(described(), DeviceType::kCuda).path("all_reduce", 8), "");
  EXPECT_EQ(BackendPaths::from_describe(nlohmann::json::parse(R"({"backends": {}})"), DeviceType::kCpu)
                .path("all_reduce", 8),
            "");
  EXPECT_EQ(BackendPaths().path("all_reduce", 8), "");
}

TEST(BenchPaths, AMalformedListIsReadAsNoPathNotAsAnError) {
  for (const char* bad : {R"({"all_reduce": {"max_bytes": 8, "path": "x"}})",
                          R"({"all_reduce": [{"max_bytes": -1, "path": "x"}]})",
                          R"({"all_reduce": [{"max_bytes": "8", "path": "x"}]})",
                          R"({"all_reduce": [{"max_bytes": 8}]})", R"(["all_reduce"])"}) {
    EXPECT_EQ(BackendPaths(nlohmann::json::parse(bad)).path("all_reduce", 4), "") << bad;
  }
}

}  // namespace
}  // namespace comms::bench
