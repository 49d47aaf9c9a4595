// comms-bench's flags and the checks on them that need no communicator.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "comms/plugin.h"

namespace comms::bench {

struct OpInfo {
  const char* name;
  plugin::OpType type;
  // busbw = algbw * factor(n), as nccl-tests defines it.
  double (*bus_factor)(int n);
  // How many elements the op's "count" is for a size in bytes (the size is
  // the largest buffer: nccl-tests' convention).
  bool size_is_total;
};

constexpr int kNumOps = 10;
extern const OpInfo kOps[kNumOps];

// The largest size a row may have. Each rank holds two buffers of it.
constexpr size_t kMaxBytes = size_t{1} << 40;

// How a row's per-iteration times combine over ranks (nccl-tests' -a).
enum class Average { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

// Every flag, as given. The names and one-letter flags are nccl-tests'
// (-o is the reduce op, -r the root); the collective is -C/--coll, or comes
// from the program's name (all_reduce_perf, ... as nccl-tests' binaries).
struct Flags {
  std::string op_name = "all_reduce", min_size = "4K", max_size = "4K", dtype_name = "float32", redop_name = "sum";
  std::string backend, json_path, device_name = "cpu", step_bytes = "0";
  std::vector<std::string> hint_texts;
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, root = 0, ngpus = 1, average = int(Average::kMax);
  bool inplace = false, outofplace = false, overhead = false;
  // The baseline (baseline.h): --raw-plugin, or its older name --raw-gloo
  // (the CPU backend's plugin only), --gloo-native, --raw-nccl; --overhead
  // alone means --raw-plugin.
  bool raw_plugin = false, raw_gloo = false, gloo_native = false, raw_nccl = false;
  bool graph = false;  // --graph: time replays of a CUDA graph holding the op
  bool floor = false;  // --floor: each row's memory-bound floor (floor.h) and the ratio to it
  // -R 1: buffers from the comm's allocator, registered (backend_buffer.h).
  int local_register = 0;
  // --huge-pages: cpu buffers (and the floor's) in transparent huge pages (huge_pages.h).
  bool huge_pages = false;

  bool has_raw() const { return raw_plugin || raw_gloo || gloo_native || raw_nccl || overhead; }
  bool plugin_baseline() const { return has_raw() && !gloo_native && !raw_nccl; }
};

void add_flags(CLI::App& app, Flags& flags);
// The collective a program named like nccl-tests' binaries runs
// ("all_reduce_perf" -> "all_reduce", "alltoall_perf" -> "all_to_all"), or
// "" for any other name (a path's folders are ignored).
std::string op_from_program_name(std::string_view argv0);

// Throws comms::Error(kInvalidArgument) "<flag><why>".
[[noreturn]] void bad_flag(std::string_view flag, const std::string& why);
// "4096", "4K", "1M", "2G" (binary units) in bytes; `flag` names it in errors.
size_t parse_size(const std::string& text, std::string_view flag);
// MemAvailable of /proc/meminfo in bytes, 0 if unknown.
size_t available_memory();
// Rejects a range this run cannot do. `unit`: the bytes a size must be a
// multiple of (one element, or one per rank where the size is the total).
void check_range(const std::string& min_text, const std::string& max_text, size_t lo, size_t hi, size_t unit,
                 const std::string& unit_why);

}  // namespace comms::bench
