// commsrun's output: its own messages, and each rank's pipes passed on line
// by line with a "[rank] " prefix.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace commsrun {

// Output longer than this without a newline is passed on as a line of its
// own, so that one rank cannot make the launcher buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

// Writes everything unless the reader went away (then the output is dropped).
void write_all(int fd, std::string_view data);
// "commsrun: <message>" on stderr.
void say(const std::string& message);
std::string signal_name(int sig);
std::string seconds_text(double s);
std::string ranks_text(int count);

// One of a rank's output pipes, cut into lines that are written whole.
class LineRelay {
 public:
  LineRelay(int read_fd, int target_fd, std::string prefix)
      : fd_(read_fd), target_fd_(target_fd), prefix_(std::move(prefix)) {}

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }

  // Reads what is available; closes the pipe at end of file.
  void pump();
  // Passes on a partial last line and closes the pipe.
  void close_and_flush();

 private:
  int fd_;
  int target_fd_;
  std::string prefix_;
  std::string pending_;
};

}  // namespace commsrun
