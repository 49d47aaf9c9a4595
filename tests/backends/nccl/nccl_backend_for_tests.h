// A one-rank NCCL backend over a FakeNcclApi, created and init()ed as
// libcomms would (eager: connected; lazy: connects at its first op).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "nccl_backend.h"
#include "nccl_test_support.h"

namespace comms::nccl::testing {

// What libcomms hands a rank of comm "world" on cuda:0, with 2 s timeouts.
inline plugin::BackendInit backend_init(std::shared_ptr<MemoryStore> store, int rank = 0, int size = 1,
                                        Hints hints = {}, bool eager = true) {
  plugin::BackendInit init;
  init.comm_name = "world";
  init.rank = rank;
  init.size = size;
  init.local_rank = rank;
  init.device = Device::cuda(0);
  init.eager = eager;
  init.store = std::move(store);
  init.init_timeout = std::chrono::seconds(2);
  init.op_timeout = std::chrono::seconds(2);
  init.hints = std::move(hints);
  return init;
}

inline std::unique_ptr<plugin::Backend> one_rank_backend(std::shared_ptr<FakeNcclApi> api, bool eager,
                                                         std::chrono::milliseconds watchdog_interval) {
  const plugin::BackendInit init = backend_init(std::make_shared<MemoryStore>(), 0, 1, {}, eager);
  std::unique_ptr<plugin::Backend> b;
  Status s = create_nccl_backend(std::move(api), init, &b, {.watchdog_interval = watchdog_interval});
  EXPECT_TRUE(s.is_ok()) << s.message;
  if (b) EXPECT_TRUE(b->init().is_ok());
  return b;
}

}  // namespace comms::nccl::testing
