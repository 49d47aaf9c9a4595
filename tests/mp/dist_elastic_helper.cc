// Runs under commsrun --keep-going for dist_elastic_test. Every rank builds
// groups, rank K SIGKILLs itself inside a world all_reduce, the survivors
// recover and print what each group became. Sums are of 2^(old world rank)
// over a group's members, so a sum names its membership exactly.
//   groups K     A = all but the last rank, B = the last two, C = {1, last},
//                D = {1}, E = split_group {0,1,2} / {3..}; dist::recover().
//                Prints "RESULT ...", then "GROUP <name> ..." for each.
//   mp TP RULE K initialize_model_parallel(tp=TP), recover_model_parallel
//                with RULE "drop" (drop_replicas()) or "none". Prints "MP
//                ...", "EXCLUDED ..." or "REFUSED <code> <message>" (then
//                "WORLD size <n> sum <s>" of the recovered world).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comms/comms.h"
#include "comms/dist.h"
#include "comms/parallel.h"

using namespace comms;

namespace {

int old_rank = -1;

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// Sum of 2^(old world rank) over the comm's members.
long long member_sum(Comm& comm) {
  std::vector<float> v(256, static_cast<float>(1 << old_rank));
  comm.all_reduce(BufferView::of(v), ReduceOp::sum());
  for (float x : v) {
    if (x != v[0]) {
      std::fprintf(stderr, "rank %d: uneven sum\n", old_rank);
      std::exit(4);
    }
  }
  return static_cast<long long>(v[0]);
}

// Rank `victim` dies 20 ms into a loop of world all_reduces; the others
// return once one fails (the failure, or the recovery's revocation).
void lose(int victim) {
  Comm& w = dist::world().comm();
  if (!agree_all(w, true)) std::exit(7);  // every rank is past its sums
  if (old_rank == victim) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      kill(getpid(), SIGKILL);
    }).detach();
  }
  std::vector<float> v(1 << 14, 1.0f);
  while (true) {
    try {
      w.all_reduce(BufferView::of(v), ReduceOp::sum());
    } catch (const Error&) {
      return;
    }
  }
}

int groups(int victim) {
  dist::InitOptions init;
  init.device = Device::cpu();
  dist::init_process_group(init);
  old_rank = dist::world().rank();
  const int n = dist::world().size();
  std::map<std::string, dist::Group> g;
  std::vector<int> a;
  for (int r = 0; r + 1 < n; ++r) a.push_back(r);
  auto named = [](const char* name) {
    dist::GroupOptions o;
    o.name = name;
    return o;
  };
  g["A"] = dist::new_group(a, named("A"));
  g["B"] = dist::new_group({n - 2, n - 1}, named("B"));
  g["C"] = dist::new_group({1, n - 1}, named("C"));
  g["D"] = dist::new_group({1}, named("D"));
  std::vector<int> high;
  for (int r = 3; r < n; ++r) high.push_back(r);
  g["E"] = dist::split_group(dist::world(), {std::vector<int>{0, 1, 2}, high}, [] {
    dist::SplitGroupOptions o;
    o.name = "E";
    return o;
  }());
  // Held, so a rebuilt group's new comm cannot reuse the old one's address.
  std::map<std::string, std::shared_ptr<Comm>> before;
  for (auto& [name, group] : g) {
    if (group) {
      member_sum(group.comm());
      before[name] = group.shared_comm();
    }
  }
  lose(victim);
  const dist::RecoverResult r = dist::recover();
  std::printf("RESULT old %d new %d world %d epoch %llu lost [%s] rebuilt [%s] kept [%s] removed [%s]\n", old_rank,
              r.rank, r.world_size, static_cast<unsigned long long>(r.epoch), join(r.lost).c_str(),
              join(r.rebuilt).c_str(), join(r.kept).c_str(), join(r.removed).c_str());
  std::printf("GROUP %d world ranks [%s] sum %lld\n", old_rank, join(dist::world().global_ranks()).c_str(),
              member_sum(dist::world().comm()));
  for (auto& [name, group] : g) {
    if (!group) {
      std::printf("GROUP %d %s none\n", old_rank, name.c_str());
      continue;
    }
    const long long sum = member_sum(group.comm());
    std::printf("GROUP %d %s ranks [%s] rank %d sum %lld same_comm %d\n", old_rank, name.c_str(),
                join(group.global_ranks()).c_str(), group.rank(), sum, before[name].get() == &group.comm() ? 1 : 0);
  }
  std::fflush(stdout);
  dist::destroy_process_group();
  return 0;
}

int model_parallel(int tp, const std::string& rule, int victim) {
  dist::InitOptions init;
  init.device = Device::cpu();
  dist::init_process_group(init);
  old_rank = dist::world().rank();
  dist::ParallelConfig cfg;
  cfg.tp = tp;
  auto pgs = dist::initialize_model_parallel(cfg);
  member_sum(pgs.tp().comm());
  member_sum(pgs.dp().comm());
  const std::shared_ptr<Comm> tp_before = pgs.tp().shared_comm();
  lose(victim);
  dist::RecoverResult r;
  try {
    r = dist::recover_model_parallel(pgs, rule == "drop" ? dist::drop_replicas() : dist::ShrinkRule{});
  } catch (const Error& e) {
    std::printf("REFUSED %s %s\n", std::string(to_string(e.code())).c_str(), e.what());
    std::printf("WORLD %d size %d sum %lld has_tp %d\n", old_rank, dist::world().size(), member_sum(dist::world().comm()),
                pgs.has("tp") ? 1 : 0);
    std::fflush(stdout);
    return 0;
  }
  if (r.excluded) {
    std::printf("EXCLUDED old %d lost [%s] dropped [%s] initialized %d\n", old_rank, join(r.lost).c_str(),
                join(r.dropped).c_str(), dist::is_initialized() ? 1 : 0);
    std::fflush(stdout);
    return 0;
  }
  const long long tp_sum = member_sum(pgs.tp().comm());
  const long long dp_sum = member_sum(pgs.dp().comm());
  std::printf("MP old %d new %d world %d dp_size %d dropped [%s] tp [%s] dp [%s] tp_sum %lld dp_sum %lld tp_same %d\n",
              old_rank, r.rank, r.world_size, pgs.plan().dp, join(r.dropped).c_str(),
              join(pgs.tp().global_ranks()).c_str(), join(pgs.dp().global_ranks()).c_str(), tp_sum, dp_sum,
              tp_before.get() == &pgs.tp().comm() ? 1 : 0);
  std::fflush(stdout);
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "groups" && argc == 3) return groups(std::atoi(argv[2]));
    if (mode == "mp" && argc == 5) return model_parallel(std::atoi(argv[2]), argv[3], std::atoi(argv[4]));
  } catch (const Error& e) {
    std::fprintf(stderr, "dist_elastic_helper rank %d: %s: %s\n", old_rank, std::string(to_string(e.code())).c_str(),
                 e.what());
    return 3;
  }
  std::fprintf(stderr, "dist_elastic_helper: usage: groups K | mp TP drop|none K\n");
  return 2;
}
