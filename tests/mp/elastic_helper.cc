// Runs under commsrun --keep-going for the elastic tests. Modes:
//   revoked      rank 0 revokes the world; 300 ms later every other rank's
//                next op fails with kRevoked (they learn it through the
//                store, not from an op), the parent keeps failing so after
//                recover(), and the recovered comm (nobody lost) sums
//                correctly.
//   cycles N     N rounds of: rank 0 revokes, all recover(), check a sum on
//                the new comm, drop the old one; then N planned shrinks
//                excluding the last rank. Prints the fds and threads of this
//                process after the first round and after the last.
//   double-early A B   rank A dies inside an all_reduce; rank B, once its
//                op failed, dies before it joins the agreement.
//   double-late A B    rank A dies inside an all_reduce; rank B joins the
//                agreement, then dies before the shrink: a second round.
//                (A and B default to 1 and 2.)
//   store-host / store-lost  the job's store, in a process of its own, and
//                ranks that see it die (see store_lost()).
//   not-elastic  a comm made with elastic = false costs the store nothing
//                and refuses revoke/agree (see not_elastic()).
// Survivors print "AGREED rank <r> epoch <e> lost [..] size <n> sum <s>
// world_sum <w>": s sums (new rank + 1), w sums (world rank + 1) over the
// new comm, so w tells which ranks it holds.
// ELASTIC_BACKEND picks the backend (default cpu:gloo).
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comms/comms.h"

using namespace comms;

namespace {

// Entries of a /proc folder, once sockets closed by the last destroyed comm
// had time to go.
int count_entries(const char* dir) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

// The sum of (rank + 1) over the comm, which every rank checks.
float checked_sum(Comm& comm) {
  std::vector<float> v(1024, static_cast<float>(comm.rank() + 1));
  comm.all_reduce(BufferView::of(v), ReduceOp::sum());
  const float want = comm.size() * (comm.size() + 1) / 2.0f;
  for (float x : v) {
    if (x != want) {
      std::fprintf(stderr, "rank %d: sum %g, want %g\n", comm.rank(), x, want);
      std::exit(4);
    }
  }
  return want;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

void print_agreed(int world_rank, const Recovery& r) {
  const float sum = checked_sum(*r.comm);
  float world_sum = static_cast<float>(world_rank + 1);
  r.comm->all_reduce(BufferView::of(&world_sum, 1), ReduceOp::sum());
  std::printf("AGREED rank %d epoch %llu lost [%s] size %d sum %g world_sum %g\n", world_rank,
              static_cast<unsigned long long>(r.agreement.epoch), join(r.agreement.lost).c_str(), r.comm->size(),
              sum, world_sum);
  std::fflush(stdout);
}

std::shared_ptr<Comm> world_comm() {
  const char* b = std::getenv("ELASTIC_BACKEND");
  CommOptions options;
  options.elastic = true;
  return new_comm(b ? b : "cpu:gloo", Device::cpu(), "world", options);
}

// Runs all_reduces until one fails; returns its error code.
ErrorCode until_failure(Comm& comm) {
  std::vector<float> v(1 << 14, 1.0f);
  while (true) {
    try {
      comm.all_reduce(BufferView::of(v), ReduceOp::sum());
    } catch (const Error& e) {
      return e.code();
    }
  }
}

int revoked() {
  auto comm = world_comm();
  checked_sum(*comm);
  if (!agree_all(*comm, true)) return 7;  // every rank is past its sum
  if (comm->rank() == 0) revoke(*comm, "the test revokes it");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ErrorCode first = until_failure(*comm);
  std::vector<float> v(4, 1.0f);
  ErrorCode later = ErrorCode::kOk;
  try {
    comm->all_reduce(BufferView::of(v), ReduceOp::sum());
  } catch (const Error& e) {
    later = e.code();
  }
  Recovery r = recover(*comm);
  ErrorCode after = ErrorCode::kOk;
  try {
    comm->barrier();
  } catch (const Error& e) {
    after = e.code();
  }
  std::printf("REVOKED rank %d first %s later %s after_recover %s is_revoked %d\n", comm->rank(),
              std::string(to_string(first)).c_str(), std::string(to_string(later)).c_str(),
              std::string(to_string(after)).c_str(), is_revoked(*comm) ? 1 : 0);
  print_agreed(comm->rank(), r);
  return 0;
}

int cycles(int n) {
  auto comm = world_comm();
  const int world_rank = comm->rank();
  int fds = 0, threads = 0;
  for (int i = 0; i < n; ++i) {
    if (comm->rank() == 0) revoke(*comm, "cycle");
    // An op in flight when rank 0's abort closed its connections may fail
    // with that (peer_failure) before the revocation arrives.
    const ErrorCode failed = until_failure(*comm);
    if (failed != ErrorCode::kRevoked && failed != ErrorCode::kPeerFailure) return 5;
    Recovery r = recover(*comm);
    if (!r.agreement.lost.empty()) return 6;
    comm = r.comm;  // the old one is destroyed here
    checked_sum(*comm);
    // Every rank is past its sum before rank 0 revokes this comm.
    if (!agree_all(*comm, true)) return 7;
    if (i == 0) {
      fds = count_entries("/proc/self/fd");
      threads = count_entries("/proc/self/task");
    }
  }
  std::printf("CYCLES rank %d recover fds %d -> %d threads %d -> %d\n", world_rank, fds,
              count_entries("/proc/self/fd"), threads, count_entries("/proc/self/task"));
  for (int i = 0; i < n; ++i) {
    {
      const int last[] = {comm->size() - 1};
      auto smaller = shrink(*comm, last);
      if (smaller) checked_sum(*smaller);
    }
    comm->barrier();  // the parent stays usable after a planned shrink
    if (i == 0) {
      fds = count_entries("/proc/self/fd");
      threads = count_entries("/proc/self/task");
    }
  }
  std::printf("CYCLES rank %d planned fds %d -> %d threads %d -> %d\n", world_rank, fds,
              count_entries("/proc/self/fd"), threads, count_entries("/proc/self/task"));
  std::fflush(stdout);
  return 0;
}

int double_kill(bool late, int first, int second) {
  auto comm = world_comm();
  checked_sum(*comm);
  const int rank = comm->rank();
  if (rank == first) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      kill(getpid(), SIGKILL);
    }).detach();
  }
  until_failure(*comm);
  if (rank == second && !late) kill(getpid(), SIGKILL);
  if (rank == second) {
    revoke(*comm, "the second victim saw the failure");
    const Agreement a = agree_on_failures(*comm);
    std::printf("rank %d joined round %d (lost [%s]) and dies\n", rank, a.round, join(a.lost).c_str());
    std::fflush(stdout);
    kill(getpid(), SIGKILL);
  }
  print_agreed(rank, recover(*comm));
  return 0;
}

// A comm created with elastic = false: nothing of elastic recovery's reaches
// the store (no watcher tick, so the job-wide revocation counter never
// appears), revoke() and agree_on_failures() are refused with
// kInvalidArgument and leave the comm working; an elastic comm made next
// does tick. Prints "NOT_ELASTIC rank <r> ...".
ErrorCode refused(const std::function<void()>& call, bool* says_why) {
  try {
    call();
  } catch (const Error& e) {
    *says_why = std::string(e.what()).find("COMMS_ELASTIC=1") != std::string::npos;
    return e.code();
  }
  return ErrorCode::kOk;
}

int not_elastic() {
  const BootstrapInfo boot = bootstrap_from_environment();
  CommOptions options;
  options.elastic = false;
  options.store = default_store(boot.rank, boot.world_size, std::chrono::seconds(20));
  const char* b = std::getenv("ELASTIC_BACKEND");
  auto comm = new_comm(b ? b : "cpu:gloo", Device::cpu(), "plain", options);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // five watcher periods
  const bool ticked_before = options.store->check({"comms/elastic/revocations"});
  bool agree_why = false, revoke_why = false;
  const ErrorCode agree = refused([&] { agree_on_failures(*comm); }, &agree_why);
  const ErrorCode revoked = refused([&] { revoke(*comm); }, &revoke_why);
  const float sum = checked_sum(*comm);  // every rank has looked at the store by now
  options.elastic = true;
  auto watched = new_comm(b ? b : "cpu:gloo", Device::cpu(), "watched", options);
  bool ticked_after = false;
  for (int i = 0; i < 100 && !ticked_after; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ticked_after = options.store->check({"comms/elastic/revocations"});
  }
  std::printf("NOT_ELASTIC rank %d elastic %d ticked %d agree %s%s revoke %s%s sum %g is_revoked %d; elastic %d ticked %d\n",
              comm->rank(), comm->elastic(), ticked_before, std::string(to_string(agree)).c_str(),
              agree_why ? " (says why)" : "", std::string(to_string(revoked)).c_str(), revoke_why ? " (says why)" : "",
              sum, is_revoked(*comm), watched->elastic(), ticked_after);
  std::fflush(stdout);
  checked_sum(*watched);
  return 0;
}

// store-host: hosts the job's TCP store on a free loopback port, prints
// "STORE_PORT <port>" and waits to be killed (the test kills it mid-job).
int store_host() {
  TcpStoreServer server("127.0.0.1", 0);
  std::printf("STORE_PORT %u\n", server.port());
  std::fflush(stdout);
  while (true) pause();
}

// store-lost: an elastic comm runs all_reduces until one fails once the
// store is gone; prints "STORE_LOST rank <r> op <code> <whether the message
// names the store> recover <code> <same>".
int store_lost() {
  auto comm = world_comm();
  checked_sum(*comm);
  std::printf("READY rank %d\n", comm->rank());
  std::fflush(stdout);
  std::string op_message, recover_message = "none";
  const ErrorCode op = [&] {
    std::vector<float> v(256, 1.0f);
    while (true) {
      try {
        comm->all_reduce(BufferView::of(v), ReduceOp::sum());
      } catch (const Error& e) {
        op_message = e.what();
        return e.code();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // ranks may outnumber cores
    }
  }();
  ErrorCode recovered = ErrorCode::kOk;
  try {
    recover(*comm);
  } catch (const Error& e) {
    recovered = e.code();
    recover_message = e.what();
  }
  const auto names_store = [](const std::string& m) { return m.find("the job's store") != std::string::npos; };
  std::printf("STORE_LOST rank %d op %s %d recover %s %d\n", comm->rank(), std::string(to_string(op)).c_str(),
              names_store(op_message), std::string(to_string(recovered)).c_str(), names_store(recover_message));
  std::fprintf(stderr, "rank %d: op: %s\nrank %d: recover: %s\n", comm->rank(), op_message.c_str(), comm->rank(),
               recover_message.c_str());
  std::fflush(stdout);
  // Stays a while, so that the others' watchers (not this exit) fail them.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "revoked") return revoked();
    if (mode == "cycles") return cycles(argc > 2 ? std::atoi(argv[2]) : 20);
    if (mode == "double-early" || mode == "double-late") {
      return double_kill(mode == "double-late", argc > 2 ? std::atoi(argv[2]) : 1, argc > 3 ? std::atoi(argv[3]) : 2);
    }
    if (mode == "not-elastic") return not_elastic();
    if (mode == "store-host") return store_host();
    if (mode == "store-lost") return store_lost();
  } catch (const Error& e) {
    std::fprintf(stderr, "elastic_helper: %s: %s\n", std::string(to_string(e.code())).c_str(), e.what());
    return 3;
  }
  std::fprintf(stderr, "elastic_helper: unknown mode '%s'\n", mode.c_str());
  return 2;
}
