#include "spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "comms/env.h"
#include "util/strutil.h"

extern char** environ;

namespace commsrun {
namespace {

namespace str = comms::str;

// tcp://host:port, with an IPv6 address in brackets.
std::string store_url(const std::string& host, uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return str::cat("tcp://", ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port);
}

// The parent's environment with the launcher's variables replacing any
// inherited ones. MASTER_ADDR/MASTER_PORT are the program's: commsrun's
// store goes by COMMS_STORE, which comms reads first, so that a torch
// program's own TCPStore never talks to it.
std::vector<std::string> rank_environment(const LaunchOptions& options, int local_rank,
                                          const RankAddresses& addresses, int replacement) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(options.node_rank * options.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(options.nnodes * options.nproc)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(addresses.master_port)},
      {"COMMS_STORE", store_url(options.master_addr, addresses.store_port)},
  };
  if (options.token_generated) ours.emplace_back("COMMS_STORE_TOKEN", options.store_token);
  // A job meant to outlive a rank needs elastic comms (their heartbeats and
  // revocation watch); an explicit COMMS_ELASTIC from the caller wins.
  if (options.keep_going && !comms::env::get("COMMS_ELASTIC")) ours.emplace_back("COMMS_ELASTIC", "1");
  if (replacement > 0) ours.emplace_back("COMMS_REPLACEMENT", std::to_string(replacement));
  std::vector<std::string> env;
  for (char** entry = environ; *entry; ++entry) {
    std::string_view text(*entry);
    std::string_view name = text.substr(0, text.find('='));
    bool replaced = std::any_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; });
    // An inherited COMMS_REPLACEMENT would make an original rank join.
    if (!replaced && name != "COMMS_REPLACEMENT") env.emplace_back(text);
  }
  for (const auto& [name, value] : ours) {
    if (replacement > 0 && name == "RANK") continue;
    env.push_back(name + "=" + value);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::optional<std::string> find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0) return std::nullopt;
    return name;
  }
  const std::string dirs = comms::env::get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(start, colon - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = colon + 1;
  }
  return std::nullopt;
}

std::string process_name(const RankProcess& process) {
  return process.replacement > 0 ? str::cat("replacement +", process.replacement) : str::cat("rank ", process.rank);
}

bool spawn_rank(const LaunchOptions& options, const std::string& program_path, int local_rank,
                const RankAddresses& addresses, RankProcess* out, int replacement) {
  RankProcess rank;
  rank.local_rank = local_rank;
  rank.rank = options.node_rank * options.nproc + local_rank;
  rank.replacement = replacement;
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    say(str::cat("pipe failed: ", std::strerror(errno)));
    return false;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    say(str::cat("pipe failed: ", std::strerror(errno)));
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return false;
  }
  // Everything the child needs is built before fork: the store server's
  // thread may hold the allocator's lock at the moment we fork.
  std::vector<std::string> env = rank_environment(options, local_rank, addresses, replacement);
  std::vector<char*> envp = c_strings(env);
  std::vector<std::string> args = options.command;
  std::vector<char*> argv = c_strings(args);
  std::string exec_failed = str::cat("commsrun: cannot execute ", program_path, ": ");
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    say(str::cat("fork failed: ", std::strerror(errno)));
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], dev_null}) ::close(fd);
    return false;
  }
  if (pid == 0) {
    // Async-signal-safe calls only from here to exec. PDEATHSIG fires when
    // the forking *thread* ends: that is the main thread, which outlives
    // every rank.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    if (dev_null >= 0) ::dup2(dev_null, STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execve(program_path.c_str(), argv.data(), envp.data());
    int err = errno;
    ssize_t ignored = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    const char* reason = ::strerror(err);  // glibc's is a table look-up
    ignored = ::write(STDERR_FILENO, reason, std::strlen(reason));
    ignored = ::write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that no signal races the child's own call
  for (int fd : {out_pipe[1], err_pipe[1], dev_null}) {
    if (fd >= 0) ::close(fd);
  }
  rank.pid = pid;
  rank.running = true;
  std::string prefix = replacement > 0 ? str::cat("[+", replacement, "] ") : str::cat("[", rank.rank, "] ");
  rank.out = std::make_unique<LineRelay>(out_pipe[0], STDOUT_FILENO, prefix);
  rank.err = std::make_unique<LineRelay>(err_pipe[0], STDERR_FILENO, prefix);
  *out = std::move(rank);
  return true;
}

}  // namespace commsrun
