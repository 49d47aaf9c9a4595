// Where this process sits on its host, for a comm whose rank and size the
// caller gave.
#pragma once

namespace comms::internal {

struct LocalPlacement {
  int local_rank = 0;
  int local_size = 1;
};

// The caller's rank and size stand for the environment's: RANK/WORLD_SIZE
// (and every other family's pair) are neither required nor checked, so a
// harness that sets WORLD_SIZE and passes ranks by hand works. The first
// family that sets a local rank gives it, with its local size (else the
// larger of size and local rank + 1) when that pair holds; anything else
// (nothing set, malformed, local rank not below local size): one host.
LocalPlacement local_placement_from_environment(int rank, int size);

}  // namespace comms::internal
