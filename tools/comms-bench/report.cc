#include "report.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

namespace comms::bench {
namespace {

// What the header says the timed side is.
std::string baseline_text(const Flags& flags, const RunInfo& run) {
  if (run.baseline.empty()) return "";
  const std::string what = flags.gloo_native ? "Gloo's own algorithms, without libcomms"
                           : flags.raw_nccl  ? "raw NCCL: NCCL's calls without libcomms and the plugin"
                                             : "the " + run.baseline.substr(run.baseline.find(':') + 1) +
                                                   " plugin called directly, without libcomms";
  return flags.overhead ? " (comms and " + what + ", alternating)" : " (" + what + ")";
}

}  // namespace

void print_header(const Flags& flags, const RunInfo& run) {
  std::printf("# comms-bench %s, %d ranks, backend %s, %s buffers%s, %d iterations (%d warm-up)\n", run.op->name,
              run.ranks, run.backend.c_str(), run.where.c_str(),
              baseline_text(flags, run).c_str(),
              run.iters, run.warmup);
  if (flags.floor) {
    std::printf("# floor: the same bytes moved by %d threads of one process (one per rank), plain loads and "
                "stores, p50 over the same iterations; x floor = p50 / floor (docs/BENCHMARKS.md#the-floor)\n",
                run.ranks);
  }
  if (flags.overhead) {
    std::printf("#%12s %12s %9s %8s %13s %10s %10s %12s %12s %12s", "size(B)", "count", "type", "redop",
                "placement", "time(us)", "p50(us)", "raw p50(us)", "overhead(us)", "overhead(%)");
  } else {
    std::printf("#%12s %12s %9s %8s %13s %10s %10s %10s %10s %10s", "size(B)", "count", "type", "redop",
                "placement", "time(us)", "p50(us)", "p99(us)", "algbw", "busbw");
  }
  if (flags.floor) std::printf(" %10s %8s", "floor(us)", "x floor");
  std::printf(" %7s  %s\n", "#wrong", "algorithm");
}

void print_row(const Flags& flags, const Row& r) {
  if (flags.overhead) {
    std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %12.2f %12.2f %12.2f", r.bytes, r.count, r.dtype.c_str(),
                r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.raw_p50_us, r.p50_us - r.raw_p50_us,
                100.0 * (r.p50_us - r.raw_p50_us) / r.raw_p50_us);
  } else {
    std::printf(" %12zu %12zu %9s %8s %13s %10.2f %10.2f %10.2f %10.3f %10.3f", r.bytes, r.count, r.dtype.c_str(),
                r.redop.c_str(), r.placement.c_str(), r.mean_us, r.p50_us, r.p99_us, r.algbw, r.busbw);
  }
  if (flags.floor) std::printf(" %10.2f %8.2f", r.floor_us, r.floor_ratio);
  // "-": the backend does not report its paths (backend_paths.h).
  std::printf(" %7lld  %s\n", static_cast<long long>(r.wrong), r.algorithm.empty() ? "-" : r.algorithm.c_str());
  std::fflush(stdout);
}

void write_json(const Flags& flags, const RunInfo& run, const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    out.push_back({{"op", r.op}, {"bytes", r.bytes}, {"count", r.count}, {"dtype", r.dtype}, {"redop", r.redop},
                   {"placement", r.placement}, {"time_us", r.mean_us}, {"p50_us", r.p50_us},
                   {"p99_us", r.p99_us}, {"algbw_gbps", r.algbw}, {"busbw_gbps", r.busbw}, {"wrong", r.wrong},
                   {"ranks", run.ranks}, {"root", flags.root}, {"average", flags.average},
                   {"device", flags.device_name}, {"baseline", r.raw ? run.baseline : "comms"}});
    if (!r.algorithm.empty()) out.back()["algorithm"] = r.algorithm;
    out.back()["graph"] = flags.graph;
    if (!run.cuda) out.back()["memory"] = flags.local_register ? "backend" : flags.huge_pages ? "huge_pages" : "plain";
    if (flags.floor) {
      out.back()["floor_us"] = r.floor_us;
      out.back()["floor_ratio"] = r.floor_ratio;
      out.back()["floor_p99_us"] = r.floor_p99_us;
    }
    if (flags.overhead) {
      out.back()["overhead_baseline"] = run.baseline;
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
