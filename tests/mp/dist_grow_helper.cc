// Runs under commsrun --keep-going for dist_grow_test. Sums are of
// 2^(world rank) over a group's members, so a sum names its membership.
//   heal        4 ranks: A = new_group {0,1,2}, E = split_group {0,1} |
//               {2,3}, a collection tp=2 "mp". Rank 3 SIGKILLs itself inside
//               a world all_reduce; recover_model_parallel(drop_replicas())
//               leaves ranks 0 and 1 and drops rank 2, which joins again
//               (join_process_group) beside a replacement rank 0 starts for
//               rank 3; the members admit both (admit_model_parallel).
//               Every rank of the grown world prints "ADMIT ..." and
//               "GROUPS ...", then creates a new group {1,2,3} and prints
//               "NEW ...", then admits with nobody waiting and prints
//               "IDLE ... same <1 when every Comm object stayed>".
//   plain       3 ranks: pg1 = new_group {0,2}, S = split_group {0,1} | {2};
//               rank 0 starts a newcomer, the members admit it (admit());
//               every rank prints "PLAIN ..." with its view of the groups,
//               then all make new_group {1,3} and print "NEW ...".
//   unfit       2 ranks with a collection tp=2 admit one newcomer: 3 ranks
//               do not fit the layout. Every rank prints "UNFIT rank <r>
//               code <error code or none> world <sum> has_tp <0|1>", the
//               members "WHY <message>".
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comms/comms.h"
#include "newcomer.h"
#include "comms/dist.h"
#include "comms/parallel.h"


using namespace comms;
using comms::testing::start_newcomer;
using comms::testing::wait_child;
using namespace std::chrono_literals;

namespace {

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

// Sum of 2^(world rank) over the group's members.
long long member_sum(Comm& comm) {
  std::vector<float> v(256, static_cast<float>(1 << dist::world().rank()));
  comm.all_reduce(BufferView::of(v), ReduceOp::sum());
  for (float x : v) {
    if (x != v[0]) {
      std::fprintf(stderr, "rank %d: uneven sum\n", dist::world().rank());
      std::exit(4);
    }
  }
  return static_cast<long long>(v[0]);
}

// "ranks [..] sum S" of a member, "none" elsewhere.
std::string describe(const dist::Group& g) {
  if (!g) return "none";
  return "[" + join(g.global_ranks()) + "] " + std::to_string(member_sum(g.comm()));
}

// Tickets 0..n-1 of the world's join queue are taken and their processes
// recorded (the store layout core/comm/grow.cc documents): n newcomers wait.
void await_tickets(int n) {
  auto store = default_store(-1, 0, 60s);
  for (int t = 0; t < n; ++t) store->get("comms/elastic/join/world/ticket/" + std::to_string(t), 60s);
}

// Rank `victim` dies 20 ms into a loop of world all_reduces; the others
// return once one fails.
void lose(int victim) {
  Comm& w = dist::world().comm();
  if (!agree_all(w, true)) std::exit(7);
  if (w.rank() == victim) {
    std::thread([] {
      std::this_thread::sleep_for(20ms);
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

void print_admission(const dist::AdmitResult& a, bool newcomer) {
  std::printf("ADMIT rank %d newcomer %d grown %d joined [%s] members %d world %d epoch %llu rebuilt [%s] "
              "created [%s] kept [%s]\n",
              a.rank, newcomer ? 1 : 0, a.grown ? 1 : 0, join(a.joined).c_str(), a.old_world_size, a.world_size,
              static_cast<unsigned long long>(a.epoch), join(a.rebuilt).c_str(), join(a.created).c_str(),
              join(a.kept).c_str());
}

// What every rank of the grown world does in "heal": check every group,
// make one more, admit with nobody waiting.
// A and E are the members' handles (empty on a newcomer).
int after_heal(dist::ProcessGroupCollection& pgs, bool newcomer, const dist::Group& a, const dist::Group& e) {
  const int r = dist::world().rank();
  std::printf("GROUPS rank %d newcomer %d world %s A %s E %s tp %s dp %s groups %zu\n", r, newcomer ? 1 : 0,
              describe(dist::world()).c_str(), describe(a).c_str(), describe(e).c_str(), describe(pgs.tp()).c_str(),
              describe(pgs.dp()).c_str(), dist::groups().size());
  dist::Group made = dist::new_group({1, 2, 3});
  std::printf("NEW rank %d %s name %s\n", r, describe(made).c_str(), made ? made.name().c_str() : "-");
  Comm* world_before = &dist::world().comm();
  Comm* tp_before = &pgs.tp().comm();
  Comm* dp_before = &pgs.dp().comm();
  const dist::AdmitResult idle = dist::admit_model_parallel(pgs);
  const dist::AdmitResult plain = dist::admit();
  const bool same = !idle.grown && !plain.grown && &dist::world().comm() == world_before &&
                    &pgs.tp().comm() == tp_before && &pgs.dp().comm() == dp_before && idle.world_size == 4;
  std::printf("IDLE rank %d same %d world %s\n", r, same ? 1 : 0, describe(dist::world()).c_str());
  std::fflush(stdout);
  dist::destroy_process_group();
  return 0;
}

int heal() {
  dist::InitOptions init;
  init.device = Device::cpu();
  dist::init_process_group(init);
  const int first_rank = dist::world().rank();
  dist::GroupOptions a_options;
  a_options.name = "A";
  const dist::Group a = dist::new_group({0, 1, 2}, a_options);
  dist::SplitGroupOptions e_options;
  e_options.name = "E";
  const dist::Group e = dist::split_group(dist::world(), {std::vector<int>{0, 1}, std::vector<int>{2, 3}}, e_options);
  dist::ParallelConfig cfg;
  cfg.tp = 2;
  cfg.name = "mp";
  auto pgs = dist::initialize_model_parallel(cfg);
  member_sum(pgs.tp().comm());
  member_sum(pgs.dp().comm());
  lose(3);
  const dist::RecoverResult r = dist::recover_model_parallel(pgs, dist::drop_replicas());
  if (r.excluded) {
    // Dropped with its replica: this process joins again, as a newcomer.
    std::printf("EXCLUDED old %d\n", first_rank);
    std::fflush(stdout);
    dist::JoinResult j = dist::join_process_group();
    print_admission(j.admission, true);
    if (!j.collection) return 8;
    return after_heal(*j.collection, true, {}, {});
  }
  pid_t replacement = -1;
  if (r.rank == 0) {
    replacement = start_newcomer("heal");
    await_tickets(2);  // the replacement and the dropped rank
  }
  const dist::AdmitResult grown = dist::admit_model_parallel(pgs);
  print_admission(grown, false);
  const int rc = after_heal(pgs, false, a, e);
  if (replacement > 0 && wait_child(replacement) != 0) return 6;
  return rc;
}

int plain() {
  dist::InitOptions init;
  init.device = Device::cpu();
  dist::init_process_group(init);
  const dist::Group pg1 = dist::new_group({0, 2});  // "pg1": the newcomer must count on from it
  dist::SplitGroupOptions s_options;
  s_options.name = "S";
  const dist::Group s = dist::split_group(dist::world(), {std::vector<int>{0, 1}, std::vector<int>{2}}, s_options);
  pid_t newcomer = -1;
  if (dist::world().rank() == 0) {
    newcomer = start_newcomer("plain");
    await_tickets(1);
  }
  const dist::AdmitResult grown = dist::admit();
  print_admission(grown, false);
  std::printf("PLAIN rank %d newcomer 0 world %s pg1 %s S %s groups %zu\n", dist::world().rank(),
              describe(dist::world()).c_str(), describe(pg1).c_str(), describe(s).c_str(), dist::groups().size());
  dist::Group made = dist::new_group({1, 3});
  std::printf("NEW rank %d %s name %s\n", dist::world().rank(), describe(made).c_str(),
              made ? made.name().c_str() : "-");
  std::fflush(stdout);
  dist::destroy_process_group();
  if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
  return 0;
}

void print_unfit(const dist::ProcessGroupCollection& pgs, const std::string& code) {
  std::printf("UNFIT rank %d code %s world %s has_tp %d\n", dist::world().rank(), code.c_str(),
              describe(dist::world()).c_str(), pgs.has("tp") ? 1 : 0);
  std::fflush(stdout);
}

int unfit() {
  dist::InitOptions init;
  init.device = Device::cpu();
  dist::init_process_group(init);
  dist::ParallelConfig cfg;
  cfg.tp = 2;
  auto pgs = dist::initialize_model_parallel(cfg);
  pid_t newcomer = -1;
  if (dist::world().rank() == 0) {
    newcomer = start_newcomer("unfit");
    await_tickets(1);
  }
  std::string code = "none";
  try {
    dist::admit_model_parallel(pgs);
  } catch (const Error& e) {
    code = std::string(to_string(e.code()));
    std::printf("WHY rank %d %s\n", dist::world().rank(), e.what());
  }
  print_unfit(pgs, code);
  dist::destroy_process_group();
  if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
  return 0;
}

int newcomer(const std::string& scenario) {
  JoinOptions o;
  o.timeout = 60s;
  dist::JoinResult j = dist::join_process_group(o);
  print_admission(j.admission, true);
  if (scenario == "heal") {
    if (!j.collection) return 8;
    return after_heal(*j.collection, true, {}, {});
  }
  if (scenario == "unfit") {
    if (!j.collection) return 8;
    print_unfit(*j.collection, "none");
    dist::destroy_process_group();
    return 0;
  }
  std::printf("PLAIN rank %d newcomer 1 world %s pg1 none S none groups %zu\n", dist::world().rank(),
              describe(dist::world()).c_str(), dist::groups().size());
  dist::Group made = dist::new_group({1, 3});
  std::printf("NEW rank %d %s name %s\n", dist::world().rank(), describe(made).c_str(),
              made ? made.name().c_str() : "-");
  std::fflush(stdout);
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "heal") return heal();
    if (mode == "plain") return plain();
    if (mode == "unfit") return unfit();
    if (mode == "newcomer" && argc == 3) return newcomer(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "dist_grow_helper %s: %s: %s\n", mode.c_str(), std::string(to_string(e.code())).c_str(),
                 e.what());
    return 3;
  }
  std::fprintf(stderr, "dist_grow_helper: usage: heal | plain | unfit | newcomer heal|plain|unfit\n");
  return 2;
}
