// Simulated hosts for multi-host tests: network namespaces that the test
// creates, joined through bridges in one more namespace it creates, with
// addresses from the documentation range 192.0.2.0/24. Nothing is added to
// the namespace the test runs in.
//
//   net A (192.0.2.0/25):   node i's eth0 is 192.0.2.(10+i), bridge br0
//   net B (192.0.2.128/25): node i's eth1 is 192.0.2.(138+i), bridge br1
//
// Cables are veth pairs, except that one node's cable to net A may be a
// delay line (delay_line.h: two TAP devices and a thread that can hold
// every frame), for added latency without sch_netem.
//
// Every name starts with "comms-mh-<pid>-". The destructor kills whatever
// still runs inside the namespaces and deletes them; remove_stale() deletes
// the namespaces of earlier runs whose process is gone (one killed before
// its destructor ran).
//
// Jobs are processes started in a namespace (`ip netns exec`), with their
// output read line by line and time-stamped. They die with the test process
// (PR_SET_PDEATHSIG), and commsrun takes its ranks with it the same way.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "delay_line.h"
#include "subprocess.h"

namespace comms::testing::netns {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline constexpr char kPrefix[] = "comms-mh-";

// The tool's path on PATH or in the sbin directories (root's PATH may lack
// them under a test runner); empty if absent.
inline std::string find_tool(const std::string& name) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    std::string candidate = dirs.substr(start, colon - start) + "/" + name;
    struct stat st;
    if (colon > start && ::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = colon + 1;
  }
  return {};
}

struct CommandResult {
  int code = -1;
  std::string output;
};

// Runs a short command (ip, tc, ss) to completion, at most 20 s.
inline CommandResult command(std::vector<std::string> argv) {
  argv[0] = find_tool(argv[0]);
  if (argv[0].empty()) return {127, "not found"};
  Process p = run(argv, {}, 20s);
  return {p.status == -1 ? -1 : p.exit_code(), p.output};
}

// As command(), but a failure throws naming the command and what it said.
inline std::string must(const std::vector<std::string>& argv) {
  CommandResult r = command(argv);
  if (r.code != 0) {
    std::string text;
    for (const auto& a : argv) text += a + " ";
    throw std::runtime_error(text + "failed (" + std::to_string(r.code) + "): " + r.output);
  }
  return r.output;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Our namespaces: "<prefix><pid>-..." as listed by `ip netns list`.
inline std::vector<std::string> namespaces_with_prefix(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(command({"ip", "netns", "list"}).output)) {
    std::string name = line.substr(0, line.find(' '));  // "name (id: 3)"
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// Kills every process inside the namespace, waits (briefly) until none is
// left, and deletes it.
inline void remove_namespace(const std::string& name) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto pids = lines_of(command({"ip", "netns", "pids", name}).output);
    if (pids.empty()) break;
    for (const auto& pid : pids) ::kill(std::atoi(pid.c_str()), SIGKILL);
    std::this_thread::sleep_for(20ms);
  }
  command({"ip", "netns", "del", name});
}

// Namespaces left by runs whose test process no longer exists.
inline void remove_stale() {
  for (const auto& name : namespaces_with_prefix(kPrefix)) {
    const pid_t owner = std::atoi(name.c_str() + sizeof(kPrefix) - 1);
    if (owner > 0 && (::kill(owner, 0) == 0 || errno != ESRCH)) continue;
    remove_namespace(name);
  }
}

// Why namespaces cannot be made here, or empty if they can.
inline std::string unavailable_reason() {
  if (::geteuid() != 0) return "needs root to create network namespaces";
  if (find_tool("ip").empty()) return "needs iproute2's ip";
  const std::string probe = kPrefix + std::to_string(::getpid()) + "-probe";
  CommandResult r = command({"ip", "netns", "add", probe});
  if (r.code != 0) return "`ip netns add` failed: " + r.output;
  command({"ip", "netns", "del", probe});
  return {};
}

class Network {
 public:
  // `nodes` hosts; with `second_net`, each also has eth1 on net B. Node
  // `delayed_node`'s eth0, if given, is a delay line (delay 0 to start with).
  explicit Network(int nodes, bool second_net = false, int delayed_node = -1) {
    prefix_ = kPrefix + std::to_string(::getpid()) + "-";
    try {
      add_namespace(switch_ns());
      must({"ip", "-n", switch_ns(), "link", "set", "lo", "up"});
      for (const char* bridge : {"br0", "br1"}) {
        if (std::string(bridge) == "br1" && !second_net) break;
        must({"ip", "-n", switch_ns(), "link", "add", bridge, "type", "bridge"});
        must({"ip", "-n", switch_ns(), "link", "set", bridge, "up"});
      }
      for (int i = 0; i < nodes; ++i) {
        add_namespace(node(i));
        must({"ip", "-n", node(i), "link", "set", "lo", "up"});
        if (i == delayed_node) {
          delay_line_ = std::make_unique<DelayLine>(node(i), "eth0", switch_ns(), switch_port(i, 0));
          attach(i, "eth0", switch_port(i, 0), "br0", address(i, 0) + "/25");
        } else {
          plug(i, "eth0", switch_port(i, 0), "br0", address(i, 0) + "/25");
        }
        if (second_net) plug(i, "eth1", switch_port(i, 1), "br1", address(i, 1) + "/25");
      }
    } catch (...) {
      remove();
      throw;
    }
  }
  ~Network() { remove(); }
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const std::string& prefix() const { return prefix_; }
  std::string node(int i) const { return prefix_ + "n" + std::to_string(i); }
  std::string switch_ns() const { return prefix_ + "sw"; }
  // Node i's address on net A (0) or B (1).
  static std::string address(int i, int net) { return "192.0.2." + std::to_string((net ? 138 : 10) + i); }
  // The switch's side of node i's cable to net A or B.
  static std::string switch_port(int i, int net) { return (net ? "b" : "a") + std::to_string(i); }

  // Runs a command inside node i's namespace.
  CommandResult in_node(int i, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"ip", "netns", "exec", node(i)});
    return command(argv);
  }

  // The delayed node's cable (null without one).
  DelayLine* delay_line() const { return delay_line_.get(); }

  void remove() {
    delay_line_.reset();  // its TAP devices go with its file descriptors
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) remove_namespace(*it);
    created_.clear();
  }

 private:
  void add_namespace(const std::string& name) {
    must({"ip", "netns", "add", name});
    created_.push_back(name);
  }

  // A veth cable from node i's `iface` to a port of `bridge`.
  void plug(int i, const std::string& iface, const std::string& port, const std::string& bridge,
            const std::string& cidr) {
    must({"ip", "-n", node(i), "link", "add", iface, "type", "veth", "peer", "name", port, "netns",
          switch_ns()});
    attach(i, iface, port, bridge, cidr);
  }

  // Puts a cable's switch end (`port`) on `bridge` and gives node i's end
  // (`iface`) its address.
  void attach(int i, const std::string& iface, const std::string& port, const std::string& bridge,
              const std::string& cidr) {
    must({"ip", "-n", switch_ns(), "link", "set", port, "master", bridge, "up"});
    must({"ip", "-n", node(i), "addr", "add", cidr, "dev", iface});
    must({"ip", "-n", node(i), "link", "set", iface, "up"});
  }

  std::string prefix_;
  std::vector<std::string> created_;
  std::unique_ptr<DelayLine> delay_line_;
};

// A process in a namespace, its output kept as time-stamped lines.
class Job {
 public:
  struct Line {
    Clock::time_point at;
    std::string text;
  };

  Job(const std::string& ns, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    std::vector<std::string> full = {find_tool("ip"), "netns", "exec", ns};
    full.insert(full.end(), argv.begin(), argv.end());
    std::vector<char*> args;
    for (auto& a : full) args.push_back(a.data());
    args.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // ip execs commsrun, which keeps it
      if (::getppid() != parent) ::_exit(1);
      ::setpgid(0, 0);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      for (const auto& [k, v] : env) {
        if (v.empty()) ::unsetenv(k.c_str());
        else ::setenv(k.c_str(), v.c_str(), 1);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    if (pid_ < 0) {
      ::close(fds[0]);
      throw std::runtime_error("fork failed");
    }
    fd_ = fds[0];
    ::fcntl(fd_, F_SETFL, O_NONBLOCK);
  }
  ~Job() {
    if (running()) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }
  bool finished() const { return exited_ && fd_ < 0; }
  int exit_code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_); }
  Clock::time_point exited_at() const { return exited_at_; }
  const std::vector<Line>& lines() const { return lines_; }
  std::string output() const {
    std::string out;
    for (const auto& l : lines_) out += l.text + "\n";
    return out + partial_;
  }
  // The first line containing `needle`, if any.
  const Line* find(const std::string& needle) const {
    for (const auto& l : lines_) {
      if (l.text.find(needle) != std::string::npos) return &l;
    }
    return nullptr;
  }

  int fd() const { return fd_; }
  // Reads what is available and reaps the process once it has exited.
  void pump() {
    char buf[8192];
    while (fd_ >= 0) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n > 0) {
        add(std::string_view(buf, static_cast<size_t>(n)));
        continue;
      }
      if (n == 0 || errno != EAGAIN) {
        if (!partial_.empty()) lines_.push_back({Clock::now(), partial_});
        partial_.clear();
        ::close(fd_);
        fd_ = -1;
      }
      break;
    }
    if (!exited_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) {
      exited_ = true;
      exited_at_ = Clock::now();
    }
  }

 private:
  void add(std::string_view data) {
    const auto now = Clock::now();
    partial_.append(data);
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines_.push_back({now, partial_.substr(start, nl - start)});
    }
    partial_.erase(0, start);
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = -1;
  bool exited_ = false;
  Clock::time_point exited_at_;
  std::vector<Line> lines_;
  std::string partial_;
};

// Pumps every job until `done()` holds or the deadline passes; returns
// whether it held.
inline bool pump_until(const std::vector<Job*>& jobs, const std::function<bool()>& done, Clock::time_point deadline) {
  while (true) {
    for (Job* j : jobs) j->pump();
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::vector<pollfd> fds;
    for (Job* j : jobs) {
      if (j->fd() >= 0) fds.push_back({j->fd(), POLLIN, 0});
    }
    // A short poll also notices exits of jobs whose output is closed.
    ::poll(fds.data(), fds.size(), 50);
  }
}

inline bool wait_all(const std::vector<Job*>& jobs, Clock::time_point deadline) {
  return pump_until(
      jobs, [&] { return std::all_of(jobs.begin(), jobs.end(), [](Job* j) { return j->finished(); }); }, deadline);
}

}  // namespace comms::testing::netns
