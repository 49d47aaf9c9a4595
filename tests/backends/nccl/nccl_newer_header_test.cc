// The NCCL plugin's logic compiled against a newer nccl.h than CUDA's (the
// wheel pinned in backends/nccl/newer-header.txt): that it builds at all is
// most of the check (nccl_api.cc's layout asserts run against that header);
// here it also runs on the fake NCCL at that release.
#include <gtest/gtest.h>

#include <cstddef>
#include <nlohmann/json.hpp>

#include "nccl_backend.h"
#include "nccl_backend_for_tests.h"
#include "nccl_test_support.h"

namespace comms::nccl {
namespace {

static_assert(NCCL_VERSION_CODE > NCCL_VERSION(2, 30, 0), "built against CUDA's nccl.h, not the newer one");

TEST(NcclNewerHeader, TheConfigLayoutIsTheHeadersAndEveryKeyReachesIt) {
  EXPECT_EQ(offsetof(NcclConfig, graphStreamOrdering), offsetof(ncclConfig_t, graphStreamOrdering));
  EXPECT_LE(sizeof(NcclConfig), sizeof(ncclConfig_t));
  Hints all;
  for (const char* key : hint_keys()) all[key] = "1";
  all["blocking"] = "0";
  all["net_name"] = "IB";
  all["comm_name"] = "newer";
  TranslatedHints t;
  Status s = translate_hints(all, NCCL_VERSION_CODE, &t);
  ASSERT_TRUE(s.is_ok()) << s.message;
  NcclConfig c = initial_config(NCCL_VERSION_CODE);
  apply_to_config(t.config, &c);
  EXPECT_EQ(c.graphStreamOrdering, 1);
  EXPECT_EQ(c.maxP2pPeers, 1);
  EXPECT_EQ(c.version, static_cast<unsigned>(kNcclConfigLayoutVersion));
}

TEST(NcclNewerHeader, ABackendRunsOnTheFakeAtThatRelease) {
  auto api = std::make_shared<testing::FakeNcclApi>();
  api->set_version(NCCL_VERSION_CODE);
  auto b = testing::one_rank_backend(api, /*eager=*/true, std::chrono::milliseconds(5));
  ASSERT_TRUE(b);
  auto j = nlohmann::json::parse(b->describe());
  EXPECT_EQ(j["nccl_headers"], nccl_version_string(NCCL_VERSION_CODE));
  EXPECT_EQ(j["suspend"]["available"], true);
  ASSERT_TRUE(b->suspend().is_ok());
  ASSERT_TRUE(b->resume().is_ok());
  EXPECT_TRUE(b->finalize().is_ok());
}

}  // namespace
}  // namespace comms::nccl
