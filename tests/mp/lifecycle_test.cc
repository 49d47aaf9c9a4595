// Offload/reload of Gloo groups under commsrun, run under both routes: specs
// and describe() are identical across a cycle, results stay right, both calls
// are idempotent, and 50 cycles leak neither file descriptors nor memory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <numeric>

#include "comms/comms.h"

namespace comms::dist {
namespace {

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

long rss_kib() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

class LifecycleAcrossRanks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    InitOptions init;
    init.device = Device::cpu();
    init_process_group(init);
  }
  static void TearDownTestSuite() { destroy_process_group(); }
};

int64_t sum_of_ranks_in(Group& g) {
  int64_t v = world().rank();
  g->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  return v;
}

TEST_F(LifecycleAcrossRanks, OffloadAndReloadKeepEverySpecAndDescriptionAndResult) {
  Group w = world();
  const int n = w.size();
  GroupOptions o;
  o.timeout = std::chrono::seconds(33);
  o.options.gloo.busy_poll = false;
  o.description = "all ranks, custom options";
  Group all = new_group(iota_ranks(n), o);
  const std::vector<int> everyone = iota_ranks(n);
  std::vector<int> tail(everyone.begin() + (n > 1 ? 1 : 0), everyone.end());
  Group without_zero = new_group(tail);
  std::vector<std::vector<int>> halves(2);
  for (int r = 0; r < n; ++r) halves[r < (n + 1) / 2 ? 0 : 1].push_back(r);
  if (halves[1].empty()) halves.pop_back();
  SplitGroupOptions so;
  so.backend = "cpu:gloo";
  Group half = split_group(w, halves, so);

  std::vector<Group> mine = {w, all, half};
  if (without_zero) mine.push_back(without_zero);
  std::vector<std::string> before;
  std::vector<GroupSpec> specs;
  for (auto& g : mine) {
    before.push_back(g.describe());
    specs.push_back(g.spec());
  }

  OffloadReport r = offload_groups({DeviceType::kCpu});
  EXPECT_EQ(r.groups_offloaded, int(mine.size())) << r.to_string();
  EXPECT_EQ(r.communicators_destroyed, int(mine.size())) << r.to_string();
  EXPECT_FALSE(r.device_memory_before.has_value()) << "CPU memory is not reported as device memory";
  int32_t x = 1;
  try {
    all->all_reduce(BufferView::of(&x, 1), ReduceOp::sum());
    ADD_FAILURE() << "an op ran on an offloaded group";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offloaded"), std::string::npos) << e.what();
  }
  EXPECT_EQ(offload_groups({DeviceType::kCpu}).communicators_destroyed, 0);

  ReloadReport back = reload_groups();
  EXPECT_EQ(back.groups_reloaded, int(mine.size()));
  EXPECT_EQ(back.communicators_created, int(mine.size()));
  EXPECT_EQ(reload_groups().communicators_created, 0);
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].describe(), before[i]) << "group " << mine[i].name();
    EXPECT_EQ(mine[i].spec(), specs[i]) << "group " << mine[i].name();
  }
  EXPECT_EQ(all->op_timeout(), std::chrono::seconds(33));
  EXPECT_EQ(sum_of_ranks_in(all), int64_t(n) * (n - 1) / 2);
  const auto& hm = halves[w.rank() < (n + 1) / 2 ? 0 : 1];
  EXPECT_EQ(sum_of_ranks_in(half), std::accumulate(hm.begin(), hm.end(), int64_t(0)));
  if (without_zero) {
    EXPECT_EQ(sum_of_ranks_in(without_zero), int64_t(n) * (n - 1) / 2);
  }
  destroy_process_group(all);
  destroy_process_group(half);
  if (without_zero) destroy_process_group(without_zero);
  w->barrier();
}

TEST_F(LifecycleAcrossRanks, FiftyCyclesKeepFileDescriptorsAndMemoryStable) {
  Group w = world();
  Group g = new_group(iota_ranks(w.size()));
  long fds_at_5 = 0, rss_at_5 = 0;
  for (int cycle = 1; cycle <= 50; ++cycle) {
    offload_groups({DeviceType::kCpu});
    reload_groups();
    EXPECT_EQ(sum_of_ranks_in(g), int64_t(w.size()) * (w.size() - 1) / 2) << "cycle " << cycle;
    if (cycle == 5) {
      // Counted between barriers: a peer that goes on (to offload, or to
      // destroy the group) closes its ends, and Gloo's event loop here then
      // closes ours.
      w->barrier();
      fds_at_5 = open_fds();
      rss_at_5 = rss_kib();
      w->barrier();
    }
  }
  w->barrier();
  EXPECT_EQ(open_fds(), fds_at_5) << "file descriptors leaked across offload/reload cycles";
  w->barrier();
#ifndef __SANITIZE_ADDRESS__  // ASan's quarantine holds freed memory; its leak check covers this
  EXPECT_LT(rss_kib() - rss_at_5, 8 * 1024) << "resident memory grew by more than 8 MiB over 45 cycles";
#endif
  destroy_process_group(g);
}

}  // namespace
}  // namespace comms::dist
