// For the helper programs of the growth tests (tests/mp/*grow_helper.cc): a
// member starts the same program again as a newcomer, with the member's
// environment so that it reaches the job's store, and waits for it.
#pragma once

#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

namespace comms::testing {

inline std::string self_path() {
  char buf[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// This program with the arguments "newcomer <scenario>"; exits 5 when it
// cannot be started (the test then fails on the member's status).
inline pid_t start_newcomer(const std::string& scenario) {
  const std::string self = self_path();
  std::vector<std::string> args = {self, "newcomer", scenario};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start a newcomer\n");
    std::exit(5);
  }
  return pid;
}

// Its exit status, or 128 + the signal that ended it; -1 when not a child.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace comms::testing
