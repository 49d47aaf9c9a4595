#include "put_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend_buffer.h"
#include "comms/comms.h"
#include "util/strutil.h"

namespace comms::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

struct Pair {
  Comm& comm;
  Window& window;
  int peer;
  bool first;  // the even rank: starts each ping-pong
};

// Every rank's per-iteration times, combined by taking each iteration's
// slowest rank, then the p-th percentile.
double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * double(v.size())))];
}

void slowest_over_ranks(Comm& comm, std::vector<double>& times) {
  comm.all_reduce(BufferView::of(times), ReduceOp::max());
}

// One ping-pong: half its round trip, in microseconds.
double ping_pong_put(Pair& p, BufferView src) {
  const auto t0 = Clock::now();
  if (p.first) {
    p.window.put(src, p.peer, 0, true);
    p.window.wait_signal(p.peer, 1);
  } else {
    p.window.wait_signal(p.peer, 1);
    p.window.put(src, p.peer, 0, true);
  }
  return us_since(t0) / 2;
}

double ping_pong_send_recv(Pair& p, BufferView src, BufferView dst) {
  const auto t0 = Clock::now();
  if (p.first) {
    p.comm.send(src, p.peer);
    p.comm.recv(dst, p.peer);
  } else {
    p.comm.recv(dst, p.peer);
    p.comm.send(src, p.peer);
  }
  return us_since(t0) / 2;
}

// `iters` transfers from the first rank, then a reply: microseconds per transfer.
double stream_puts(Pair& p, BufferView src, int iters) {
  const auto t0 = Clock::now();
  if (p.first) {
    for (int i = 0; i < iters; ++i) p.window.put(src, p.peer, 0, i == iters - 1);
    p.window.wait_signal(p.peer, 1);
  } else {
    p.window.wait_signal(p.peer, 1);
    p.window.signal(p.peer);
  }
  return us_since(t0) / iters;
}

double stream_sends(Pair& p, BufferView src, BufferView dst, BufferView ack, int iters) {
  const auto t0 = Clock::now();
  if (p.first) {
    for (int i = 0; i < iters; ++i) p.comm.send(src, p.peer);
    p.comm.recv(ack, p.peer);
  } else {
    for (int i = 0; i < iters; ++i) p.comm.recv(dst, p.peer);
    p.comm.send(ack, p.peer);
  }
  return us_since(t0) / iters;
}

// Bytes of `got` that differ from the first rank's pattern.
int64_t wrong_bytes(const uint8_t* got, size_t bytes, int from) {
  int64_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += got[i] != uint8_t(i * 31 + size_t(from));
  return wrong;
}

void print_row(const char* mode, size_t bytes, double p50, double p99, double per_op_us, int64_t wrong) {
  const double algbw = per_op_us > 0 ? double(bytes) / per_op_us / 1e3 : 0;
  std::printf(" %12zu %14s %10.2f %10.2f %10.3f %7lld\n", bytes, mode, p50, p99, algbw, static_cast<long long>(wrong));
  std::fflush(stdout);
}

void check_flags(const Flags& f, Comm& comm) {
  if (comm.size() % 2) bad_flag("-C put", str::cat(" pairs ranks r and r ^ 1; this job has ", comm.size(), " ranks"));
  if (!has_windows(comm, DeviceType::kCpu)) {
    bad_flag("-C put", str::cat(" needs a backend with windows (has_windows); '", comm.backend_string(),
                                "' has none: give e.g. --backend cpu:ucx"));
  }
  const bool other = f.device_name != "cpu" || f.has_raw() || f.floor || f.graph || !f.json_path.empty() ||
                     f.inplace || f.outofplace || f.average != int(Average::kMax);
  if (other) {
    bad_flag("-C put", " times CPU buffers through comms alone, rows printed only: it takes none of --device, the "
                       "baselines, --floor, --graph, --json, --inplace/--outofplace and -a");
  }
}

}  // namespace

int run_put_bench(const Flags& f, std::shared_ptr<Comm> comm) {
  check_flags(f, *comm);
  const size_t lo = parse_size(f.min_size, "-b/--minbytes"), hi = std::max(lo, parse_size(f.max_size, "-e/--maxbytes"));
  const size_t step = parse_size(f.step_bytes, "-i/--stepbytes");
  check_range(f.min_size, f.max_size, lo, hi, 1, "bytes");
  int32_t plan[2] = {f.iters, f.warmup};  // rank 0's rule
  comm->broadcast(BufferView::of(plan, 2), 0);
  const int iters = plan[0], warmup = plan[1];
  const size_t most = std::max<size_t>(hi, 1);
  // -R 1: the three buffers from the comm's allocator, registered.
  std::vector<uint8_t> plain(f.local_register ? 0 : 3 * most), ack(1);
  BackendBuffer registered[3];
  uint8_t* buffers[3];
  for (int b = 0; b < 3; ++b) {
    if (f.local_register) registered[b] = BackendBuffer(comm, most);
    buffers[b] = f.local_register ? registered[b].data() : plain.data() + size_t(b) * most;
  }
  uint8_t *src = buffers[0], *dst = buffers[1], *inbox = buffers[2];
  const int me = comm->rank();
  for (size_t i = 0; i < most; ++i) src[i] = uint8_t(i * 31 + size_t(me));
  Window window = register_window(*comm, BufferView{inbox, most, DataType::kUint8});
  Pair pair{*comm, window, me ^ 1, me % 2 == 0};
  if (me == 0) {
    std::printf("# comms-bench put, %d ranks (pairs r, r^1), backend %s, cpu buffers%s, %d iterations (%d warm-up)\n",
                comm->size(), comm->backend_string().c_str(),
                f.local_register ? " from the comm's allocator, registered (-R 1)" : "", iters, warmup);
    std::printf("# lat: half a ping-pong's round trip (p50, p99 of the slowest rank); bw: %d transfers in a row\n",
                iters);
    std::printf("#%12s %14s %10s %10s %10s %7s\n", "size(B)", "mode", "p50(us)", "p99(us)", "algbw", "#wrong");
  }
  int64_t total_wrong = 0;
  for (size_t bytes = lo; bytes <= hi;) {
    const BufferView s{src, bytes, DataType::kUint8}, d{dst, bytes, DataType::kUint8};
    std::vector<double> put_lat(static_cast<size_t>(iters)), sr_lat(static_cast<size_t>(iters));
    for (int i = 0; i < warmup; ++i) ping_pong_put(pair, s), ping_pong_send_recv(pair, s, d);
    for (int i = 0; i < iters; ++i) {  // alternating: both see the same machine
      put_lat[static_cast<size_t>(i)] = ping_pong_put(pair, s);
      sr_lat[static_cast<size_t>(i)] = ping_pong_send_recv(pair, s, d);
    }
    slowest_over_ranks(*comm, put_lat);
    slowest_over_ranks(*comm, sr_lat);
    std::vector<double> bw(4, 0);
    std::fill(inbox, inbox + most, 0);
    std::fill(dst, dst + most, 0);
    comm->barrier();
    stream_puts(pair, s, std::max(1, warmup));
    bw[0] = stream_puts(pair, s, iters);
    stream_sends(pair, s, d, BufferView::of(ack), std::max(1, warmup));
    bw[1] = stream_sends(pair, s, d, BufferView::of(ack), iters);
    std::vector<double> wrong(2, 0);
    if (!pair.first) {
      wrong[0] = double(wrong_bytes(inbox, bytes, pair.peer));
      wrong[1] = double(wrong_bytes(dst, bytes, pair.peer));
    }
    comm->all_reduce(BufferView::of(bw), ReduceOp::max());
    comm->all_reduce(BufferView::of(wrong), ReduceOp::sum());
    total_wrong += int64_t(wrong[0] + wrong[1]);
    if (me == 0) {
      print_row("put lat", bytes, percentile(put_lat, 0.5), percentile(put_lat, 0.99), percentile(put_lat, 0.5), 0);
      print_row("send_recv lat", bytes, percentile(sr_lat, 0.5), percentile(sr_lat, 0.99), percentile(sr_lat, 0.5), 0);
      print_row("put bw", bytes, bw[0], bw[0], bw[0], int64_t(wrong[0]));
      print_row("send_recv bw", bytes, bw[1], bw[1], bw[1], int64_t(wrong[1]));
    }
    const double grown = step ? double(bytes) + double(step) : std::ceil(double(std::max<size_t>(bytes, 1)) * f.factor);
    if (grown > double(hi)) break;
    bytes = static_cast<size_t>(grown);
  }
  if (me == 0) std::printf("# %s wrong results\n", total_wrong ? "SOME" : "no");
  comm->barrier();
  window.deregister();
  return total_wrong ? 1 : 0;
}

}  // namespace comms::bench
