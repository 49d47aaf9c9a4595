// The ops the Gloo backend runs with Gloo's own collectives, on the mesh of
// asynchronous pairs (op_rules.h's plan says which). A one-rank comm has no
// mesh: its plan copies (cpu_algorithms::run_on_one_rank). Runs on one
// thread at a time (the backend's op queue).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include <gloo/context.h>

#include "comms/plugin.h"
#include "plan.h"  // finish_reduction

namespace comms::gloo_backend {

class AsyncOps {
 public:
  // A comm of two ranks or more.
  AsyncOps(std::shared_ptr<::gloo::Context> ctx, int rank, int size)
      : ctx_(std::move(ctx)), rank_(rank), size_(size) {}
  // Throws Gloo's exceptions.
  void run(const plugin::OpDesc& op);
  void reset() { ctx_.reset(); }

 private:
  void* scratch(size_t bytes);  // reused across ops
  void all_reduce(const plugin::OpDesc& op);
  void reduce(const plugin::OpDesc& op);
  void broadcast(const plugin::OpDesc& op);
  void all_gather(const plugin::OpDesc& op, void* output);
  void all_gather_list(const plugin::OpDesc& op);
  void all_gather_v(const plugin::OpDesc& op);
  // Debian's Gloo has no reduce_scatter: an all-to-all and a local reduction.
  void reduce_scatter(const plugin::OpDesc& op, std::span<const size_t> counts);
  void all_to_all(const plugin::OpDesc& op);
  void all_to_all_v(const plugin::OpDesc& op);
  void all_to_all_v(const plugin::OpDesc& op, const void* input, std::span<const size_t> in_counts,
                    std::span<const size_t> out_counts);
  void gather(const plugin::OpDesc& op);
  void scatter(const plugin::OpDesc& op);
  void barrier(const plugin::OpDesc& op);
  void send_or_recv(const plugin::OpDesc& op);
  void point_to_point(std::span<const P2POp> ops, std::chrono::milliseconds timeout);

  std::shared_ptr<::gloo::Context> ctx_;
  int rank_, size_;
  std::vector<uint8_t> scratch_;
};

}  // namespace comms::gloo_backend
