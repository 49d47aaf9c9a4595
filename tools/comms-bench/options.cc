#include "options.h"

#include <cmath>
#include <fstream>
#include <tuple>

#include "comms/error.h"
#include "util/strutil.h"

namespace comms::bench {

using plugin::OpType;

double one(int) { return 1; }
double all_reduce_factor(int n) { return 2.0 * (n - 1) / n; }
double gather_factor(int n) { return double(n - 1) / n; }

const OpInfo kOps[kNumOps] = {
    {"all_reduce", OpType::kAllReduce, all_reduce_factor, false},
    {"all_gather", OpType::kAllGather, gather_factor, true},
    {"reduce_scatter", OpType::kReduceScatter, gather_factor, true},
    {"broadcast", OpType::kBroadcast, one, false},
    {"reduce", OpType::kReduce, one, false},
    {"all_to_all", OpType::kAllToAll, gather_factor, true},
    {"gather", OpType::kGather, gather_factor, true},
    {"scatter", OpType::kScatter, gather_factor, true},
    {"barrier", OpType::kBarrier, one, false},
    {"send_recv", OpType::kSend, one, false},
};

void bad_flag(std::string_view flag, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, str::cat(flag, why));
}

// "4096", "4K", "1.5M", "2G" (binary units): a whole number of bytes, at most kMaxBytes.
size_t parse_size(const std::string& text, std::string_view flag) {
  std::string_view t = str::strip(text);
  double scale = 1;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K': case 'k': scale = 1024; t.remove_suffix(1); break;
      case 'M': case 'm': scale = 1024.0 * 1024; t.remove_suffix(1); break;
      case 'G': case 'g': scale = 1024.0 * 1024 * 1024; t.remove_suffix(1); break;
      default: break;
    }
  }
  double v = 0;
  // !(v >= 0) also rejects NaN.
  if (!str::parse_double(t, &v) || !(v >= 0) || v * scale != std::floor(v * scale)) {
    bad_flag(flag, str::cat("='", text, "' is not a size in bytes; use e.g. 4096, 4K, 1M or 2G (binary units)"));
  }
  if (v * scale > double(kMaxBytes)) {
    bad_flag(flag, str::cat("='", text, "' is more than comms-bench runs, ", kMaxBytes >> 30, "G"));
  }
  return static_cast<size_t>(v * scale);
}

// MemAvailable from /proc/meminfo, or 0 when unknown.
size_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

void check_range(const std::string& min_text, const std::string& max_text, size_t lo, size_t hi, size_t unit,
                 const std::string& unit_why) {
  if (lo > hi) {
    bad_flag("-b/--minbytes", str::cat("='", min_text, "' (", lo, " bytes) is above -e/--maxbytes='", max_text, "' (",
                                       hi, " bytes); give a minimum at most the maximum"));
  }
  for (auto [flag, text, bytes] : {std::tuple{"-b/--minbytes", &min_text, lo}, {"-e/--maxbytes", &max_text, hi}}) {
    if (bytes % unit != 0) {
      bad_flag(flag, str::cat("='", *text, "' (", bytes, " bytes) is not a multiple of ", unit, " bytes (", unit_why,
                              ")"));
    }
  }
}

std::string op_from_program_name(std::string_view argv0) {
  const size_t slash = argv0.rfind('/');
  std::string_view name = slash == std::string_view::npos ? argv0 : argv0.substr(slash + 1);
  if (!str::consume_suffix(name, "_perf")) return "";
  // nccl-tests' spellings where ours differ.
  if (name == "alltoall") return "all_to_all";
  if (name == "sendrecv") return "send_recv";
  for (const auto& o : kOps) {
    if (name == o.name) return o.name;
  }
  return "";
}

void add_flags(CLI::App& app, Flags& flags) {
  std::vector<std::string> op_names;
  for (const auto& o : kOps) op_names.emplace_back(o.name);
  op_names.emplace_back("put");  // windows, not a plugin op (put_bench.h)
  app.option_defaults()->always_capture_default();
  // nccl-tests' flags, with its meanings.
  app.add_option("-b,--minbytes", flags.min_size, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", flags.max_size, "largest size");
  app.add_option("-i,--stepbytes", flags.step_bytes, "add this many bytes between rows instead of -f (0: use -f)");
  app.add_option("-f,--stepfactor", flags.factor, "size multiplier between rows")->check(CLI::Range(1.01, 1e9));
  app.add_option("-g,--ngpus", flags.ngpus, "devices per process: 1 (start one rank per device with commsrun -n)");
  app.add_option("-n,--iters", flags.iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters,--warmup", flags.warmup, "warm-up iterations")->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", flags.check, "1: check results and report #wrong; 0: do not")->check(CLI::Range(0, 1));
  app.add_option("-o,--op", flags.redop_name, "reduce op: sum, prod, min, max, avg, band, bor, bxor, premul_sum:F");
  app.add_option("-r,--root", flags.root, "root rank of broadcast, reduce, gather and scatter")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-d,--datatype", flags.dtype_name, "data type (int8, int32, float, half, bfloat16, double, ...)");
  app.add_option("-a,--average", flags.average,
                 "how an iteration's time combines over ranks: 0 rank 0's, 1 mean, 2 min, 3 max (the slowest "
                 "rank; nccl-tests' default is 1)")
      ->check(CLI::Range(0, 3));
  // comms-bench's own.
  app.add_option("-C,--coll", flags.op_name, "collective (default: from a program name like all_reduce_perf)")
      ->check(CLI::IsMember(op_names));
  app.add_flag("--inplace", flags.inplace, "only in-place");
  app.add_flag("--outofplace", flags.outofplace, "only out-of-place (default: both)");
  app.add_option("--backend", flags.backend, "backend string (default COMMS_BACKEND, else the default map)");
  app.add_option("--json", flags.json_path, "write the results as JSON to FILE ('-': stdout)")->type_name("FILE");
  app.add_option("--device", flags.device_name, "where the buffers live: cpu, or cuda (the local rank's GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--hint", flags.hint_texts, "a comm hint KEY=VALUE, e.g. nccl.max_ctas=4 (repeatable)");
  app.add_flag("--raw-plugin", flags.raw_plugin,
               "time the comm's backend plugin called directly through the plugin ABI, without libcomms");
  app.add_flag("--raw-gloo", flags.raw_gloo, "the older name of --raw-plugin, for the cpu backend only")
      ->excludes("--raw-plugin");
  app.add_flag("--gloo-native", flags.gloo_native,
               "time Gloo's own algorithm classes and collectives, through Gloo's API, without libcomms")
      ->excludes("--raw-plugin")
      ->excludes("--raw-gloo");
  app.add_flag("--raw-nccl", flags.raw_nccl,
               "with --device cuda: time the op called straight through NCCL's API, on a communicator with the "
               "config the nccl plugin reports for this comm, on the same stream")
      ->excludes("--raw-plugin")
      ->excludes("--raw-gloo")
      ->excludes("--gloo-native");
  app.add_flag("--overhead", flags.overhead,
               "time each op through comms and through the baseline in alternation and report both (the plugin "
               "called directly unless --gloo-native or --raw-nccl names another)");
  app.add_flag("--floor", flags.floor,
               "beside each row, the op's memory-bound floor on this host (the same bytes moved by one thread "
               "per rank in one process, plain loads and stores, timed in the same run) and p50 / floor");
  app.add_option("-R,--local_register", flags.local_register,
                 "1: the op's buffers come from the comm's allocator (alloc_backend_memory) and are registered "
                 "with it (register_buffer), as nccl-tests' -R 1; cpu buffers only")
      ->check(CLI::Range(0, 1));
  app.add_flag("--huge-pages", flags.huge_pages,
               "the op's cpu buffers, and --floor's, in transparent huge pages (2 MiB-aligned, madvise "
               "MADV_HUGEPAGE), as torch allocates tensors of 2 MiB and more with THP_MEM_ALLOC_ENABLE=1")
      ->excludes("-R");
  app.add_flag("--graph", flags.graph,
               "with --device cuda: capture each size's op once in a CUDA graph (comms and the baseline "
               "alike) and time its replays, as an inference engine issues it");
}

}  // namespace comms::bench
