// Runs under commsrun for the elastic growth tests (grow_test.cc). The
// members make an elastic comm "world"; a newcomer is this program started
// by a member in mode "newcomer <scenario>" (commsrun --replace does not
// exist yet), with the member's environment, so it reaches the same store.
// Modes (members):
//   idle            admit() with nobody waiting, three times: prints
//                   "IDLE rank <r> same <0|1> ops <before> -> <after> store
//                   <calls>" for the last call: the comm's op count from its
//                   flight recorder and the store calls the admission made.
//   grow K          rank 0 starts a newcomer before step K and waits for its
//                   ticket; every member admits at every step; from step K
//                   on the comm has one rank more.
//   replace K       the last rank SIGKILLs itself at step K; the others
//                   recover(), rank 0 starts a replacement, all admit it.
//   killed          rank 0 starts a newcomer and SIGKILLs it once it waits;
//                   then every member admits: nobody comes, the comm stays.
//   stopped         as killed, but the newcomer is SIGSTOPped: it is taken,
//                   never builds the grown comm, and is dropped by the
//                   others during the admission (its heartbeat stands still).
//   gap             a ticket is taken and never recorded (its newcomer
//                   died in between), then a newcomer joins: the members
//                   skip the dead ticket and admit the live one.
//   member-lost     rank 0 starts a newcomer; rank 2 dies instead of
//                   admitting it: the admission fails with peer_failure on
//                   every member, they recover() to 3 ranks and admit
//                   again; join() took a new ticket meanwhile: 4 ranks.
//   closed          rank 0 starts a newcomer and waits for its ticket; then
//                   it closes the admissions: the waiting newcomer fails
//                   with aborted, and one started afterwards too, taking
//                   no ticket. Prints "CLOSED waiting <status> later
//                   <status> tickets <n>" and each newcomer "NEWCOMER
//                   <code> after <ms> ms".
//   cycles N        N rounds of: a newcomer joins, the grown comm sums, a
//                   planned shrink drops it again; prints the fds and
//                   threads after the first round and after the last.
// Everyone in the grown comm prints "GROWN rank <r> name <n> epoch <e> size
// <s> sum <2^0 + ... + 2^(s-1) as all_reduced> op_timeout_ms <t> busy_poll
// <v> newcomer <0|1>" from the comm's describe().
// GROW_BACKEND picks the backend (default cpu:gloo).
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comms/comms.h"
#include "newcomer.h"


using namespace comms;
using comms::testing::start_newcomer;
using comms::testing::wait_child;
using namespace std::chrono_literals;

namespace {

const char* backend() {
  const char* b = std::getenv("GROW_BACKEND");
  return b ? b : "cpu:gloo";
}

int count_entries(const char* dir) {
  std::this_thread::sleep_for(200ms);  // sockets of the last destroyed comm close
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

// Counts the store calls an admission makes (its keys: the comm's
// "/elastic/admit/" records and the join queue), not the watchers'.
class CountingStore : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> base) : base_(std::move(base)) {
    set_default_timeout(base_->default_timeout());
  }
  void set(const std::string& k, const std::string& v) override {
    count(k, sets);
    base_->set(k, v);
  }
  std::string get(const std::string& k, std::chrono::milliseconds t) override {
    count(k, gets);
    return base_->get(k, t);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds t) override {
    for (const auto& k : keys) count(k, waits);
    base_->wait(keys, t);
  }
  int64_t add(const std::string& k, int64_t d) override {
    count(k, adds);
    return base_->add(k, d);
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) count(k, checks);
    return base_->check(keys);
  }
  bool delete_key(const std::string& k) override {
    count(k, deletes);
    return base_->delete_key(k);
  }
  std::string compare_set(const std::string& k, const std::string& e, const std::string& d) override {
    count(k, cas);
    return base_->compare_set(k, e, d);
  }
  std::string summary() const {
    return "add " + std::to_string(adds) + " get " + std::to_string(gets) + " set " + std::to_string(sets) +
           " cas " + std::to_string(cas) + " check " + std::to_string(checks) + " wait " + std::to_string(waits) +
           " delete " + std::to_string(deletes);
  }
  void reset() { adds = gets = sets = cas = checks = waits = deletes = 0; }

 private:
  static void count(const std::string& k, std::atomic<int>& n) {
    if (k.find("/elastic/admit/") != std::string::npos || k.rfind("comms/elastic/join/", 0) == 0) ++n;
  }
  std::shared_ptr<Store> base_;
  std::atomic<int> adds{0}, gets{0}, sets{0}, cas{0}, checks{0}, waits{0}, deletes{0};
};

std::shared_ptr<Comm> world_comm(std::shared_ptr<Store> store = nullptr) {
  CommOptions options;
  options.elastic = true;
  options.store = std::move(store);
  return new_comm(backend(), Device::cpu(), "world", options);
}

// all_reduce of 2^rank: every rank must see 2^size - 1 exactly.
double power_sum(Comm& comm) {
  std::vector<double> v(512, static_cast<double>(1LL << comm.rank()));
  comm.all_reduce(BufferView::of(v), ReduceOp::sum());
  const double want = static_cast<double>((1LL << comm.size()) - 1);
  for (double x : v) {
    if (x != want) {
      std::fprintf(stderr, "rank %d of %s: sum %g, want %g\n", comm.rank(), comm.name().c_str(), x, want);
      std::exit(4);
    }
  }
  return want;
}

std::string field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": *\"?([^,\"\\n}]*)"))) return "none";
  return m[1].str();
}

void print_grown(Comm& comm, bool newcomer) {
  const double sum = power_sum(comm);
  const std::string d = comm.describe();
  // The comm's own hints (the first "hints" object; the backends' follow).
  std::smatch hints;
  const std::string comm_hints = std::regex_search(d, hints, std::regex(R"("hints": \{([^}]*)\})")) ? hints[1].str() : "";
  std::printf("GROWN rank %d name %s epoch %llu size %d sum %.0f op_timeout_ms %s busy_poll %s newcomer %d\n",
              comm.rank(), comm.name().c_str(), static_cast<unsigned long long>(epoch(comm)), comm.size(), sum,
              field(d, "op_timeout_ms").c_str(), field(comm_hints, "busy_poll").c_str(), newcomer ? 1 : 0);
  std::fflush(stdout);
}

// Ticket `t` of the join queue of "world" is taken and its process recorded
// (the store layout core/comm/grow.cc documents): the newcomer waits.
void await_ticket(Store& store, int t) {
  store.get("comms/elastic/join/world/ticket/" + std::to_string(t), 60s);
}

// The last op the comm's flight recorder saw (dumped to COMMS_TRACE_DIR).
long long ops_entered(Comm& comm) {
  dump_traces();
  const char* dir = std::getenv("COMMS_TRACE_DIR");
  std::ifstream in(std::string(dir ? dir : ".") + "/" + comm.name() + ".rank" + std::to_string(comm.rank()) +
                   ".json");
  std::stringstream text;
  text << in.rdbuf();
  const std::string v = field(text.str(), "last_entered");
  return v == "none" ? -1 : std::stoll(v);
}

int idle() {
  const BootstrapInfo boot = bootstrap_from_environment();
  auto counting = std::make_shared<CountingStore>(default_store(boot.rank, boot.world_size, 20s));
  auto comm = world_comm(counting);
  power_sum(*comm);
  for (int call = 0; call < 3; ++call) {
    // Rank 0 decides first, so the others find its decision at once.
    const long long before = ops_entered(*comm);
    counting->reset();
    std::shared_ptr<Comm> after;
    if (comm->rank() == 0) after = admit(comm);
    comm->barrier();
    if (comm->rank() != 0) after = admit(comm);
    const std::string calls = counting->summary();
    const long long ops = ops_entered(*comm) - 1;  // the barrier's op: count the admit alone
    if (call == 2) {
      std::printf("IDLE rank %d same %d ops %lld -> %lld store %s\n", comm->rank(), after == comm ? 1 : 0, before,
                  ops, calls.c_str());
    }
  }
  std::fflush(stdout);
  power_sum(*comm);
  return 0;
}

// Steps of the members: an all_reduce check, then admit().
int grow(int k) {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  comm->set_timeout(23s);             // set at run time: the newcomer must inherit them
  comm->set_hints({{"busy_poll", "0"}});
  pid_t newcomer = -1;
  for (int step = 0; step < k + 3; ++step) {
    if (step == k && comm->rank() == 0) {
      newcomer = start_newcomer("grow");
      await_ticket(*default_store(boot.rank, boot.world_size, 20s), 0);
    }
    const auto start = std::chrono::steady_clock::now();
    auto next = admit(comm);
    if (next != comm) {
      std::fprintf(stderr, "rank %d: the admission took %lld ms\n", comm->rank(),
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::steady_clock::now() - start)
                                              .count()));
      std::printf("STEP rank %d step %d grew %d -> %d\n", comm->rank(), step, comm->size(), next->size());
      comm = next;
      print_grown(*comm, false);
    }
    power_sum(*comm);
  }
  comm->barrier();
  if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
  std::printf("DONE rank %d size %d\n", comm->rank(), comm->size());
  std::fflush(stdout);
  return 0;
}

int replace(int k) {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  const int victim = comm->size() - 1;
  pid_t replacement = -1;
  for (int step = 0; step < k + 3; ++step) {
    if (step == k && comm->rank() == victim && comm->size() == boot.world_size) kill(getpid(), SIGKILL);
    try {
      power_sum(*comm);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInvalidArgument) throw;
      Recovery r = recover(*comm);
      std::printf("RECOVERED rank %d lost %zu size %d\n", r.comm->rank(), r.agreement.lost.size(), r.comm->size());
      comm = r.comm;
      if (comm->rank() == 0) {
        replacement = start_newcomer("replace");
        await_ticket(*default_store(boot.rank, boot.world_size, 20s), 0);
      }
      auto grown = admit(comm);
      if (grown == comm) return 7;  // the replacement was waiting
      comm = grown;
      print_grown(*comm, false);
    }
  }
  comm->barrier();
  if (replacement > 0 && wait_child(replacement) != 0) return 6;
  std::printf("DONE rank %d size %d\n", comm->rank(), comm->size());
  std::fflush(stdout);
  return 0;
}

int lost_newcomer(bool stop) {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  power_sum(*comm);
  pid_t newcomer = -1;
  if (comm->rank() == 0) {
    newcomer = start_newcomer("lost");
    await_ticket(*default_store(boot.rank, boot.world_size, 20s), 0);
    kill(newcomer, stop ? SIGSTOP : SIGKILL);
    if (!stop) wait_child(newcomer);  // reaped: its process is gone
  }
  comm->barrier();
  const auto start = std::chrono::steady_clock::now();
  auto after = admit(comm);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  const double sum = power_sum(*after);
  std::printf("KEPT rank %d same %d size %d sum %.0f\n", after->rank(), after == comm ? 1 : 0, after->size(), sum);
  std::fprintf(stderr, "rank %d: admit took %lld ms\n", comm->rank(), static_cast<long long>(took.count()));
  std::fflush(stdout);
  if (stop && newcomer > 0) {
    kill(newcomer, SIGKILL);
    wait_child(newcomer);
  }
  return 0;
}

std::string code_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return std::string(to_string(e.code()));
  }
  return "ok";
}

int closed() {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  power_sum(*comm);
  if (comm->rank() == 0) {
    auto store = default_store(boot.rank, boot.world_size, 20s);
    const pid_t waiting = start_newcomer("closed");
    await_ticket(*store, 0);
    close_admissions(*comm);
    const int waiting_status = wait_child(waiting);
    const int later_status = wait_child(start_newcomer("closed"));
    std::printf("CLOSED waiting %d later %d tickets %lld\n", waiting_status, later_status,
                static_cast<long long>(store->add("comms/elastic/join/world/tickets", 0)));
    std::fflush(stdout);
  }
  comm->barrier();
  // Closing changes nothing for the members: nobody is admitted.
  if (admit(comm) != comm) return 11;
  power_sum(*comm);
  return 0;
}

int gap() {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  pid_t newcomer = -1;
  if (comm->rank() == 0) {
    auto store = default_store(boot.rank, boot.world_size, 20s);
    store->add("comms/elastic/join/world/tickets", 1);  // ticket 0, whose process never records itself
    newcomer = start_newcomer("barrier");
    await_ticket(*store, 1);
  }
  auto grown = admit(comm);
  if (grown == comm) return 7;
  print_grown(*grown, false);
  grown->barrier();
  if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
  return 0;
}

int member_lost() {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  power_sum(*comm);
  pid_t newcomer = -1;
  if (comm->rank() == 0) {
    newcomer = start_newcomer("barrier");
    await_ticket(*default_store(boot.rank, boot.world_size, 20s), 0);
  }
  comm->barrier();
  if (comm->rank() == 2) kill(getpid(), SIGKILL);
  std::printf("ADMIT rank %d %s\n", comm->rank(), code_of([&] { admit(comm); }).c_str());
  std::fflush(stdout);
  Recovery r = recover(*comm);
  comm = r.comm;
  if (comm->rank() == 0) await_ticket(*default_store(boot.rank, boot.world_size, 20s), 1);
  auto grown = admit(comm);
  print_grown(*grown, false);
  grown->barrier();
  if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
  return 0;
}

int cycles(int n) {
  auto comm = world_comm();
  const BootstrapInfo boot = bootstrap_from_environment();
  const int world_rank = comm->rank();
  int fds = 0, threads = 0;
  for (int i = 0; i < n; ++i) {
    pid_t newcomer = -1;
    if (comm->rank() == 0) {
      newcomer = start_newcomer("cycle");
      await_ticket(*default_store(boot.rank, boot.world_size, 20s), i);
    }
    auto grown = admit(comm);
    if (grown == comm || grown->size() != boot.world_size + 1) return 8;
    power_sum(*grown);
    const int last[] = {grown->size() - 1};
    comm = shrink(*grown, last);  // the newcomer leaves
    grown.reset();
    power_sum(*comm);
    if (newcomer > 0 && wait_child(newcomer) != 0) return 6;
    if (i == 0) {
      fds = count_entries("/proc/self/fd");
      threads = count_entries("/proc/self/task");
    }
  }
  std::printf("CYCLES rank %d epoch %llu fds %d -> %d threads %d -> %d\n", world_rank,
              static_cast<unsigned long long>(epoch(*comm)), fds, count_entries("/proc/self/fd"), threads,
              count_entries("/proc/self/task"));
  std::fflush(stdout);
  return 0;
}

// A newcomer: joins "world", then does what the members do next.
int newcomer(const std::string& scenario) {
  JoinOptions options;
  options.timeout = 60s;
  if (scenario == "closed") {
    const auto start = std::chrono::steady_clock::now();
    const std::string code = code_of([&] { join("world", options); });
    std::printf("NEWCOMER %s after %lld ms\n", code.c_str(),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count()));
    std::fflush(stdout);
    return code == "aborted" ? 0 : 12;
  }
  auto comm = join("world", options);
  print_grown(*comm, true);
  // What the members do after the step that grew: finish it, two more.
  if (scenario == "grow") {
    power_sum(*comm);
    for (int step = 0; step < 2; ++step) {
      if (admit(comm) != comm) return 9;
      power_sum(*comm);
    }
    comm->barrier();
  } else if (scenario == "replace") {
    for (int step = 0; step < 2; ++step) power_sum(*comm);
    comm->barrier();
  } else if (scenario == "barrier") {
    comm->barrier();
  } else if (scenario == "cycle") {
    const int last[] = {comm->size() - 1};
    if (shrink(*comm, last)) return 10;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGTERM, SIG_IGN);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int arg = argc > 2 ? std::atoi(argv[2]) : 0;
  try {
    if (mode == "idle") return idle();
    if (mode == "grow") return grow(arg);
    if (mode == "replace") return replace(arg);
    if (mode == "killed") return lost_newcomer(false);
    if (mode == "stopped") return lost_newcomer(true);
    if (mode == "cycles") return cycles(arg);
    if (mode == "member-lost") return member_lost();
    if (mode == "gap") return gap();
    if (mode == "closed") return closed();
    if (mode == "newcomer") return newcomer(argc > 2 ? argv[2] : "");
  } catch (const Error& e) {
    std::fprintf(stderr, "grow_helper %s: %s: %s\n", mode.c_str(), std::string(to_string(e.code())).c_str(),
                 e.what());
    return 3;
  }
  std::fprintf(stderr, "grow_helper: unknown mode '%s'\n", mode.c_str());
  return 2;
}
