#include "output.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "util/strutil.h"

namespace commsrun {

namespace str = comms::str;

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. our reader went away: the output is dropped
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "commsrun: " + message + "\n"); }

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? str::cat("SIG", abbrev) : str::cat("signal ", sig);
}

std::string seconds_text(double s) { return str::cat(s); }

std::string ranks_text(int count) { return str::cat(count, count == 1 ? " rank" : " ranks"); }

void LineRelay::pump() {
  char buffer[64 * 1024];
  ssize_t n = ::read(fd_, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close_and_flush();
    return;
  }
  pending_.append(buffer, static_cast<size_t>(n));
  std::string lines;
  size_t start = 0;
  for (size_t newline; (newline = pending_.find('\n', start)) != std::string::npos; start = newline + 1) {
    lines += prefix_;
    lines.append(pending_, start, newline + 1 - start);
  }
  pending_.erase(0, start);
  if (pending_.size() >= kMaxLineBytes) {
    str::append(lines, prefix_, pending_, "\n");
    pending_.clear();
  }
  if (!lines.empty()) write_all(target_fd_, lines);
}

void LineRelay::close_and_flush() {
  if (!pending_.empty()) write_all(target_fd_, str::cat(prefix_, pending_, "\n"));
  pending_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace commsrun
