// What the UCX backend's host-shared memory leaves mapped in this process,
// for tests that check finalize, offload and abort release peers' memory.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "comms/comms.h"

namespace comms::testing_support {

// Mappings of host-shared allocations (this process's own and peers'):
// the memfds are named "comms-ucx".
inline int host_shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/memfd:comms-ucx") != std::string::npos;
  return n;
}

// Aborts `comm` and expects its peers' mappings gone (back to `before`);
// then finalizes it, which may report what the abort could not release.
inline void expect_abort_unmaps(Comm& comm, int before, const std::string& why) {
  comm.abort(why);
  EXPECT_EQ(host_shared_mappings(), before) << "after abort";
  try {
    comm.finalize();
  } catch (const Error&) {
    // An aborted comm may report what it could not release.
  }
}

}  // namespace comms::testing_support
