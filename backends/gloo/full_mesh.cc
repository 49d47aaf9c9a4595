#include "full_mesh.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>

#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>

namespace comms::gloo_backend {

// Enough threads that a large comm's pairs overlap their waits, few enough
// that a thousand-rank comm does not start thousands of threads.
constexpr size_t kMaxThreads = 32;
// How often the loop is woken while pairs are in flight: a pair's wait for
// the tick lasts at most this long. It starts short (the waits come as the
// pairs start) and backs off, so a pair that waits for a slow peer costs
// the loop no more than a wake a millisecond.
constexpr auto kFirstWake = std::chrono::microseconds(100);
constexpr auto kLastWake = std::chrono::milliseconds(1);

MeshDevice::MeshDevice(const ::gloo::transport::tcp::attr& attr)
    : device_(::gloo::transport::tcp::CreateDevice(attr)),
      tcp_(static_cast<::gloo::transport::tcp::Device*>(device_.get())) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  tcp_->registerDescriptor(wake_fd_, EPOLLIN, this);
}

MeshDevice::~MeshDevice() {
  tcp_->unregisterDescriptor(wake_fd_, this);
  ::close(wake_fd_);
}

void MeshDevice::handleEvents(int) {
  uint64_t count = 0;
  while (::read(wake_fd_, &count, sizeof count) < 0 && errno == EINTR) {
  }
}

void MeshDevice::wake_loop() {
  const uint64_t one = 1;
  while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void MeshDevice::run_concurrently(size_t n, const std::function<void(size_t)>& task) {
  if (n == 0) return;
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  std::atomic<size_t> finished{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        task(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
    ++finished;
  };
  std::vector<std::thread> threads;
  threads.reserve(std::min(n, kMaxThreads));
  try {
    while (threads.size() < std::min(n, kMaxThreads)) threads.emplace_back(work);
  } catch (...) {
    // Out of threads: the ones started do every task.
  }
  if (threads.empty()) {
    work();  // without the wakes: each wait ends on the loop's own timeout
  } else {
    auto pause = std::chrono::duration_cast<std::chrono::microseconds>(kFirstWake);
    while (finished.load() < threads.size()) {
      wake_loop();
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, kLastWake);
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void Mesh::connect(const std::vector<Rendezvous>& meshes, MeshDevice& device) {
  struct PairToConnect {
    ::gloo::transport::Pair* pair;
    std::vector<char> peer_address;
  };
  std::vector<std::shared_ptr<::gloo::transport::Context>> contexts;
  for (const auto& [mesh, store] : meshes) {
    auto context = device.gloo()->createContext(mesh->rank, mesh->size);
    context->setTimeout(mesh->getTimeout());
    std::vector<char> addresses;
    for (int peer = 0; peer < mesh->size; ++peer) {
      if (peer == mesh->rank) continue;
      const auto bytes = context->createPair(peer)->address().bytes();
      addresses.insert(addresses.end(), bytes.begin(), bytes.end());
    }
    store->set(std::to_string(mesh->rank), addresses);
    contexts.push_back(std::move(context));
  }
  std::vector<PairToConnect> pairs;
  for (size_t m = 0; m < meshes.size(); ++m) {
    auto& [mesh, store] = meshes[m];
    for (int peer = 0; peer < mesh->size; ++peer) {
      if (peer == mesh->rank) continue;
      const std::string key = std::to_string(peer);
      store->wait({key});
      auto all = store->get(key);
      pairs.push_back({contexts[m]->getPair(peer).get(), mesh->extractAddress(all, peer)});
    }
  }
  device.run_concurrently(pairs.size(), [&](size_t i) { pairs[i].pair->connect(pairs[i].peer_address); });
  for (size_t m = 0; m < meshes.size(); ++m) {
    meshes[m].mesh->device_ = device.gloo();
    meshes[m].mesh->transportContext_ = std::move(contexts[m]);
  }
}

void Mesh::set_sync(bool busy_poll, MeshDevice& device) {
  device.run_concurrently(static_cast<size_t>(size), [&](size_t peer) {
    if (static_cast<int>(peer) != rank) getPair(static_cast<int>(peer))->setSync(true, busy_poll);
  });
}

void Mesh::close(MeshDevice& device) {
  if (!transportContext_) return;
  device.run_concurrently(static_cast<size_t>(size), [&](size_t peer) { getPair(static_cast<int>(peer)).reset(); });
}

}  // namespace comms::gloo_backend
