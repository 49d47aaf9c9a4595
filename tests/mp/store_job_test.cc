// The store that commsrun hosts, as a real job meets it: hostile clients by
// the hundred, clients without the job's token, a rank with the wrong token,
// and a rank that never comes to init. Each job is the example trainer (a
// few steps) and must end as a clean run does, or fail saying why.
//
// Hostile clients here are plain sockets that speak no protocol: what anyone
// who can reach the port can do.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "subprocess.h"

namespace {

using comms::testing::Process;
using comms::testing::run;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kSteps = 20;

double final_loss(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex(R"(final_loss=([-0-9.eE+na]+))"))) return NAN;
  return std::stod(m[1]);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

int free_port() { return comms::testing::free_loopback_port(); }

// A connected socket to 127.0.0.1:port, or -1.
int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Reads up to `n` bytes, waiting at most `limit` for each; stops at end of stream.
std::string read_up_to(int fd, size_t n, std::chrono::milliseconds limit) {
  std::string out;
  while (out.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) break;
    char buffer[4096];
    ssize_t got = ::recv(fd, buffer, std::min(sizeof buffer, n - out.size()), 0);
    if (got <= 0) break;
    out.append(buffer, static_cast<size_t>(got));
  }
  return out;
}

std::string u32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}
std::string u64(uint64_t v) { return u32(static_cast<uint32_t>(v)) + u32(static_cast<uint32_t>(v >> 32)); }
std::string str(const std::string& s) { return u32(static_cast<uint32_t>(s.size())) + s; }
std::string frame(const std::string& body) { return u32(static_cast<uint32_t>(body.size())) + body; }

// A get (opcode 2) that would wait a day.
std::string parked_get() { return frame(std::string(1, '\x02') + u64(24ull * 3600 * 1000) + str("never/set")); }

// Resident-memory high-water mark of a process, in MiB.
long vm_hwm_mib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6) / 1024;
  }
  return -1;
}

// A trainer job whose ranks wait for a file before they start, so that a
// test can do things to its store first.
class GatedJob {
 public:
  GatedJob(int ranks, const std::string& launcher_prefix, std::map<std::string, std::string> env = {})
      : port_(free_port()),
        gate_((std::filesystem::temp_directory_path() / ("comms_store_gate." + std::to_string(::getpid()) + "." +
                                                         std::to_string(port_)))
                  .string()) {
    std::filesystem::remove(gate_);
    const std::string rank_program = "while [ ! -e " + gate_ + " ]; do sleep 0.05; done; exec " TRAINER
                                     " --steps " + std::to_string(kSteps);
    const std::string launch = launcher_prefix + "exec " COMMSRUN " -n " + std::to_string(ranks) + " --master-port " +
                               std::to_string(port_) + " -- bash -c '" + rank_program + "'";
    env.emplace("COMMS_BACKEND", "cpu:gloo");
    process_ = Process::start({"/bin/bash", "-c", launch}, env);
    // Up when its port accepts.
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline) {
      int fd = connect_to(port_);
      if (fd >= 0) {
        ::close(fd);
        up_ = true;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  ~GatedJob() {
    if (process_.status == -1) process_.wait(1s);
    std::filesystem::remove(gate_);
  }

  bool up() const { return up_; }
  int port() const { return port_; }
  pid_t launcher_pid() const { return process_.pid; }  // bash execs commsrun
  void open_gate() { std::ofstream(gate_) << "go\n"; }
  Process& process() { return process_; }
  Process& finish(std::chrono::seconds limit) {
    process_.wait(limit);
    return process_;
  }

 private:
  int port_;
  std::string gate_;
  Process process_;
  bool up_ = false;
};

double clean_loss() {
  static double loss = [] {
    auto p = run({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", std::to_string(kSteps)},
                 {{"COMMS_BACKEND", "cpu:gloo"}}, 60s);
    EXPECT_EQ(p.exit_code(), 0) << p.output;
    return final_loss(p.output);
  }();
  return loss;
}

TEST(StoreUnderAttack, AJobEndsWithTheCleanLossWhileHundredsOfHostileClientsHoldItsStore) {
  const double clean = clean_loss();
  ASSERT_FALSE(std::isnan(clean));
  // 256 descriptors for the launcher (and its store): the hostile clients
  // below would hold more than that if the store let them.
  GatedJob job(2, "ulimit -n 256 && ", {{"COMMS_INIT_TIMEOUT", "20s"}});
  ASSERT_TRUE(job.up());
  std::vector<int> held;
  // Headers announcing 64 MiB bodies (and one byte of it), kept open.
  for (int i = 0; i < 40; ++i) {
    int fd = connect_to(job.port());
    if (fd >= 0 && send_all(fd, u32(64u << 20) + "x")) held.push_back(fd);
  }
  // Gets that would wait a day, from clients that then go away.
  for (int i = 0; i < 300; ++i) {
    int fd = connect_to(job.port());
    if (fd >= 0) send_all(fd, parked_get());
    if (fd >= 0) ::close(fd);
  }
  // Half-sent frames, kept open.
  for (int i = 0; i < 300; ++i) {
    int fd = connect_to(job.port());
    if (fd >= 0 && send_all(fd, u32(100).substr(0, 3))) held.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);  // let the store read what it was sent
  const long attacked_mib = vm_hwm_mib(job.launcher_pid());
  job.open_gate();
  // VmHWM only grows: its last reading before the launcher exits is its peak.
  long final_mib = attacked_mib;
  job.process().read_until(
      [&](const std::string&) {
        final_mib = std::max(final_mib, vm_hwm_mib(job.launcher_pid()));
        return false;
      },
      90s);
  Process& p = job.finish(30s);
  for (int fd : held) ::close(fd);
  std::printf("store process VmHWM: %ld MiB after the attack, %ld MiB at the end; final_loss %.9g (clean %.9g)\n",
              attacked_mib, final_mib, final_loss(p.output), clean);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_EQ(final_loss(p.output), clean) << p.output;
  EXPECT_GT(attacked_mib, 0);
  EXPECT_LT(attacked_mib, 100) << "the store's process grew to " << attacked_mib << " MiB under attack";
  EXPECT_LT(final_mib, 100) << "the store's process peaked at " << final_mib << " MiB";
}

// A client that does not hold the job's token is
// refused, is told why, and the job goes on.
TEST(StoreAuth, AClientWithoutTheTokenIsRefusedAndTheJobStillEndsWithTheCleanLoss) {
  const double clean = clean_loss();
  GatedJob job(2, "");
  ASSERT_TRUE(job.up());

  int fd = connect_to(job.port());
  ASSERT_GE(fd, 0);
  // The hello: length, magic, flags (1: a token is required), a nonce.
  std::string hello = read_up_to(fd, 4 + 4 + 13 + 1 + 4 + 32, 3s);
  ASSERT_EQ(hello.size(), 58u) << "no hello from the store";
  EXPECT_EQ(hello.substr(8, 13), "comms-store/1");
  EXPECT_EQ(hello[21], '\x01') << "the store does not ask for a token";
  // Answer without a proof.
  ASSERT_TRUE(send_all(fd, frame(str("comms-store/1") + str(std::string(32, 'n')) + str(""))));
  std::string refusal = read_up_to(fd, 4096, 3s);
  ASSERT_GT(refusal.size(), 5u);
  EXPECT_EQ(refusal[4], '\x02') << "not an error status";
  EXPECT_TRUE(contains(refusal, "authentication failed")) << refusal;
  EXPECT_EQ(read_up_to(fd, 1, 2s), "") << "the connection stayed open after the refusal";
  ::close(fd);

  // A request sent straight away is not served either.
  fd = connect_to(job.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, frame(std::string(1, '\x01') + str("comms/world/evil") + str("x"))));
  std::string answer = read_up_to(fd, 4096, 3s);
  EXPECT_FALSE(contains(answer, std::string("\x00", 1) + u32(0) + u64(0))) << "the set was acknowledged";
  ::close(fd);

  job.open_gate();
  Process& p = job.finish(60s);
  EXPECT_EQ(p.exit_code(), 0) << p.output;
  EXPECT_EQ(final_loss(p.output), clean) << p.output;
  EXPECT_TRUE(std::regex_search(p.output, std::regex(R"(refused 127\.0\.0\.1:\d+: authentication failed)")))
      << "the store did not log whom it refused\n" << p.output;
}

TEST(StoreAuth, ARankWithTheWrongTokenFailsAtInitNamingTheStoreAndTheReason) {
  auto p = run({COMMSRUN, "-n", "2", "--", "/bin/bash", "-c",
                "if [ $RANK = 1 ]; then export COMMS_STORE_TOKEN=not-the-jobs-token; fi; exec " TRAINER
                " --steps 5"},
               {{"COMMS_BACKEND", "cpu:gloo"}, {"COMMS_INIT_TIMEOUT", "20s"}}, 60s);
  EXPECT_NE(p.exit_code(), 0) << p.output;
  EXPECT_LT(p.elapsed_s(), 15) << "the refused rank waited for a timeout";
  EXPECT_TRUE(std::regex_search(
      p.output, std::regex(R"(\[1\] trainer: the TCP store at 127\.0\.0\.1:\d+ refused this client: )"
                           R"(authentication failed \(COMMS_STORE_TOKEN differs\))")))
      << p.output;
}

TEST(StoreRendezvous, AnInitTimeoutNamesTheRankThatNeverArrived) {
  auto p = run({COMMSRUN, "-n", "3", "--grace", "1", "--", "/bin/bash", "-c",
                "if [ $RANK = 2 ]; then sleep 20; fi; exec " TRAINER " --steps 2"},
               {{"COMMS_BACKEND", "cpu:gloo"}, {"COMMS_INIT_TIMEOUT", "2s"}}, 40s);
  EXPECT_NE(p.exit_code(), 0) << p.output;
  for (int rank : {0, 1}) {
    EXPECT_TRUE(std::regex_search(p.output, std::regex("\\[" + std::to_string(rank) +
                                                       "\\] trainer: .*timed out: rank 2 of 3 never arrived at "
                                                       "this init; the wait that expired: ")))
        << "rank " << rank << "\n" << p.output;
  }
}

// A rank that runs a program must not hand it the store's connection or its
// peers' (Gloo's) connections: a child holding them would hide the rank's
// death from its peers. Checked from outside on running ranks.
TEST(RankSockets, EverySocketOfARunningRankIsCloseOnExec) {
  Process p = Process::start({COMMSRUN, "-n", "2", "--", TRAINER, "--steps", "100000000", "--print-every", "100"},
                             {{"COMMS_BACKEND", "cpu:gloo"}});
  ASSERT_TRUE(p.read_until([](const std::string& o) { return contains(o, "step 100 "); }, 60s)) << p.output;
  const auto ranks = comms::testing::children_of(p.pid);
  ASSERT_EQ(ranks.size(), 2u) << p.output;
  for (pid_t pid : std::vector<pid_t>{p.pid, ranks[0], ranks[1]}) {
    int sockets = 0;
    const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
    for (const auto& entry : std::filesystem::directory_iterator(fd_dir)) {
      std::error_code ec;
      if (std::filesystem::read_symlink(entry.path(), ec).string().rfind("socket:", 0) != 0) continue;
      ++sockets;
      std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + entry.path().filename().string());
      std::string line;
      long flags = -1;
      while (std::getline(info, line)) {
        if (line.rfind("flags:", 0) == 0) flags = std::strtol(line.c_str() + 6, nullptr, 8);
      }
      EXPECT_TRUE(flags >= 0 && (flags & O_CLOEXEC)) << "pid " << pid << " socket fd " << entry.path().filename()
                                                      << " is inherited across exec (flags " << std::oct << flags
                                                      << ")";
    }
    EXPECT_GE(sockets, pid == p.pid ? 2 : 3) << "pid " << pid;
  }
  ::kill(p.pid, SIGTERM);
  p.wait(30s);
}

}  // namespace
