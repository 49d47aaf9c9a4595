// A one-rank NCCL backend over a FakeNcclApi, created and init()ed as
// libcomms would (eager: connected; lazy: connects at its first op).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "nccl_backend.h"
#include "nccl_test_support.h"

namespace comms::nccl::testing {

inline std::unique_ptr<plugin::Backend> one_rank_backend(std::shared_ptr<FakeNcclApi> api, bool eager,
                                                         std::chrono::milliseconds watchdog_interval) {
  plugin::BackendInit init;
  init.comm_name = "world";
  init.device = Device::cuda(0);
  init.eager = eager;
  init.store = std::make_shared<MemoryStore>();
  init.init_timeout = std::chrono::seconds(2);
  init.op_timeout = std::chrono::seconds(2);
  std::unique_ptr<plugin::Backend> b;
  Status s = create_nccl_backend(std::move(api), init, &b, {.watchdog_interval = watchdog_interval});
  EXPECT_TRUE(s.is_ok()) << s.message;
  if (b) EXPECT_TRUE(b->init().is_ok());
  return b;
}

}  // namespace comms::nccl::testing
