#include "vector_collectives.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace comms::cpu_algorithms {
namespace {

Region user(const void* p, size_t bytes) { return {const_cast<void*>(p), bytes, false}; }

std::vector<size_t> offsets_of(std::span<const size_t> bytes) {
  std::vector<size_t> off(bytes.size(), 0);
  if (!bytes.empty()) std::exclusive_scan(bytes.begin(), bytes.end(), off.begin(), size_t{0});
  return off;
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an && bn && pa < pb + bn && pb < pa + an;
}

// Tells the transport that the op's caller regions are done with, on every exit.
struct OpScope {
  Transport& t;
  ~OpScope() { t.op_done(); }
};

}  // namespace

const void* VectorCollectives::aside(const void* data, size_t bytes, const void* out, size_t out_bytes) {
  if (!overlaps(data, bytes, out, out_bytes)) return data;
  if (aside_.size() < bytes) aside_.resize(bytes);
  std::memcpy(aside_.data(), data, bytes);
  return aside_.data();
}

void VectorCollectives::exchange(std::span<const Block> to, std::span<const MutableBlock> from,
                                 Clock::time_point deadline) {
  const OpScope scope{t_};
  const auto& self_out = to[static_cast<size_t>(rank_)];
  const auto& self_in = from[static_cast<size_t>(rank_)];
  if (self_in.bytes && self_in.data != self_out.data) std::memmove(self_in.data, self_out.data, self_in.bytes);
  auto pieces = [](size_t bytes) { return (bytes + kPieceBytes - 1) / kPieceBytes; };
  for (int s = 1; s < size_; ++s) {
    const int dst = (rank_ + s) % size_, src = (rank_ - s + size_) % size_;
    const Block& out = to[static_cast<size_t>(dst)];
    const MutableBlock& in = from[static_cast<size_t>(src)];
    const size_t n_out = pieces(out.bytes), n_in = pieces(in.bytes);
    for (size_t j = 0; j < std::max(n_out, n_in); ++j) {
      const size_t off = j * kPieceBytes;
      if (j < n_out) {
        t_.send_stable(dst, Channel::kExchange, user(out.data, out.bytes), off, std::min(kPieceBytes, out.bytes - off),
                       off, deadline);
      }
      if (j < n_in) {
        t_.recv(src, Channel::kExchange, user(in.data, in.bytes), off, std::min(kPieceBytes, in.bytes - off),
                deadline);
      }
    }
  }
  t_.wait_sends(deadline);
}

void VectorCollectives::all_to_all_v(const void* in, void* out, std::span<const size_t> send_bytes,
                                     std::span<const size_t> recv_bytes, Clock::time_point deadline) {
  const auto so = offsets_of(send_bytes), ro = offsets_of(recv_bytes);
  const size_t in_total = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
  const size_t out_total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
  const auto* src = static_cast<const unsigned char*>(aside(in, in_total, out, out_total));
  auto* dst = static_cast<unsigned char*>(out);
  std::vector<Block> to(static_cast<size_t>(size_));
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  for (size_t p = 0; p < to.size(); ++p) {
    to[p] = {src + so[p], send_bytes[p]};
    from[p] = {dst + ro[p], recv_bytes[p]};
  }
  exchange(to, from, deadline);
}

void VectorCollectives::all_gather_v(const void* in, void* out, std::span<const size_t> bytes,
                                     Clock::time_point deadline) {
  const auto off = offsets_of(bytes);
  const size_t mine = bytes[static_cast<size_t>(rank_)];
  std::vector<Block> to(static_cast<size_t>(size_), Block{in, mine});
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  for (size_t p = 0; p < from.size(); ++p) from[p] = {static_cast<unsigned char*>(out) + off[p], bytes[p]};
  exchange(to, from, deadline);
}

void VectorCollectives::all_gather_list(const void* in, std::span<void* const> outs, size_t bytes,
                                        Clock::time_point deadline) {
  // The input may be one of the outputs (in place): keep it apart.
  const void* src = in;
  for (void* o : outs) src = src == in ? aside(in, bytes, o, bytes) : src;
  std::vector<Block> to(static_cast<size_t>(size_), Block{src, bytes});
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  for (size_t p = 0; p < from.size(); ++p) from[p] = {outs[p], bytes};
  exchange(to, from, deadline);
}

void VectorCollectives::reduce_scatter_v(const void* in, void* out, std::span<const size_t> counts, size_t es,
                                         ReduceFn fn, Clock::time_point deadline) {
  std::vector<size_t> send_bytes(counts.size());
  for (size_t p = 0; p < counts.size(); ++p) send_bytes[p] = counts[p] * es;
  const size_t mine = send_bytes[static_cast<size_t>(rank_)];
  if (scratch_.size() < mine * static_cast<size_t>(size_)) scratch_.resize(mine * static_cast<size_t>(size_));
  std::vector<size_t> recv_bytes(static_cast<size_t>(size_), mine);
  all_to_all_v(in, scratch_.data(), send_bytes, recv_bytes, deadline);
  if (!mine) return;
  const size_t n = counts[static_cast<size_t>(rank_)];
  // Rank order: rank 0's block first, as every backend's reference does.
  std::memcpy(out, scratch_.data(), mine);
  for (int r = 1; r < size_; ++r) fn(out, out, scratch_.data() + static_cast<size_t>(r) * mine, n);
}

void VectorCollectives::gather(const void* in, void* out, size_t bytes, int root, Clock::time_point deadline) {
  std::vector<Block> to(static_cast<size_t>(size_));
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  to[static_cast<size_t>(root)] = {in, bytes};
  if (rank_ == root) {
    for (size_t p = 0; p < from.size(); ++p) from[p] = {static_cast<unsigned char*>(out) + p * bytes, bytes};
  }
  exchange(to, from, deadline);
}

void VectorCollectives::scatter(const void* in, void* out, size_t bytes, int root, Clock::time_point deadline) {
  std::vector<Block> to(static_cast<size_t>(size_));
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  if (rank_ == root) {
    for (size_t p = 0; p < to.size(); ++p) to[p] = {static_cast<const unsigned char*>(in) + p * bytes, bytes};
  }
  from[static_cast<size_t>(root)] = {out, bytes};
  exchange(to, from, deadline);
}

void VectorCollectives::broadcast(void* data, size_t bytes, int root, Clock::time_point deadline) {
  std::vector<Block> to(static_cast<size_t>(size_));
  std::vector<MutableBlock> from(static_cast<size_t>(size_));
  if (rank_ == root) std::fill(to.begin(), to.end(), Block{data, bytes});
  from[static_cast<size_t>(root)] = {data, rank_ == root ? 0 : bytes};
  if (rank_ == root) to[static_cast<size_t>(root)] = {};
  exchange(to, from, deadline);
}

}  // namespace comms::cpu_algorithms
