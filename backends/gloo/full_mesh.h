// Gloo meshes whose pairs connect, switch to sync mode and close all at
// once, on a device whose event loop is woken for them. In this Gloo, a pair
// that connects, goes sync or closes first takes its socket out of the
// device's event loop and waits for the loop's next tick, which comes after
// an event or a 10 ms timeout; and Gloo's own connectFullMesh and
// closeConnections do one pair after another. Pairs are independent, so
// they go concurrently, and the calling thread wakes the loop meanwhile.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>

#include "store_adapter.h"

namespace comms::gloo_backend {

// A Gloo TCP device with an eventfd in its event loop's epoll set: writing
// it ends the loop's wait, so a thread waiting for the next tick goes on.
class MeshDevice : public ::gloo::transport::tcp::Handler {
 public:
  explicit MeshDevice(const ::gloo::transport::tcp::attr& attr);
  ~MeshDevice() override;
  MeshDevice(const MeshDevice&) = delete;
  MeshDevice& operator=(const MeshDevice&) = delete;

  const std::shared_ptr<::gloo::transport::Device>& gloo() const { return device_; }
  // Runs task(0) ... task(n - 1) concurrently (up to a bounded number of
  // threads), waking the loop until all have finished; then rethrows the
  // exception of the lowest index that threw.
  void run_concurrently(size_t n, const std::function<void(size_t)>& task);

  void handleEvents(int events) override;  // the loop thread: drains the eventfd

 private:
  void wake_loop();
  std::shared_ptr<::gloo::transport::Device> device_;
  ::gloo::transport::tcp::Device* tcp_;
  int wake_fd_ = -1;
};

class Mesh : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;

  // Gloo's connectFullMesh, for several meshes at once over one device:
  // each publishes its pairs' addresses through its own store (the same
  // keys and layout as Gloo's, so a peer running Gloo's own connects), and
  // then every pair of every mesh connects concurrently.
  struct Rendezvous {
    Mesh* mesh;
    StoreAdapter* store;
  };
  static void connect(const std::vector<Rendezvous>& meshes, MeshDevice& device);

  void set_sync(bool busy_poll, MeshDevice& device);  // every pair, as Pair::setSync(true, busy_poll)
  // Destroys every pair: Gloo's soft close, whose FIN follows the data
  // still in flight. Not Gloo's closeConnections: its reset (SO_LINGER 0)
  // can make a peer drop what it has not read yet, and this Gloo does not
  // wake a receive waiting on that peer, which then waits out its timeout.
  void close(MeshDevice& device);
};

}  // namespace comms::gloo_backend
