// What the trainer's plain and elastic loops share: the stop watcher, the
// synthetic data and the model.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace trainer {

constexpr int kInputs = 16;

// SIGTERM and SIGINT (the launcher's stop, Ctrl-C). The main loop checks
// requested() after each step's collectives, so a rank whose peer died
// reports the collective's error, not the signal. But a rank blocked in a
// collective or a rendezvous (a reload waiting for a stopped peer) would
// only notice at its timeout, minutes later. So a thread takes the signals,
// and if the main thread has not ended kGraceMs after one (or at a second
// one), it ends the process itself, saying where the main thread was.
class StopWatcher {
 public:
  static constexpr int kGraceMs = 2000;

  // Blocks the signals before any other thread exists (the library's threads
  // inherit the mask), so only the watcher's signalfd receives them.
  StopWatcher() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC);
    done_fd_ = eventfd(0, EFD_CLOEXEC);
    if (signal_fd_ < 0 || done_fd_ < 0) {
      std::fprintf(stderr, "trainer: cannot watch for SIGTERM/SIGINT: %s\n", std::strerror(errno));
      std::exit(1);
    }
    thread_ = std::thread([this] { watch(); });
  }
  ~StopWatcher() {
    const uint64_t one = 1;
    ssize_t ignored = write(done_fd_, &one, sizeof one);
    (void)ignored;
    thread_.join();
    close(signal_fd_);
    close(done_fd_);
  }
  StopWatcher(const StopWatcher&) = delete;
  StopWatcher& operator=(const StopWatcher&) = delete;

  // The signal received, or 0.
  int requested() const { return signal_.load(); }
  // What the main thread is doing, for the message when it is cut short.
  void at(const char* phase, int step = 0) {
    step_.store(step);
    phase_.store(phase);
  }

 private:
  // Waits for a signal or the end; returns the signal, 0 at the end or the
  // timeout.
  int next(int timeout_ms) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {done_fd_, POLLIN, 0}};
    while (true) {
      int ready = poll(fds, 2, timeout_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0 || (fds[1].revents & POLLIN)) return 0;
      signalfd_siginfo info;
      if (read(signal_fd_, &info, sizeof info) == sizeof info) return static_cast<int>(info.ssi_signo);
    }
  }

  void watch() {
    const int sig = next(-1);
    if (sig == 0) return;
    signal_.store(sig);
    // Past the grace, or a second signal: the main thread is stuck.
    pollfd done = {done_fd_, POLLIN, 0};
    if (next(kGraceMs) == 0 && poll(&done, 1, 0) == 1) return;
    const int step = step_.load();
    std::fprintf(stderr, "trainer: stopped by SIG%s while blocked in %s%s; not waiting for it to time out\n",
                 sigabbrev_np(sig), phase_.load(), step ? (" at step " + std::to_string(step)).c_str() : "");
    _exit(128 + sig);
  }

  int signal_fd_ = -1;
  int done_fd_ = -1;
  std::atomic<int> signal_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::atomic<int> step_{0};
  std::thread thread_;
};

constexpr int kHidden = 32;

// A counter-based generator: sample i's values do not depend on which rank
// draws them.
inline double uniform(uint64_t key) {
  key += 0x9e3779b97f4a7c15ull;
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
  key ^= key >> 31;
  return static_cast<double>(key >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

struct Sample {
  float x[kInputs];
  float y;
};

inline Sample sample(uint64_t index) {
  Sample s{};
  double y = 0.3;
  for (int j = 0; j < kInputs; ++j) {
    s.x[j] = static_cast<float>(uniform(index * 1000 + j));
    y += std::sin(0.5 * (j + 1)) * s.x[j];  // the function to learn
  }
  s.y = static_cast<float>(y + 0.1 * std::tanh(s.x[0] * s.x[1]));
  return s;
}

struct Model {
  bool mlp;
  std::vector<float> params;

  explicit Model(bool two_layer) : mlp(two_layer) {
    params.assign(two_layer ? kInputs * kHidden + kHidden + kHidden + 1 : kInputs + 1, 0.0f);
  }
  void init(uint64_t seed) {
    const float s = mlp ? 0.25f : 0.1f;
    for (size_t i = 0; i < params.size(); ++i) params[i] = s * static_cast<float>(uniform(seed + i));
  }

  // Adds d(loss)/d(params) of one sample (squared error) to grad, scaled by
  // `weight`, and returns the sample's loss.
  double accumulate(const Sample& s, std::vector<float>& grad, float weight) const {
    if (!mlp) {
      float pred = params[kInputs];
      for (int j = 0; j < kInputs; ++j) pred += params[j] * s.x[j];
      const float err = pred - s.y;
      for (int j = 0; j < kInputs; ++j) grad[j] += weight * 2 * err * s.x[j];
      grad[kInputs] += weight * 2 * err;
      return double(err) * err;
    }
    const float* w1 = params.data();
    const float* b1 = w1 + kInputs * kHidden;
    const float* w2 = b1 + kHidden;
    const float b2 = w2[kHidden];
    float h[kHidden];
    float pred = b2;
    for (int k = 0; k < kHidden; ++k) {
      float a = b1[k];
      for (int j = 0; j < kInputs; ++j) a += w1[k * kInputs + j] * s.x[j];
      h[k] = std::tanh(a);
      pred += w2[k] * h[k];
    }
    const float err = pred - s.y;
    float* gw1 = grad.data();
    float* gb1 = gw1 + kInputs * kHidden;
    float* gw2 = gb1 + kHidden;
    gw2[kHidden] += weight * 2 * err;
    for (int k = 0; k < kHidden; ++k) {
      gw2[k] += weight * 2 * err * h[k];
      const float dh = weight * 2 * err * w2[k] * (1 - h[k] * h[k]);
      gb1[k] += dh;
      for (int j = 0; j < kInputs; ++j) gw1[k * kInputs + j] += dh * s.x[j];
    }
    return double(err) * err;
  }
};

}  // namespace trainer
