// A cable with latency, made in user space: this kernel has no sch_netem
// (nor sch_fq), so `tc ... netem delay` cannot add latency to a link.
//
// Two TAP devices, one in each namespace the cable joins, and a thread of
// the test process that copies every Ethernet frame from one to the other,
// holding it until `delay` after it was read. Frames leave in the order
// they came, per direction; a direction holds at most kMaxQueuedFrames (a
// frame beyond that is dropped, as a full device queue would, and TCP sends
// it again). The delay starts at 0 and may change at any time.
//
// Each TAP is created inside its namespace: a short-lived thread enters the
// namespace (setns) before opening /dev/net/tun, so the device is born
// there and nothing is added to the test's own namespace. A TAP lives as
// long as its file descriptor: the destructor stops the thread and closes
// both, which removes the devices, also when a test fails.
#pragma once

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace comms::testing::netns {

class DelayLine {
 public:
  static constexpr size_t kMaxQueuedFrames = 8192;

  // Joins interface `iface_a` of namespace `ns_a` to `iface_b` of `ns_b`
  // (namespaces as `ip netns` names them). The interfaces are left down and
  // without addresses, for `ip` to configure.
  DelayLine(const std::string& ns_a, const std::string& iface_a, const std::string& ns_b,
            const std::string& iface_b) {
    std::string error;
    std::thread maker([&] {
      // This thread's namespace changes; it ends right after.
      try {
        fd_[0] = make_tap(ns_a, iface_a);
        fd_[1] = make_tap(ns_b, iface_b);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    maker.join();
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (error.empty() && wake_ < 0) error = std::string("eventfd: ") + std::strerror(errno);
    if (!error.empty()) {
      close_all();
      throw std::runtime_error("delay line " + ns_a + "/" + iface_a + " <-> " + ns_b + "/" + iface_b + ": " + error);
    }
    forwarder_ = std::thread([this] { forward(); });
  }
  ~DelayLine() {
    stop_.store(true);
    const uint64_t one = 1;
    if (::write(wake_, &one, sizeof one) < 0) {
      // Cannot be full; the thread also checks the flag every 100 ms.
    }
    forwarder_.join();
    close_all();
  }
  DelayLine(const DelayLine&) = delete;
  DelayLine& operator=(const DelayLine&) = delete;

  // Each frame read from now on is held this long, in each direction.
  void set_delay(std::chrono::microseconds d) { delay_us_.store(d.count()); }
  std::chrono::microseconds delay() const { return std::chrono::microseconds(delay_us_.load()); }

  uint64_t frames_forwarded() const { return forwarded_.load(); }
  // Dropped: a full queue, or a write the device refused (e.g. while down).
  uint64_t frames_dropped() const { return dropped_.load(); }
  // Frames that were held at least 90% of a non-zero delay: the proof that
  // the line really delayed.
  uint64_t frames_delayed() const { return delayed_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Frame {
    Clock::time_point read_at, release_at;
    std::chrono::microseconds delay;
    std::vector<char> bytes;
  };

  static int make_tap(const std::string& ns, const std::string& iface) {
    if (iface.size() >= IFNAMSIZ) throw std::runtime_error("interface name too long: " + iface);
    const std::string path = "/var/run/netns/" + ns;
    const int ns_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
    const int rc = ::setns(ns_fd, CLONE_NEWNET);
    const int setns_errno = errno;
    ::close(ns_fd);
    if (rc != 0) throw std::runtime_error("setns into " + ns + ": " + std::strerror(setns_errno));
    const int fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw std::runtime_error(std::string("open /dev/net/tun: ") + std::strerror(errno));
    ifreq ifr{};
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    std::memcpy(ifr.ifr_name, iface.c_str(), iface.size());
    if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error("TUNSETIFF " + iface + " in " + ns + ": " + std::strerror(e));
    }
    return fd;
  }

  void close_all() {
    for (int& fd : fd_) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    if (wake_ >= 0) ::close(wake_);
    wake_ = -1;
  }

  // Reads what `from` has (a bounded batch) into `queue`.
  void take(int from, std::deque<Frame>& queue) {
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = ::read(from, buffer_.data(), buffer_.size());
      if (n <= 0) return;  // EAGAIN, or an error the next poll reports again
      if (queue.size() >= kMaxQueuedFrames) {
        dropped_.fetch_add(1);
        continue;
      }
      const auto now = Clock::now();
      const std::chrono::microseconds d = delay();
      queue.push_back({now, now + d, d, std::vector<char>(buffer_.begin(), buffer_.begin() + n)});
    }
  }

  // Writes the frames of `queue` whose time has come, oldest first; a frame
  // not yet due holds back every later one.
  void release(std::deque<Frame>& queue, int to, Clock::time_point now) {
    while (!queue.empty() && queue.front().release_at <= now) {
      const Frame& f = queue.front();
      if (::write(to, f.bytes.data(), f.bytes.size()) == static_cast<ssize_t>(f.bytes.size())) {
        forwarded_.fetch_add(1);
        if (f.delay.count() > 0 && now - f.read_at >= f.delay * 9 / 10) delayed_.fetch_add(1);
      } else {
        dropped_.fetch_add(1);
      }
      queue.pop_front();
    }
  }

  void forward() {
    std::deque<Frame> queue[2];  // queue[i]: frames read from fd_[i], for fd_[1 - i]
    while (!stop_.load()) {
      const auto now = Clock::now();
      for (int i = 0; i < 2; ++i) release(queue[i], fd_[1 - i], now);
      // Sleep until a frame arrives or the next one is due.
      timespec wait{0, 100'000'000};  // 100 ms at most: the stop flag is polled too
      for (const auto& q : queue) {
        if (q.empty()) continue;
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(q.front().release_at - now).count();
        const long long left = std::max<long long>(ns, 0);
        if (left < static_cast<long long>(wait.tv_sec) * 1'000'000'000 + wait.tv_nsec) {
          wait = {static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
        }
      }
      pollfd fds[3] = {{fd_[0], POLLIN, 0}, {fd_[1], POLLIN, 0}, {wake_, POLLIN, 0}};
      if (::ppoll(fds, 3, &wait, nullptr) < 0 && errno != EINTR) break;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].revents & POLLIN) take(fd_[i], queue[i]);
      }
    }
  }

  int fd_[2] = {-1, -1};
  int wake_ = -1;
  std::atomic<int64_t> delay_us_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> forwarded_{0}, dropped_{0}, delayed_{0};
  std::vector<char> buffer_ = std::vector<char>(65536);  // the forwarder's only
  std::thread forwarder_;
};

}  // namespace comms::testing::netns
