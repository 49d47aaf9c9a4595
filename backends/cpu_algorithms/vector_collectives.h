// The CPU collectives Collectives (collectives.h) does not run, on any
// Transport: the v-variants, all_gather into a list, and all_to_all, gather,
// scatter and broadcast of any size. All of them are one pairwise exchange:
// at step s each rank sends to rank + s and receives from rank - s, one
// kPieceBytes piece at a time, alternating a send and a receive, so a rank
// never has more than one unread piece in flight per peer before it reads
// (the transport's buffering rule) and no cycle of blocked senders can form.
// Sends go out with send_stable (the op's inputs stay unchanged), so a
// transport that can sends them in place.
// Reductions (reduce_scatter_v) run locally in rank order.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "reductions.h"
#include "transport.h"

namespace comms::cpu_algorithms {

class VectorCollectives {
 public:
  static constexpr size_t kPieceBytes = 128 * 1024;

  // What this rank sends to (or receives from) one rank; bytes may be 0.
  struct Block {
    const void* data = nullptr;
    size_t bytes = 0;
  };
  struct MutableBlock {
    void* data = nullptr;
    size_t bytes = 0;
  };

  // The transport must outlive this object.
  explicit VectorCollectives(Transport& transport) : t_(transport), rank_(transport.rank()), size_(transport.size()) {}

  // to[p] goes to rank p, from[p] is filled by rank p (to[rank] is copied
  // to from[rank]); both span `size` entries. Both ends of a pair must agree
  // on the length.
  void exchange(std::span<const Block> to, std::span<const MutableBlock> from, Clock::time_point deadline);

  // Byte counts per rank; offsets are the prefix sums. Inputs that alias the
  // output are copied aside first.
  void all_to_all_v(const void* in, void* out, std::span<const size_t> send_bytes,
                    std::span<const size_t> recv_bytes, Clock::time_point deadline);
  void all_gather_v(const void* in, void* out, std::span<const size_t> bytes, Clock::time_point deadline);
  void all_gather_list(const void* in, std::span<void* const> outs, size_t bytes, Clock::time_point deadline);
  // counts[r]: elements rank r gets; out = reduction in rank order of every
  // rank's block for this rank.
  void reduce_scatter_v(const void* in, void* out, std::span<const size_t> counts, size_t element_size,
                        ReduceFn fn, Clock::time_point deadline);
  void gather(const void* in, void* out, size_t bytes, int root, Clock::time_point deadline);
  void scatter(const void* in, void* out, size_t bytes, int root, Clock::time_point deadline);
  // Every rank's data ends as the root's.
  void broadcast(void* data, size_t bytes, int root, Clock::time_point deadline);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // A copy of data when it overlaps [out, out + out_bytes), else data.
  const void* aside(const void* data, size_t bytes, const void* out, size_t out_bytes);

  Transport& t_;
  int rank_, size_;
  std::vector<unsigned char> scratch_, aside_;
};

}  // namespace comms::cpu_algorithms
