// The NCCL plugin's CPU cost per eager op, for callgrind: N all_reduces of
// 8 B through Backend::submit and Work::wait(kStream), as libcomms issues an
// async op, against FakeNcclApi (whose own bookkeeping is part of the count
// but the same before and after a change). run_ops is the function to count;
// scripts/nccl_op_cost.sh runs N and 2N and prints (I(2N) - I(N)) / N.
// Not a test: built with the unit tests, run by that script.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "nccl_backend.h"
#include "nccl_test_support.h"

namespace {

using namespace comms;

__attribute__((noinline)) int run_ops(plugin::Backend& b, size_t n) {
  float in = 1.0f, out = 0.0f;
  plugin::OpDesc d;
  d.type = plugin::OpType::kAllReduce;
  d.count = 2;
  d.dtype = DataType::kFloat32;
  d.device = Device::cuda(0);
  d.input = &in;
  d.output = &out;
  d.async = true;
  int failures = 0;
  for (size_t i = 0; i < n; ++i) {
    d.seq = i + 2;
    std::unique_ptr<plugin::Work> w;
    if (!b.submit(d, &w).is_ok() || !w->wait(WaitMode::kStream).is_ok()) ++failures;
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1000;
  auto api = std::make_shared<nccl::testing::FakeNcclApi>();
  api->record_calls = false;
  plugin::BackendInit init;
  init.comm_name = "cost";
  init.device = Device::cuda(0);
  init.eager = true;
  init.store = std::make_shared<nccl::testing::MemoryStore>();
  init.init_timeout = std::chrono::seconds(10);
  init.op_timeout = std::chrono::seconds(600);
  std::unique_ptr<plugin::Backend> b;
  // The watchdog retires ops as in production (every 20 ms), off this thread.
  if (Status s = nccl::create_nccl_backend(api, init, &b); !s.is_ok() || !b->init().is_ok()) {
    std::fprintf(stderr, "nccl_op_cost: could not create the backend: %s\n", s.message.c_str());
    return 1;
  }
  const int failures = run_ops(*b, n);
  if (Status s = b->finalize(); !s.is_ok() || failures) {
    std::fprintf(stderr, "nccl_op_cost: %d ops failed; finalize: %s\n", failures, s.message.c_str());
    return 1;
  }
  std::printf("%zu ops\n", n);
  return 0;
}
