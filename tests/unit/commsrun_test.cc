// Runs the built commsrun binary (COMMSRUN_PATH) on small shell programs and
// checks what the ranks saw, what commsrun printed and how it exited. Every
// run is bounded: the helper kills commsrun if it outlives its limit.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "subprocess.h"
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "util/strutil.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct RunResult {
  int exit_code = -1;  // 128 + signal when commsrun itself was killed
  std::string out;
  std::string err;
  double seconds = 0;
  bool hit_limit = false;
};

// Sends `signal` to commsrun once `count` stdout lines contain `marker`.
struct SignalWhen {
  std::string marker;
  int count = 1;
  int signal = SIGTERM;
};

extern "C" char** environ;

// `env` entries are added to (or replace) this process's environment; an
// empty value removes the variable.
RunResult run_commsrun(const std::vector<std::string>& args, std::chrono::seconds limit = 20s,
                       std::optional<SignalWhen> signal_when = std::nullopt,
                       const std::map<std::string, std::string>& env = {}) {
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(::pipe2(out_pipe, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err_pipe, O_CLOEXEC), 0);
  std::vector<std::string> argv_strings = {COMMSRUN_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  // Built before fork: other threads may hold the allocator's lock.
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry; ++entry) {
    std::string text(*entry);
    if (!env.contains(text.substr(0, text.find('=')))) env_strings.push_back(text);
  }
  for (const auto& [name, value] : env) {
    if (!value.empty()) env_strings.push_back(name + "=" + value);
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execve(COMMSRUN_PATH, argv.data(), envp.data());
    ::_exit(126);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  RunResult result;
  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* sinks[2] = {&result.out, &result.err};
  bool signalled = false;
  auto deadline = start + limit;
  while (fds[0] >= 0 || fds[1] >= 0) {
    pollfd polled[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      result.hit_limit = true;
      ::kill(pid, SIGKILL);
      break;
    }
    if (::poll(polled, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      ssize_t n = ::read(fds[i], buffer, sizeof(buffer));
      if (n <= 0) {
        ::close(fds[i]);
        fds[i] = -1;
      } else {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      }
    }
    if (signal_when && !signalled) {
      int seen = 0;
      for (size_t at = 0; (at = result.out.find(signal_when->marker, at)) != std::string::npos; ++at) ++seen;
      if (seen >= signal_when->count) {
        ::kill(pid, signal_when->signal);
        signalled = true;
      }
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  for (auto part : comms::str::split(text, '\n')) if (!part.empty()) lines.emplace_back(part);
  return lines;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string describe(const RunResult& r) {
  return comms::str::cat("exit ", r.exit_code, " after ", r.seconds, " s\n--- stdout:\n", r.out, "--- stderr:\n", r.err);
}

// A TCP port that was free a moment ago.
int free_port() { return comms::testing::free_loopback_port(); }

// The store goes by COMMS_STORE; MASTER_ADDR/MASTER_PORT are the program's
// (torch's TCPStore binds them: store_probe's rank 0 checks it can).
TEST(Commsrun, RanksReceiveTheTorchrunVariablesAndTheStoreInItsOwnVariable) {
  auto r = run_commsrun({"-n", "3", "--master-port", "0", "--", "sh", "-c",
                         "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                         "$COMMS_STORE launcher_store=$COMMS_LAUNCHER_STORE"},
                        20s, std::nullopt, {{"COMMS_LAUNCHER_STORE", ""}, {"COMMS_STORE", "file:///not/ours"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << describe(r);
  std::set<std::string> master_ports, store_ports;
  std::set<int> ranks;
  std::regex pattern(R"(\[(\d)\] (\d) 3 (\d) 3 127\.0\.0\.1 (\d+) tcp://127\.0\.0\.1:(\d+) launcher_store=)");
  for (const auto& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, pattern)) << line;
    EXPECT_EQ(m[1], m[2]) << "prefix and RANK differ: " << line;
    EXPECT_EQ(m[2], m[3]) << "RANK and LOCAL_RANK differ on one node: " << line;
    ranks.insert(std::stoi(m[1]));
    master_ports.insert(m[4]);
    store_ports.insert(m[5]);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  ASSERT_EQ(master_ports.size(), 1u) << "ranks saw different MASTER_PORTs";
  ASSERT_EQ(store_ports.size(), 1u) << "ranks saw different stores";
  EXPECT_GT(std::stoi(*master_ports.begin()), 0);
  EXPECT_GT(std::stoi(*store_ports.begin()), 0);
  EXPECT_NE(*master_ports.begin(), *store_ports.begin()) << "MASTER_PORT is commsrun's store";
}

TEST(Commsrun, ASecondNodeNumbersItsRanksAfterTheFirst) {
  std::string port = std::to_string(free_port());
  auto node0 = std::async(std::launch::async, [&] {
    return run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "-n", "2", "--", "sh", "-c",
                         "echo $MASTER_PORT $COMMS_STORE"});
  });
  auto r = run_commsrun({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "-n", "2", "--", "sh",
                         "-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_PORT $COMMS_STORE"});
  auto r0 = node0.get();
  ASSERT_EQ(r0.exit_code, 0) << describe(r0);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // Node 0 picked MASTER_PORT; node 1's ranks got the same one from its store.
  std::smatch picked;
  ASSERT_TRUE(std::regex_search(r0.out, picked, std::regex(R"(\[0\] (\d+) tcp://127\.0\.0\.1:)" + port)))
      << describe(r0);
  const std::string master_port = picked[1];
  EXPECT_NE(master_port, port);
  EXPECT_TRUE(contains(r0.out, "[1] " + master_port + " tcp://127.0.0.1:" + port)) << describe(r0);
  // Without a token the only thing said is that the store is open.
  EXPECT_EQ(r.err, "commsrun: warning: no COMMS_STORE_TOKEN: the store at 127.0.0.1:" + port +
                       " serves anyone who can reach it; set the same COMMS_STORE_TOKEN (or COMMS_STORE_TOKEN_FILE) "
                       "on every node\n");
  auto lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());
  const std::string tail = master_port + " tcp://127.0.0.1:" + port;
  EXPECT_EQ(lines, (std::vector<std::string>{"[2] 2 4 0 2 " + tail, "[3] 3 4 1 2 " + tail})) << describe(r);
}

TEST(Commsrun, EveryOutputLineCarriesItsRankAndPartialLastLinesAreKept) {
  auto r = run_commsrun({"-n", "2", "--", "sh", "-c", "printf 'one\\ntwo\\npartial'; printf 'oops\\n' >&2"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // Ranks interleave with each other, but each rank's lines stay in order.
  for (int rank : {0, 1}) {
    std::string p = comms::str::cat("[", rank, "] ");
    std::vector<std::string> own;
    for (const auto& line : lines_of(r.out)) {
      if (line.rfind(p, 0) == 0) own.push_back(line);
    }
    EXPECT_EQ(own, (std::vector<std::string>{p + "one", p + "two", p + "partial"})) << describe(r);
    EXPECT_TRUE(contains(r.err, p + "oops\n")) << describe(r);
  }
  EXPECT_EQ(lines_of(r.out).size(), 6u) << describe(r);
  EXPECT_FALSE(contains(r.out, "oops")) << "stderr leaked into stdout";
}

TEST(Commsrun, LongLinesFromManyRanksNeverInterleave) {
  // 4 ranks, 200 lines of 2000 bytes each, all at once.
  auto r = run_commsrun({"-n", "4", "--", "sh", "-c",
                         "awk -v r=$RANK 'BEGIN { s = sprintf(\"%2000s\", \"\"); gsub(/ /, \"x\", s); "
                         "for (i = 0; i < 200; i++) print r \"-\" s }'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 800u);
  std::map<int, int> per_rank;
  const std::string body(2000, 'x');
  for (const auto& line : lines) {
    ASSERT_EQ(line.size(), 6 + body.size()) << line.substr(0, 80);
    int rank = line[1] - '0';
    EXPECT_EQ(line, comms::str::cat("[", rank, "] ", rank, "-", body)) << line.substr(0, 80);
    ++per_rank[rank];
  }
  EXPECT_EQ(per_rank, (std::map<int, int>{{0, 200}, {1, 200}, {2, 200}, {3, 200}}));
}

TEST(Commsrun, ArgumentsAfterTheSeparatorBelongToTheProgram) {
  auto r = run_commsrun({"-n", "1", "--", "sh", "-c", "echo \"$1 $2 $3\"", "sh", "-n", "7", "--"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "[0] -n 7 --\n") << describe(r);
}

TEST(Commsrun, AProgramWithoutOptionsNeedsNoSeparator) {
  auto r = run_commsrun({"-n", "2", "echo", "hello"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] hello", "[1] hello"})) << describe(r);
}

TEST(Commsrun, AllRanksSucceedingExitsZeroQuietly) {
  auto r = run_commsrun({"-n", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST(Commsrun, AFailingRankStopsTheOthersAndItsStatusBecomesTheExitCode) {
  auto r = run_commsrun({"-n", "3", "--", "sh", "-c", "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 60"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(commsrun: rank 1 \(pid \d+\) exited with status 3)")))
      << describe(r);
  EXPECT_LT(r.seconds, 10) << "the sleeping ranks were not stopped";
  EXPECT_FALSE(r.hit_limit);
}

TEST(Commsrun, KeepGoingLetsTheOthersFinishAndTheFirstFailureIsTheExitCode) {
  // Rank 1 fails first; rank 2 fails later and rank 0 succeeds, both
  // unstopped. The exit code stays the first failure's.
  auto r = run_commsrun({"-n", "3", "--keep-going", "--", "sh", "-c",
                         "case $RANK in 1) exit 3;; 2) sleep 1; exit 4;; *) sleep 2; echo finished;; esac"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(commsrun: rank 1 \(pid \d+\) exited with status 3\n)")))
      << describe(r);
  EXPECT_TRUE(contains(r.err, "--keep-going: leaving the other 2 ranks running")) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 2 \(pid \d+\) exited with status 4 \(after the first failure\))")))
      << describe(r);
  EXPECT_TRUE(contains(r.out, "[0] finished")) << describe(r);
  EXPECT_FALSE(contains(r.err, "SIGTERM")) << describe(r);
  EXPECT_FALSE(r.hit_limit);
}

TEST(Commsrun, KeepGoingExitsZeroNamingTheLostRanksWhenTheSurvivorsFinished) {
  // Ranks 1 and 3 are lost to signals; 0 and 2 finish: the job recovered.
  auto r = run_commsrun({"-n", "4", "--keep-going", "--", "sh", "-c",
                         "case $RANK in 1|3) kill -9 $$;; *) sleep 1; echo finished;; esac"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "--keep-going: the survivors finished; lost ranks [1,3]")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[0] finished")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[2] finished")) << describe(r);
  // Without --keep-going the same job fails with the lost rank's signal.
  auto stopped = run_commsrun({"-n", "4", "--", "sh", "-c",
                               "case $RANK in 1|3) kill -9 $$;; *) sleep 1; echo finished;; esac"});
  EXPECT_EQ(stopped.exit_code, 137) << describe(stopped);
}

// The script of a job under --replace: a replacement says what it got and
// exits 0; the original ranks in `lost` kill themselves, the others finish.
std::string replace_script(const std::string& lost) {
  return "if [ -n \"$COMMS_REPLACEMENT\" ]; then echo \"joining as +$COMMS_REPLACEMENT rank=${RANK:-none} "
         "local=$LOCAL_RANK world=$WORLD_SIZE elastic=$COMMS_ELASTIC\"; exit 0; fi; "
         "case $RANK in " + lost + ") kill -9 $$;; *) sleep 1; echo finished;; esac";
}

TEST(Commsrun, ReplaceStartsAProcessInThePlaceOfARankLostToASignal) {
  auto r = run_commsrun({"-n", "3", "--keep-going", "--replace", "--", "sh", "-c", replace_script("1")});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  // No RANK (it has none until admitted), the lost rank's slot, the job's size.
  EXPECT_TRUE(contains(r.out, "[+1] joining as +1 rank=none local=1 world=3 elastic=1\n")) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(--replace: started replacement \+1 \(pid \d+\) in place of rank 1\n)")))
      << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(--replace: 1 replacement: \+1 \(pid \d+, in place of rank 1\)\n)")))
      << describe(r);
  EXPECT_TRUE(contains(r.out, "[0] finished")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[2] finished")) << describe(r);
  EXPECT_FALSE(contains(r.out, "[1] finished")) << describe(r);
}

TEST(Commsrun, ReplaceNamesEveryReplacementAndStopsAtMaxReplacements) {
  auto r = run_commsrun({"-n", "4", "--keep-going", "--replace", "--", "sh", "-c", replace_script("1|3")});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "--keep-going: the survivors finished; lost ranks [1,3]\n")) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(--replace: 2 replacements: \+1 \(pid \d+, in place of rank [13]\), \+2 \(pid \d+, in place of rank [13]\))")))
      << describe(r);
  EXPECT_TRUE(contains(r.err, "in place of rank 1")) << describe(r);
  EXPECT_TRUE(contains(r.err, "in place of rank 3")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[+1] joining as +1 rank=none")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[+2] joining as +2 rank=none")) << describe(r);

  auto bounded = run_commsrun(
      {"-n", "4", "--keep-going", "--replace", "--max-replacements", "1", "--", "sh", "-c", replace_script("1|3")});
  EXPECT_EQ(bounded.exit_code, 0) << describe(bounded);
  EXPECT_TRUE(contains(bounded.out, "[+1] joining as +1")) << describe(bounded);
  EXPECT_FALSE(contains(bounded.out, "[+2]")) << describe(bounded);
  EXPECT_TRUE(std::regex_search(bounded.err, std::regex(R"(--replace: no replacement for rank [13]: --max-replacements 1 reached\n)")))
      << describe(bounded);
  EXPECT_TRUE(contains(bounded.err, "--replace: 1 replacement: +1")) << describe(bounded);
}

TEST(Commsrun, AReplacementLostToASignalIsReplacedAndOneThatFailsFailsTheJob) {
  // +1 kills itself too; +2 joins.
  auto r = run_commsrun({"-n", "2", "--keep-going", "--replace", "--", "sh", "-c",
                         "case \"${COMMS_REPLACEMENT:-r$RANK}\" in r1|1) kill -9 $$;; 2) echo joined;; *) sleep 1; echo finished;; esac"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(replacement \+1 \(pid \d+\) was killed by signal 9 \(SIGKILL\))")))
      << describe(r);
  EXPECT_TRUE(contains(r.err, "lost ranks [1] and replacements [+1]")) << describe(r);
  EXPECT_TRUE(contains(r.err, "in place of rank 1), +2 (pid")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[+2] joined")) << describe(r);

  // A replacement that exits with an error is a failure, not a loss.
  auto failed = run_commsrun({"-n", "2", "--keep-going", "--replace", "--", "sh", "-c",
                              "if [ -n \"$COMMS_REPLACEMENT\" ]; then exit 5; fi; "
                              "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 1"});
  EXPECT_NE(failed.exit_code, 0) << describe(failed);
  EXPECT_TRUE(std::regex_search(failed.err, std::regex(R"(replacement \+1 \(pid \d+\) exited with status 5)")))
      << describe(failed);
  EXPECT_FALSE(contains(failed.err, "the survivors finished")) << describe(failed);
}

TEST(Commsrun, ReplaceNeedsKeepGoingAndMaxReplacementsNeedsReplace) {
  auto r = run_commsrun({"-n", "2", "--replace", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--replace needs --keep-going")) << describe(r);
  auto m = run_commsrun({"-n", "2", "--keep-going", "--max-replacements", "2", "--", "true"});
  EXPECT_EQ(m.exit_code, 2) << describe(m);
  EXPECT_TRUE(contains(m.err, "--max-replacements needs --replace")) << describe(m);
}

TEST(Commsrun, ARankKilledBySignalGives128PlusTheSignal) {
  auto r = run_commsrun({"-n", "3", "--", "sh", "-c", "if [ $RANK = 2 ]; then kill -9 $$; fi; exec sleep 60"});
  EXPECT_EQ(r.exit_code, 137) << describe(r);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(commsrun: rank 2 \(pid \d+\) was killed by signal 9 \(SIGKILL\))")))
      << describe(r);
  EXPECT_LT(r.seconds, 10) << describe(r);
}

TEST(Commsrun, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  auto r = run_commsrun({"-n", "2", "--grace", "0.5", "--", "sh", "-c",
                         "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.2; exit 5; fi; sleep 60"});
  EXPECT_EQ(r.exit_code, 5) << describe(r);
  EXPECT_TRUE(contains(r.err, "sending SIGKILL")) << describe(r);
  EXPECT_LT(r.seconds, 6) << describe(r);
}

TEST(Commsrun, TheTimeoutStopsEveryRankAndExits124) {
  auto r = run_commsrun({"-n", "2", "--timeout", "1", "--", "sleep", "60"});
  EXPECT_EQ(r.exit_code, 124) << describe(r);
  EXPECT_TRUE(contains(r.err, "commsrun: timeout after 1 s; stopping 2 ranks")) << describe(r);
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 6);
}

TEST(Commsrun, SigtermIsForwardedToTheRanks) {
  auto r = run_commsrun({"-n", "2", "--", "sh", "-c",
                         "trap 'echo got TERM; exit 0' TERM; echo ready; sleep 60 & wait"},
                        20s, SignalWhen{"ready", 2, SIGTERM});
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_TRUE(contains(r.out, "[0] got TERM")) << describe(r);
  EXPECT_TRUE(contains(r.out, "[1] got TERM")) << describe(r);
  EXPECT_TRUE(contains(r.err, "received SIGTERM; forwarding it to 2 ranks")) << describe(r);
  EXPECT_LT(r.seconds, 10);
}

TEST(Commsrun, RanksCanUseTheStoreTheLauncherHosts) {
  auto r = run_commsrun({"-n", "3", "--", STORE_PROBE_PATH});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << describe(r);
  std::set<std::string> joined;
  for (int rank = 0; rank < 3; ++rank) {
    std::regex pattern(comms::str::cat(R"(\[)", rank, R"(\] probe ok rank=)", rank,
                                    R"( sum=30 joined_at=(\d) local_address=127\.0\.0\.1)"));
    bool found = false;
    for (const auto& line : lines) {
      std::smatch m;
      if (std::regex_match(line, m, pattern)) {
        found = true;
        joined.insert(m[1]);
      }
    }
    EXPECT_TRUE(found) << "rank " << rank << "\n" << describe(r);
  }
  EXPECT_EQ(joined, (std::set<std::string>{"1", "2", "3"})) << "add() did not count each rank once";
}

TEST(Commsrun, TwoNodesRendezvousThroughTheStoreOnNodeZero) {
  std::string port = std::to_string(free_port());
  auto node1 = std::async(std::launch::async, [&] {
    return run_commsrun({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "-n", "2", "--",
                         STORE_PROBE_PATH});
  });
  std::this_thread::sleep_for(200ms);  // node 1's ranks start first and must retry
  auto node0 = run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "-n", "2", "--",
                             STORE_PROBE_PATH});
  auto r1 = node1.get();
  ASSERT_EQ(node0.exit_code, 0) << describe(node0);
  ASSERT_EQ(r1.exit_code, 0) << describe(r1);
  // Ranks 0..3 stored 0, 10, 20, 30: every rank saw all four.
  std::string both = node0.out + r1.out;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(contains(both, comms::str::cat("[", rank, "] probe ok rank=", rank, " sum=60 "))) << both;
  }
}

TEST(Commsrun, ASingleNodeJobGetsARandomStoreTokenThatItsRanksHoldAndOthersDoNot) {
  auto r = run_commsrun({"-n", "2", "--", "sh", "-c", "echo token=$COMMS_STORE_TOKEN; exec " STORE_PROBE_PATH});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::set<std::string> tokens;
  std::regex pattern(R"(\[\d\] token=([0-9a-f]*))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), pattern), end; it != end; ++it) tokens.insert((*it)[1]);
  ASSERT_EQ(tokens.size(), 1u) << describe(r);
  EXPECT_EQ(tokens.begin()->size(), 64u) << "not 32 random bytes in hex";
  EXPECT_TRUE(contains(r.out, "[0] probe ok") && contains(r.out, "[1] probe ok")) << describe(r);
  auto again = run_commsrun({"-n", "1", "--", "sh", "-c", "echo token=$COMMS_STORE_TOKEN"});
  EXPECT_FALSE(contains(again.out, *tokens.begin())) << "two jobs got the same token";

  // A rank process that drops the token is refused by its own job's store.
  auto refused = run_commsrun({"-n", "1", "--", "env", "-u", "COMMS_STORE_TOKEN", STORE_PROBE_PATH});
  EXPECT_NE(refused.exit_code, 0) << describe(refused);
  EXPECT_TRUE(std::regex_search(refused.err, std::regex(R"(\[0\] probe failed: the TCP store at 127\.0\.0\.1:\d+ )"
                                                        R"(refused this client: authentication failed \(this client )"
                                                        R"(has no token)")))
      << describe(refused);
}

TEST(Commsrun, TwoNodesSharingATokenRendezvousAndSayNothingAboutAnOpenStore) {
  std::string port = std::to_string(free_port());
  const std::map<std::string, std::string> env = {{"COMMS_STORE_TOKEN", "shared-by-both-nodes"}};
  auto node1 = std::async(std::launch::async, [&] {
    return run_commsrun({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "-n", "1", "--", STORE_PROBE_PATH},
                        20s, std::nullopt, env);
  });
  auto node0 = run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "-n", "1", "--",
                             STORE_PROBE_PATH}, 20s, std::nullopt, env);
  auto r1 = node1.get();
  ASSERT_EQ(node0.exit_code, 0) << describe(node0);
  ASSERT_EQ(r1.exit_code, 0) << describe(r1);
  EXPECT_FALSE(contains(node0.err + r1.err, "COMMS_STORE_TOKEN")) << node0.err << r1.err;
  EXPECT_FALSE(contains(node0.err + r1.err, "refused")) << node0.err << r1.err;
  EXPECT_TRUE(contains(node0.out + r1.out, "[1] probe ok rank=1 sum=10")) << node0.out << r1.out;

  // A node with another token cannot join: its rank fails naming the reason.
  port = std::to_string(free_port());
  auto intruder = std::async(std::launch::async, [&] {
    return run_commsrun({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "-n", "1", "--", STORE_PROBE_PATH},
                        20s, std::nullopt, {{"COMMS_STORE_TOKEN", "some-other-token"}});
  });
  auto owner = run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "--exit-barrier-timeout",
                             "1", "-n", "1", "--", "sleep", "2"}, 20s, std::nullopt, env);
  auto ri = intruder.get();
  EXPECT_NE(ri.exit_code, 0) << describe(ri);
  EXPECT_TRUE(contains(ri.err, "refused this client: authentication failed (COMMS_STORE_TOKEN differs)"))
      << describe(ri);
  EXPECT_TRUE(contains(owner.err, "authentication failed (COMMS_STORE_TOKEN differs)")) << describe(owner);
}

TEST(Commsrun, TheStorePortIsFreeForTheNextJobWhenARankLeavesAProcessBehind) {
  const std::string port = std::to_string(free_port());
  // The leftover inherits whatever descriptors the rank did (its output goes
  // elsewhere, so that commsrun does not wait for it).
  auto first = run_commsrun({"-n", "1", "--master-port", port, "--", "sh", "-c",
                             "setsid sleep 30 >/dev/null 2>&1 </dev/null & echo leftover=$!"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(first.out, m, std::regex(R"(leftover=(\d+))"))) << describe(first);
  const pid_t leftover = std::stoi(m[1]);
  auto second = run_commsrun({"-n", "1", "--master-port", port, "--", "true"});
  ::kill(leftover, SIGKILL);
  EXPECT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_EQ(second.exit_code, 0) << "the leftover process holds the store's port\n" << describe(second);
  EXPECT_FALSE(contains(second.err, "Address already in use")) << describe(second);
}

TEST(Commsrun, NodeZeroReportsAFailureOnAnotherNode) {
  std::string port = std::to_string(free_port());
  auto node1 = std::async(std::launch::async, [&] {
    return run_commsrun({"--nnodes", "2", "--node-rank", "1", "--master-port", port, "-n", "1", "--", "sh", "-c",
                         "sleep 0.5; exit 4"});
  });
  auto node0 = run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", port, "-n", "1", "--", "true"});
  auto r1 = node1.get();
  EXPECT_EQ(r1.exit_code, 4) << describe(r1);
  EXPECT_EQ(node0.exit_code, 4) << describe(node0);
  EXPECT_TRUE(contains(node0.err, "commsrun: node 1 exited with status 4")) << describe(node0);
  EXPECT_GE(node0.seconds, 0.4) << "node 0 closed the store before node 1 finished";
}

TEST(Commsrun, NodeZeroStopsWaitingForMissingNodesAfterTheExitBarrierTimeout) {
  auto r = run_commsrun({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(free_port()),
                         "--exit-barrier-timeout", "1", "-n", "1", "--", "true"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_TRUE(contains(r.err, "the other nodes did not all finish within 1 s")) << describe(r);
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 5);
}

bool process_is_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // A zombie waiting for a reaper counts as gone.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

TEST(Commsrun, RanksDieWithAKilledLauncher) {
  auto r = run_commsrun({"-n", "2", "--", "sh", "-c", "echo pid=$$; exec sleep 60"}, 20s,
                        SignalWhen{"pid=", 2, SIGKILL});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_LT(r.seconds, 10) << "the ranks kept commsrun's pipes open: " << describe(r);
  std::vector<pid_t> pids;
  std::regex pattern(R"(pid=(\d+))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), pattern), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  ASSERT_EQ(pids.size(), 2u) << describe(r);
  auto deadline = Clock::now() + 3s;
  for (pid_t pid : pids) {
    while (!process_is_gone(pid) && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(process_is_gone(pid)) << "rank process " << pid << " outlived commsrun";
  }
}

TEST(Commsrun, BadUsageIsRejectedWithAClearMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"-n", "2"}, "missing PROGRAM"},
      {{"-n", "0", "--", "true"}, "-n must be at least 1"},
      {{"-n", "1", "--nnodes", "2", "--node-rank", "2", "--master-port", "1234", "--", "true"},
       "--node-rank 2 is out of range"},
      {{"-n", "1", "--nnodes", "2", "--node-rank", "0", "--", "true"}, "explicit, non-zero --master-port"},
      {{"-n", "1", "--", "no-such-program-for-commsrun"}, "no-such-program-for-commsrun: command not found or not executable"},
      {{"-n", "1", "--no-such-option", "--", "true"}, "unexpected '--no-such-option' before --"},
      {{"-n", "1", "--no-such-option", "true"}, "unexpected '--no-such-option' before the program"},
      {{"--nproc_per_node=two", "true"}, "--nproc-per-node='two': give a number or auto"},
      {{"--standalone", "--nnodes", "2", "--master-port", "1234", "true"}, "--standalone is a single-node job"},
      {{"--store-only", "true"}, "--store-only starts no program, but 'true' was given"},
      {{"-n", "1", "--", "/nonexistent/program"}, "/nonexistent/program: command not found or not executable"},
  };
  for (const auto& c : cases) {
    auto r = run_commsrun(c.args, 10s);
    EXPECT_NE(r.exit_code, 0) << c.message << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, c.message)) << describe(r);
    EXPECT_EQ(r.out, "") << describe(r);
  }
}

}  // namespace
