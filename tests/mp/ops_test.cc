// Every op x dtype x reduce op over Gloo, run under commsrun at several world
// sizes. Each rank checks its results against closed-form expectations:
// exactly for integers and bool, within a dtype tolerance for floating types
// (the oracle of tests/support/op_oracle.h, shared with the conformance suite).
// Checks use EXPECT (never ASSERT) so every rank issues the same collectives
// even after a failure.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "comms/comms.h"
#include "comms/numeric.h"
#include "op_oracle.h"

namespace comms {
namespace {

std::shared_ptr<Comm>& world() {
  static std::shared_ptr<Comm> w = new_comm("cpu:gloo", Device::cpu(), "world");
  return w;
}

using oracle::data_value;
using oracle::expected_reduction;
using oracle::reduce_input;

// A typed byte buffer.
struct Buf {
  DataType dtype;
  std::vector<uint8_t> bytes;
  Buf(DataType t, size_t n) : dtype(t), bytes(n * element_size(t) + 1) {}  // +1: never empty
  size_t count() const { return (bytes.size() - 1) / element_size(dtype); }
  BufferView view() { return {bytes.data(), count(), dtype, Device::cpu()}; }
  BufferView view(size_t offset, size_t n) {
    return {bytes.data() + offset * element_size(dtype), n, dtype, Device::cpu()};
  }
  double get(size_t i) const { return numeric::load_as_double(bytes.data(), dtype, i); }
  void set(size_t i, double v) { oracle::store(bytes.data(), dtype, i, v); }
};

// Reports the first mismatch with everything needed to find it.
void expect_values(const Buf& got, size_t offset, size_t n, const std::string& what,
                   const std::function<double(size_t)>& expect) {
  for (size_t i = 0; i < n; ++i) {
    // Round the expectation to the type so exact types compare exactly.
    const double want = oracle::round_to(got.dtype, expect(i));
    const double have = got.get(offset + i);
    if (!oracle::matches(got.dtype, want, have)) {
      ADD_FAILURE() << "rank " << world()->rank() << " " << what << " dtype " << to_string(got.dtype)
                    << ": first mismatch at index " << i << ": expected " << want << ", got " << have;
      return;
    }
  }
}

std::string label(const char* op, const ReduceOp& r, size_t count, bool in_place, int root = -1) {
  std::string s = std::string(op) + " redop " + to_string(r) + " count " + std::to_string(count) +
                  (in_place ? " in-place" : " out-of-place");
  if (root >= 0) s += " root " + std::to_string(root);
  return s;
}

TEST(Ops, AllReduceEveryDtypeAndReduceOpInAndOutOfPlace) {
  auto& w = *world();
  for (DataType t : oracle::all_data_types()) {
    for (const ReduceOp& op : oracle::reductions_for(t)) {
      for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
        for (bool in_place : {true, false}) {
          Buf in(t, count), out(t, count);
          for (size_t i = 0; i < count; ++i) in.set(i, reduce_input(t, op.kind, w.rank(), i));
          if (in_place) w.all_reduce(in.view(), op);
          else w.all_reduce(in.view(), out.view(), op);
          expect_values(in_place ? in : out, 0, count, label("all_reduce", op, count, in_place),
                        [&](size_t i) { return expected_reduction(t, op, w.size(), i); });
          if (!in_place) {
            expect_values(in, 0, count, "all_reduce left its input intact",
                          [&](size_t i) { return reduce_input(t, op.kind, w.rank(), i); });
          }
        }
      }
    }
  }
}

TEST(Ops, ReduceToEveryRoot) {
  auto& w = *world();
  for (DataType t : oracle::all_data_types()) {
    for (const ReduceOp& op : oracle::reductions_for(t)) {
      for (int root = 0; root < w.size(); ++root) {
        const size_t count = 5;
        Buf in(t, count), out(t, count);
        for (size_t i = 0; i < count; ++i) in.set(i, reduce_input(t, op.kind, w.rank(), i));
        w.reduce(in.view(), out.view(), root, op);
        if (w.rank() == root) {
          expect_values(out, 0, count, label("reduce", op, count, false, root),
                        [&](size_t i) { return expected_reduction(t, op, w.size(), i); });
        }
      }
    }
  }
}

TEST(Ops, BroadcastFromEveryRoot) {
  auto& w = *world();
  for (DataType t : oracle::all_data_types()) {
    for (int root = 0; root < w.size(); ++root) {
      for (size_t count : {size_t(1), size_t(33)}) {
        Buf b(t, count);
        for (size_t i = 0; i < count; ++i) b.set(i, data_value(t, w.rank(), i));
        w.broadcast(b.view(), root);
        expect_values(b, 0, count, label("broadcast", ReduceOp(), count, true, root),
                      [&](size_t i) { return data_value(t, root, i); });
      }
    }
  }
}

TEST(Ops, AllGatherContiguousListAndInPlace) {
  auto& w = *world();
  const int n = w.size();
  for (DataType t : oracle::all_data_types()) {
    for (size_t count : {size_t(0), size_t(1), size_t(9)}) {
      Buf in(t, count), out(t, count * n);
      for (size_t i = 0; i < count; ++i) in.set(i, data_value(t, w.rank(), i));
      w.all_gather(in.view(), out.view());
      auto expect = [&](size_t j) { return data_value(t, int(j / std::max<size_t>(count, 1)), j % std::max<size_t>(count, 1)); };
      expect_values(out, 0, count * n, label("all_gather", ReduceOp(), count, false), expect);

      Buf inplace(t, count * n);
      for (size_t i = 0; i < count; ++i) inplace.set(w.rank() * count + i, data_value(t, w.rank(), i));
      w.all_gather(inplace.view(w.rank() * count, count), inplace.view());
      expect_values(inplace, 0, count * n, label("all_gather", ReduceOp(), count, true), expect);

      std::vector<Buf> parts;
      for (int r = 0; r < n; ++r) parts.emplace_back(t, count);
      std::vector<BufferView> views;
      for (auto& p : parts) views.push_back(p.view());
      w.all_gather(in.view(), views);
      for (int r = 0; r < n; ++r) {
        expect_values(parts[r], 0, count, "all_gather list part " + std::to_string(r),
                      [&](size_t i) { return data_value(t, r, i); });
      }
    }
  }
}

TEST(Ops, AllGatherVWithUnequalCounts) {
  auto& w = *world();
  const int n = w.size();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = size_t(r % 3 == 1 ? 0 : r + 2);  // includes zero-sized ranks
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  for (DataType t : oracle::all_data_types()) {
    Buf in(t, counts[w.rank()]), out(t, total);
    for (size_t i = 0; i < counts[w.rank()]; ++i) in.set(i, data_value(t, w.rank(), i));
    w.all_gather_v(in.view(), out.view(), counts);
    size_t offset = 0;
    for (int r = 0; r < n; ++r) {
      expect_values(out, offset, counts[r], "all_gather_v block of rank " + std::to_string(r),
                    [&](size_t i) { return data_value(t, r, i); });
      offset += counts[r];
    }
  }
}

TEST(Ops, ReduceScatterEveryReduceOpInAndOutOfPlace) {
  auto& w = *world();
  const int n = w.size();
  for (DataType t : oracle::all_data_types()) {
    for (const ReduceOp& op : oracle::reductions_for(t)) {
      for (bool in_place : {false, true}) {
        const size_t count = 6;
        Buf in(t, count * n), out(t, count);
        // Block b of every rank holds reduce_input(t, op.kind, r, b * count + i).
        for (size_t j = 0; j < count * n; ++j) in.set(j, reduce_input(t, op.kind, w.rank(), j));
        BufferView output = in_place ? in.view(w.rank() * count, count) : out.view();
        w.reduce_scatter(in.view(), output, op);
        expect_values(in_place ? in : out, in_place ? w.rank() * count : 0, count,
                      label("reduce_scatter", op, count, in_place),
                      [&](size_t i) { return expected_reduction(t, op, n, w.rank() * count + i); });
      }
    }
  }
}

TEST(Ops, ReduceScatterVWithUnequalCounts) {
  auto& w = *world();
  const int n = w.size();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = size_t(r + 1);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  size_t my_offset = 0;
  for (int r = 0; r < w.rank(); ++r) my_offset += counts[r];
  for (DataType t : {DataType::kInt32, DataType::kFloat32, DataType::kBfloat16, DataType::kUint8}) {
    for (const ReduceOp& op : {ReduceOp::sum(), ReduceOp::max(), ReduceOp::avg()}) {
      Buf in(t, total), out(t, counts[w.rank()]);
      for (size_t j = 0; j < total; ++j) in.set(j, reduce_input(t, op.kind, w.rank(), j));
      w.reduce_scatter_v(in.view(), out.view(), counts, op);
      expect_values(out, 0, counts[w.rank()], label("reduce_scatter_v", op, counts[w.rank()], false),
                    [&](size_t i) { return expected_reduction(t, op, n, my_offset + i); });
    }
  }
}

TEST(Ops, AllToAllInAndOutOfPlace) {
  auto& w = *world();
  const int n = w.size();
  for (DataType t : oracle::all_data_types()) {
    for (bool in_place : {false, true}) {
      const size_t count = 3;
      Buf in(t, count * n), out(t, count * n);
      // Block b sent by rank r holds 10*r + b + i (mod type) - distinct per sender.
      auto sent = [&](int r, size_t b, size_t i) {
        return t == DataType::kBool ? double((r + b + i) % 2) : double((r * 4 + b + i) % 13 + 1);
      };
      for (int b = 0; b < n; ++b)
        for (size_t i = 0; i < count; ++i) in.set(b * count + i, sent(w.rank(), b, i));
      if (in_place) w.all_to_all(in.view(), in.view());
      else w.all_to_all(in.view(), out.view());
      expect_values(in_place ? in : out, 0, count * n, label("all_to_all", ReduceOp(), count, in_place),
                    [&](size_t j) { return sent(int(j / count), w.rank(), j % count); });
    }
  }
}

TEST(Ops, AllToAllVWithUnequalSplits) {
  auto& w = *world();
  const int n = w.size();
  // Rank r sends (r + p) % 3 elements to rank p.
  auto amount = [&](int from, int to) { return size_t((from + to) % 3); };
  std::vector<size_t> send(n), recv(n);
  for (int p = 0; p < n; ++p) {
    send[p] = amount(w.rank(), p);
    recv[p] = amount(p, w.rank());
  }
  const size_t send_total = std::accumulate(send.begin(), send.end(), size_t(0));
  const size_t recv_total = std::accumulate(recv.begin(), recv.end(), size_t(0));
  for (DataType t : {DataType::kInt64, DataType::kFloat32, DataType::kFloat16, DataType::kInt8}) {
    Buf in(t, send_total), out(t, recv_total);
    size_t k = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < send[p]; ++i) in.set(k++, double(w.rank() * 10 + p * 3 + int(i)));
    w.all_to_all_v(in.view(), send, out.view(), recv);
    size_t offset = 0;
    for (int p = 0; p < n; ++p) {
      expect_values(out, offset, recv[p], "all_to_all_v block from rank " + std::to_string(p),
                    [&](size_t i) { return double(p * 10 + w.rank() * 3 + int(i)); });
      offset += recv[p];
    }
  }
}

TEST(Ops, GatherAndScatterWithEveryRoot) {
  auto& w = *world();
  const int n = w.size();
  for (DataType t : {DataType::kFloat64, DataType::kInt32, DataType::kBool, DataType::kFloat8E5M2}) {
    for (int root = 0; root < n; ++root) {
      const size_t count = 4;
      Buf in(t, count), out(t, count * n);
      for (size_t i = 0; i < count; ++i) in.set(i, data_value(t, w.rank(), i));
      w.gather(in.view(), out.view(), root);
      if (w.rank() == root) {
        expect_values(out, 0, count * n, label("gather", ReduceOp(), count, false, root),
                      [&](size_t j) { return data_value(t, int(j / count), j % count); });
      }
      Buf src(t, count * n), dst(t, count);
      if (w.rank() == root)
        for (size_t j = 0; j < count * n; ++j) src.set(j, data_value(t, int(j / count), j % count + 1));
      w.scatter(src.view(), dst.view(), root);
      expect_values(dst, 0, count, label("scatter", ReduceOp(), count, false, root),
                    [&](size_t i) { return data_value(t, w.rank(), i + 1); });
    }
  }
}

TEST(Ops, SendRecvAroundTheRingAndBatchedExchange) {
  auto& w = *world();
  const int n = w.size();
  if (n < 2) GTEST_SKIP() << "point-to-point needs at least 2 ranks";
  const int next = (w.rank() + 1) % n, prev = (w.rank() + n - 1) % n;
  std::vector<int64_t> out(17), in(17);
  for (size_t i = 0; i < out.size(); ++i) out[i] = w.rank() * 1000 + int64_t(i);
  // Even ranks send first: a blocking ring must not deadlock.
  OpOptions tagged;
  tagged.tag = 7;
  if (w.rank() % 2 == 0) {
    w.send(BufferView::of(out), next, tagged);
    w.recv(BufferView::of(in), prev, tagged);
  } else {
    w.recv(BufferView::of(in), prev, tagged);
    w.send(BufferView::of(out), next, tagged);
  }
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i], prev * 1000 + int64_t(i)) << "rank " << w.rank() << " index " << i;

  std::vector<float> to_next(5), to_prev(5), from_prev(5), from_next(5);
  for (int i = 0; i < 5; ++i) {
    to_next[i] = float(w.rank() + i);
    to_prev[i] = float(-w.rank() - i);
  }
  std::vector<P2POp> batch = {P2POp::send(BufferView::of(to_next), next, 1), P2POp::send(BufferView::of(to_prev), prev, 2),
                              P2POp::recv(BufferView::of(from_prev), prev, 1), P2POp::recv(BufferView::of(from_next), next, 2)};
  w.batch_p2p(batch);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(from_prev[i], float(prev + i)) << "rank " << w.rank() << " batch recv from prev index " << i;
    EXPECT_EQ(from_next[i], float(-next - i)) << "rank " << w.rank() << " batch recv from next index " << i;
  }
}

TEST(Ops, SeveralAsyncOpsInFlightCompleteInOrder) {
  auto& w = *world();
  std::vector<std::vector<int32_t>> bufs(6, std::vector<int32_t>(64));
  std::vector<Work> works;
  OpOptions async;
  async.async = true;
  for (size_t k = 0; k < bufs.size(); ++k) {
    for (size_t i = 0; i < 64; ++i) bufs[k][i] = int32_t(w.rank() + k + i);
    works.push_back(w.all_reduce(BufferView::of(bufs[k]), ReduceOp::sum(), async));
  }
  std::vector<int32_t> g(8);
  works.push_back(w.broadcast(BufferView::of(g), 0, async));
  for (auto& work : works) work.wait();
  for (auto& work : works) {
    EXPECT_TRUE(work.is_completed());
    EXPECT_EQ(work.status(), ErrorCode::kOk);
  }
  const int n = w.size();
  for (size_t k = 0; k < bufs.size(); ++k) {
    for (size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(bufs[k][i], int32_t(n * (k + i) + n * (n - 1) / 2)) << "rank " << w.rank() << " async op " << k << " index " << i;
    }
  }
  w.barrier();
}

// Gloo sizes a socket's send buffer from the first message that outgrows it
// and then stops the kernel from autotuning it. With an 8-byte broadcast
// first, the buffer stayed ~4.6 KiB and every later 4 KiB all_reduce waited
// for a delayed ACK (8-44 ms per op). The backend sizes every pair of both
// meshes at connect; a tiny first message must not undo that.
TEST(Ops, ATinyFirstMessageLeavesEverySocketRoomForTheSyncPath) {
  auto& w = *world();
  if (w.size() == 1) GTEST_SKIP() << "no peers, no sockets";
  std::vector<int> everyone(w.size());
  std::iota(everyone.begin(), everyone.end(), 0);
  auto fresh = w.split(everyone, "tiny-first");  // a new mesh whose first op is tiny
  int32_t two[2] = {w.rank(), 7};
  fresh->broadcast(BufferView::of(two, 2), 0);
  std::vector<float> x(1024, 1.0f), y(1024);
  fresh->all_reduce(BufferView::of(x), BufferView::of(y), ReduceOp::sum());
  EXPECT_EQ(y[0], float(w.size()));

  long wmem_max = 256 * 1024;
  if (FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
    if (std::fscanf(f, "%ld", &wmem_max) != 1) wmem_max = 256 * 1024;
    std::fclose(f);
  }
  const int want = int(2 * std::min<long>(256 * 1024, wmem_max));  // the kernel doubles what was set
  // The store's port: commsrun's is in COMMS_STORE (tcp://host:port), a hand-launched rank 0's at MASTER_PORT.
  int store_port = std::getenv("MASTER_PORT") ? std::atoi(std::getenv("MASTER_PORT")) : 0;
  if (const char* url = std::getenv("COMMS_STORE"); url && std::strchr(url, ':')) {
    store_port = std::atoi(std::strrchr(url, ':') + 1);
  }
  int gloo_sockets = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0, sndbuf = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_in peer{};
    socklen_t plen = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0 || peer.sin_family != AF_INET) continue;
    if (ntohs(peer.sin_port) == store_port) continue;  // the store's connection
    len = sizeof sndbuf;
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);
    EXPECT_GE(sndbuf, want) << "socket " << fd << " to port " << ntohs(peer.sin_port);
    ++gloo_sockets;
  }
  // Both meshes of both comms: 4 connections per peer.
  EXPECT_GE(gloo_sockets, 4 * (w.size() - 1));
  // Nobody finalizes before everyone counted: a peer's close makes Gloo's
  // event loop here close our end.
  w.barrier();
  fresh->finalize();
}

// Large all_reduce runs a pipelined ring; every element is reduced once and
// then gathered, so every rank must hold the same bits, and the values must
// match the sum however the pieces and segments fall (the count is prime).
TEST(Ops, LargeAllReduceGivesEveryRankTheSameBits) {
  auto& w = *world();
  const size_t count = 1000003;
  auto f = [](int r, size_t i) { return float(std::sin(0.37 * double(i) + 1.3 * r) * 100.0); };
  for (bool in_place : {false, true}) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = f(w.rank(), i);
    if (in_place) w.all_reduce(BufferView::of(in), ReduceOp::sum());
    else w.all_reduce(BufferView::of(in), BufferView::of(out), ReduceOp::sum());
    const std::vector<float>& got = in_place ? in : out;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < w.size(); ++r) want += f(r, i);
      if (std::fabs(got[i] - want) > 1e-4 * (std::fabs(want) + 1)) {
        if (!bad++) first_bad = i;
      }
    }
    EXPECT_EQ(bad, 0u) << (in_place ? "in-place" : "out-of-place") << ": first wrong index " << first_bad;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a of the result's bytes
    const auto* p = reinterpret_cast<const uint8_t*>(got.data());
    for (size_t i = 0; i < count * sizeof(float); ++i) hash = (hash ^ p[i]) * 1099511628211ull;
    std::vector<uint64_t> hashes(w.size());
    w.all_gather(BufferView::of(&hash, 1), BufferView::of(hashes));
    for (int r = 0; r < w.size(); ++r) EXPECT_EQ(hashes[r], hash) << "rank " << r << " holds other bits";
  }
}

// Gloo's writev(2) cannot pass MSG_NOSIGNAL: with SIGPIPE at its default, a
// write to a connection the peer (or abort) shut down kills the process
// instead of failing the op. commsrun starts ranks with the default.
TEST(Ops, AGlooCommIgnoresSigpipeLeftAtItsDefault) {
  world();
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST(Ops, BadArgumentsFailOnlyTheCallerAndTheCommStaysUsable) {
  auto& w = *world();
  std::vector<float> x(4, 1.0f), y(3);
  try {
    w.all_reduce(BufferView::of(x), BufferView::of(y), ReduceOp::sum());
    ADD_FAILURE() << "mismatched counts accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.comm(), "world");
    EXPECT_EQ(e.rank(), w.rank());
    EXPECT_GT(e.seq(), 0u);
    EXPECT_NE(std::string(e.what()).find("all_reduce #"), std::string::npos) << e.what();
  }
  try {
    w.broadcast(BufferView::of(x), w.size());
    ADD_FAILURE() << "root out of range accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  try {
    w.all_reduce(BufferView::of(x), ReduceOp::band());
    ADD_FAILURE() << "band on float accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  w.all_reduce(BufferView::of(x), ReduceOp::sum());
  for (float v : x) EXPECT_EQ(v, float(w.size()));
}

TEST(Split, BothFormsGiveGroupsThatComputeCorrectly) {
  auto& w = *world();
  const int n = w.size();
  // split: reversed order of all ranks.
  std::vector<int> reversed(n);
  for (int r = 0; r < n; ++r) reversed[r] = n - 1 - r;
  auto rev = w.split(reversed, "reversed");
  ASSERT_TRUE(rev);
  EXPECT_EQ(rev->size(), n);
  EXPECT_EQ(rev->rank(), n - 1 - w.rank());
  int32_t v = rev->rank();
  rev->all_reduce(BufferView::of(&v, 1), ReduceOp::sum());
  EXPECT_EQ(v, n * (n - 1) / 2);

  // split_group: odd and even ranks.
  std::vector<std::vector<int>> groups(2);
  for (int r = 0; r < n; ++r) groups[r % 2].push_back(r);
  if (groups[1].empty()) groups.pop_back();
  auto parity = w.split_group(groups, "parity");
  ASSERT_TRUE(parity);
  const auto& mine = groups[w.rank() % 2];
  EXPECT_EQ(parity->size(), int(mine.size()));
  int64_t sum = w.rank();
  parity->all_reduce(BufferView::of(&sum, 1), ReduceOp::sum());
  EXPECT_EQ(sum, std::accumulate(mine.begin(), mine.end(), int64_t(0))) << "rank " << w.rank();

  // split with non-members: a group without rank 0, then two levels deep.
  std::vector<int> tail;
  for (int r = 1; r < n; ++r) tail.push_back(r);
  auto t = w.split(w.rank() == 0 ? std::vector<int>{} : tail, "tail");
  EXPECT_EQ(bool(t), w.rank() != 0);
  if (t) {
    std::vector<int> first = {0};
    auto single = t->split(t->rank() == 0 ? first : std::vector<int>{}, "tail-first");
    EXPECT_EQ(bool(single), t->rank() == 0);
    if (single) {
      float one = 3.0f;
      single->all_reduce(BufferView::of(&one, 1), ReduceOp::sum());
      EXPECT_EQ(one, 3.0f);
    }
    int32_t c = 1;
    t->all_reduce(BufferView::of(&c, 1), ReduceOp::sum());
    EXPECT_EQ(c, n - 1);
  }
  w.barrier();
}

TEST(Split, BadRankListsFailClearlyBeforeAnythingIsSent) {
  auto& w = *world();
  std::vector<int> dup = {w.rank(), w.rank()};
  try {
    w.split(dup, "dup");
    ADD_FAILURE() << "duplicate ranks accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
  }
  std::vector<int> outside = {w.rank(), w.size()};
  try {
    w.split(outside, "outside");
    ADD_FAILURE() << "rank outside the parent accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the parent"), std::string::npos) << e.what();
  }
  try {
    SplitOptions cuda_only;
    cuda_only.backend = "cuda:nccl";
    w.split(std::vector<int>{}, "cpu-only", cuda_only);
    ADD_FAILURE() << "a device the parent lacks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Requested backend for device 'cuda' is not present in the parent group (parent backends: cpu:gloo)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace comms
