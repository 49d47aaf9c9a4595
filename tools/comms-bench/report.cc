#include "report.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

namespace comms::bench {

void print_header(const Flags& flags, const RunInfo& run) {
  std::printf("# comms-bench %s, %d ranks, backend %s, %s buffers%s, %d iterations (%d warm-up)\n", run.op->name,
              run.ranks, run.backend.c_str(), run.where.c_str(),
              flags.gloo_native              ? " (Gloo's own algorithms, without libcomms)"
              : flags.overhead && run.cuda   ? " (comms and raw NCCL, same config and stream, alternating)"
              : flags.overhead               ? " (comms and raw Gloo, same algorithm, alternating)"
              : flags.raw_nccl               ? " (raw NCCL: the same calls without libcomms)"
              : run.has_raw_gloo             ? " (raw Gloo: the backend's algorithm without libcomms)"
                                             : "",
              run.iters, run.warmup);
  if (flags.overhead) {
    std::printf("#%12s %12s %9s %8s %13s %10s %10s %12s %12s %12s %7s  %s\n", "size(B)", "count", "type", "redop",
                "placement", "time(us)", "p50(us)", "raw p50(us)", "overhead(us)", "overhead(%)", "#wrong",
                "algorithm");
  } else {
    std::printf("#%12s %12s %9s %8s %13s %10s %10s %10s %10s %10s %7s  %s\n", "size(B)", "count", "type", "redop",
                "placement", "time(us)", "p50(us)", "p99(us)", "algbw", "busbw", "#wrong", "algorithm");
  }
}

void print_row(const Flags& flags, const Row& r) {
  if (flags.overhead) {
    std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %12.2f %12.2f %12.2f %7lld  %s\n", r.bytes, r.count,
                r.dtype.c_str(), r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.raw_p50_us,
                r.p50_us - r.raw_p50_us, 100.0 * (r.p50_us - r.raw_p50_us) / r.raw_p50_us,
                static_cast<long long>(r.wrong), r.algorithm.c_str());
  } else {
    std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %10.2f %10.3f %10.3f %7lld  %s\n", r.bytes, r.count,
                r.dtype.c_str(), r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.p99_us, r.algbw,
                r.busbw, static_cast<long long>(r.wrong), r.algorithm.c_str());
  }
  std::fflush(stdout);
}

void write_json(const Flags& flags, const RunInfo& run, const std::vector<Row>& rows) {
  const bool cuda = run.cuda;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    out.push_back({{"op", r.op}, {"bytes", r.bytes}, {"count", r.count}, {"dtype", r.dtype}, {"redop", r.redop},
                   {"placement", r.placement}, {"time_us", r.mean_us}, {"p50_us", r.p50_us},
                   {"p99_us", r.p99_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}, {"wrong", r.wrong},
                   {"ranks", run.ranks}, {"root", flags.root}, {"average", flags.average},
                   {"device", flags.device_name}, {"raw_gloo", r.raw && !cuda},
                   {"raw_nccl", r.raw && cuda},
                   {"baseline", flags.gloo_native ? "gloo-native"
                                : r.raw           ? (cuda ? "raw-nccl" : "same-algorithm")
                                                  : "comms"},
                   {"algorithm", r.algorithm}});
    out.back()["graph"] = flags.graph;
    if (flags.overhead) {
      out.back()["overhead_baseline"] = cuda ? "raw-nccl" : "same-algorithm";
      out.back()["raw_p50_us"] = r.raw_p50_us;
      out.back()["raw_time_us"] = r.raw_mean_us;
      out.back()["overhead_us"] = r.p50_us - r.raw_p50_us;
      out.back()["overhead_pct"] = 100.0 * (r.p50_us - r.raw_p50_us) / r.raw_p50_us;
    }
  }
  if (flags.json_path == "-") std::printf("%s\n", out.dump(2).c_str());
  else std::ofstream(flags.json_path) << out.dump(2) << "\n";
}

}  // namespace comms::bench
