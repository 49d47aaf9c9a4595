// Splitting an NCCL backend whose communicator does not exist yet (no CUDA op
// ran): a member's child is lazy too and makes its own communicator
// (ncclCommInitRank) on its first op, with the parent's hints merged; a
// non-member gets nothing; nothing reaches NCCL at the split.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "nccl_backend.h"
#include "nccl_backend_for_tests.h"
#include "nccl_test_support.h"

namespace comms::nccl {
namespace {

using namespace std::chrono_literals;
using plugin::Backend;
using plugin::BackendInit;
using ::testing::ElementsAre;

BackendInit lazy_init(std::shared_ptr<testing::MemoryStore> store, int rank, int size, Hints hints) {
  return testing::backend_init(std::move(store), rank, size, std::move(hints), /*eager=*/false);
}

TEST(NcclLazySplitTest, ALazyParentGivesALazyChildThatInitializesOnFirstOp) {
  auto api = std::make_shared<testing::FakeNcclApi>();
  auto store = std::make_shared<testing::MemoryStore>();
  std::unique_ptr<Backend> parent;
  ASSERT_TRUE(create_nccl_backend(api, lazy_init(store, 0, 2, {{"cga_cluster_size", "2"}}), &parent,
                                  {.watchdog_interval = 5ms})
                  .is_ok());
  ASSERT_TRUE(parent->init().is_ok());

  plugin::SplitDesc outsider;
  outsider.child = lazy_init(store, 0, 1, {});
  std::unique_ptr<Backend> none;
  ASSERT_TRUE(parent->split(outsider, &none).is_ok());
  EXPECT_EQ(none, nullptr);

  const int ranks[] = {0};
  plugin::SplitDesc desc;
  desc.ranks = ranks;
  desc.child = lazy_init(store, 0, 1, {{"max_ctas", "8"}});
  desc.child.comm_name = "world/tp";
  std::unique_ptr<Backend> child;
  Status s = parent->split(desc, &child);
  ASSERT_TRUE(s.is_ok()) << s.message;
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(api->call_names().empty());
  auto j = nlohmann::json::parse(child->describe());
  EXPECT_EQ(j["initialized"], false);
  EXPECT_EQ(j["nccl_config"]["cga_cluster_size"], 2);
  EXPECT_EQ(j["nccl_config"]["max_ctas"], 8);

  plugin::OpDesc op;
  op.type = plugin::OpType::kAllReduce;
  op.seq = 1;
  op.count = 4;
  op.dtype = DataType::kFloat32;
  op.device = Device::cuda(0);
  op.input = reinterpret_cast<const void*>(0x10000);
  op.output = reinterpret_cast<void*>(0x20000);
  op.async = true;
  std::unique_ptr<plugin::Work> w;
  ASSERT_TRUE(child->submit(op, &w).is_ok());
  EXPECT_TRUE(w->wait(WaitMode::kBlocking).is_ok());
  EXPECT_THAT(api->call_names(), ElementsAre("comm_init", "all_reduce"));
  {
    auto l = api->lock();
    EXPECT_TRUE(api->split_color_key.empty());
  }
  EXPECT_TRUE(child->finalize().is_ok());
  EXPECT_TRUE(parent->finalize().is_ok());
}

}  // namespace
}  // namespace comms::nccl
