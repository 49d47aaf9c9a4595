// A program outside comms, built against an installed comms (pkg-config,
// CMake or Meson) and run under the installed commsrun: an all_reduce over
// cpu:gloo, whose plugin libcomms finds in its installed plugin folder.
#include <cstdio>
#include <vector>

#include "comms/comms.h"

int main() {
  auto comm = comms::new_comm("cpu:gloo", comms::Device::cpu(), "consumer");
  std::vector<int32_t> values = {comm->rank() + 1, 10 * (comm->rank() + 1)};
  comm->all_reduce(comms::BufferView::of(values), comms::ReduceOp::sum());
  const int n = comm->size();
  const bool right = values[0] == n * (n + 1) / 2 && values[1] == 10 * n * (n + 1) / 2;
  std::printf("consumer rank %d of %d: sum %d %d %s\n", comm->rank(), n, values[0], values[1],
              right ? "ok" : "WRONG");
  comm->finalize();
  return right ? 0 : 1;
}
