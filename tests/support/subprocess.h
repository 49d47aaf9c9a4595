// Runs a child process with a deadline and captures its output (stdout and
// stderr together). For tests that drive commsrun and the example programs.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace comms::testing {

struct Process {
  pid_t pid = -1;
  int out_fd = -1;
  std::string output;
  int status = -1;  // raw wait status
  std::chrono::steady_clock::time_point started;

  static Process start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env = {}) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    Process p;
    p.started = std::chrono::steady_clock::now();
    p.pid = fork();
    if (p.pid == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      setpgid(0, 0);  // so a timeout can kill the whole tree
      for (const auto& [k, v] : env) {
        if (v.empty()) unsetenv(k.c_str());
        else setenv(k.c_str(), v.c_str(), 1);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    p.out_fd = fds[0];
    fcntl(p.out_fd, F_SETFL, O_NONBLOCK);
    return p;
  }

  // Reads output until `pred(output)` holds, the child exits, or the timeout.
  bool read_until(const std::function<bool(const std::string&)>& pred, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!pred(output)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd pfd{out_fd, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(std::min<long>(left.count(), 100))) > 0) {
        char buf[4096];
        ssize_t n = read(out_fd, buf, sizeof buf);
        if (n > 0) output.append(buf, static_cast<size_t>(n));
        else if (n == 0) return pred(output);
      }
    }
    return true;
  }

  // Waits for exit; kills the process group after the timeout. Returns
  // whether it exited by itself.
  bool wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool eof = false;
    while (true) {
      if (!eof) {
        pollfd pfd{out_fd, POLLIN, 0};
        if (poll(&pfd, 1, 50) > 0) {
          char buf[4096];
          ssize_t n = read(out_fd, buf, sizeof buf);
          if (n > 0) output.append(buf, static_cast<size_t>(n));
          else if (n == 0) eof = true;
        }
      } else {
        usleep(20000);
      }
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        status = st;
        // Drain what is left.
        char buf[4096];
        ssize_t n;
        fcntl(out_fd, F_SETFL, 0);
        while (!eof && (n = read(out_fd, buf, sizeof buf)) > 0) output.append(buf, static_cast<size_t>(n));
        close(out_fd);
        return true;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        close(out_fd);
        return false;
      }
    }
  }

  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

inline Process run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                   std::chrono::milliseconds timeout) {
  Process p = Process::start(argv, env);
  p.wait(timeout);
  return p;
}

// The pids of a process's direct children (Linux).
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children";
  if (FILE* f = fopen(path.c_str(), "r")) {
    int c;
    while (fscanf(f, "%d", &c) == 1) out.push_back(c);
    fclose(f);
  }
  return out;
}

// A loopback TCP port that was free a moment ago (bound, read back, closed).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), size) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace comms::testing
