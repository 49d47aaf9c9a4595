// comms-noise: how often this machine takes a core away from a program that
// never yields it, and for how long. One thread per core, bound, reads the
// clock in a loop for --seconds; every gap between two reads longer than
// --threshold-ns is time the core ran something else (an interrupt, the
// kernel, or, in a virtual machine, the hypervisor). Beside the gaps it
// counts the interrupts and steal time the kernel itself recorded in the same
// seconds: gaps the kernel did not see come from below it. A small op's p99
// can be no better than the share of its iterations such gaps hit
// (docs/BENCHMARKS.md, "Steadiness").
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

// Gap lengths: [1, 2), [2, 4), [4, 8), [8, 16), [16, 64), [64, inf) us.
constexpr std::array<double, 6> kBucketFloorUs = {1, 2, 4, 8, 16, 64};

struct CoreNoise {
  int cpu = -1;
  bool bound = false;
  int64_t gaps = 0;
  double lost_ns = 0, longest_ns = 0, spun_ns = 0;
  std::array<int64_t, kBucketFloorUs.size()> buckets{};
};

void spin(CoreNoise& out, double seconds, int64_t threshold_ns) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(out.cpu, &set);
  out.bound = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  auto prev = start;
  while (prev < end) {
    const auto now = Clock::now();
    const int64_t gap = std::chrono::duration_cast<std::chrono::nanoseconds>(now - prev).count();
    if (gap > threshold_ns) {
      ++out.gaps;
      out.lost_ns += double(gap);
      out.longest_ns = std::max(out.longest_ns, double(gap));
      size_t b = 0;
      while (b + 1 < kBucketFloorUs.size() && double(gap) >= kBucketFloorUs[b + 1] * 1000) ++b;
      ++out.buckets[b];
    }
    prev = now;
  }
  out.spun_ns = double(std::chrono::duration_cast<std::chrono::nanoseconds>(prev - start).count());
}

// Per cpu: the interrupts /proc/interrupts counts (every line summed) and
// the steal ticks of /proc/stat; empty where unreadable.
struct KernelCounts {
  std::vector<int64_t> interrupts, steal;
};

KernelCounts kernel_counts(int ncpu) {
  KernelCounts k;
  std::ifstream irq("/proc/interrupts");
  std::string line;
  if (std::getline(irq, line)) {
    std::istringstream head(line);
    std::vector<int> columns;  // the cpu of each count column
    for (std::string name; head >> name;) columns.push_back(std::stoi(name.substr(3)));
    k.interrupts.assign(size_t(ncpu), 0);
    while (std::getline(irq, line)) {
      std::istringstream in(line);
      std::string label;
      in >> label;
      for (int c : columns) {
        int64_t v;
        if (!(in >> v)) break;
        if (c < ncpu) k.interrupts[size_t(c)] += v;
      }
    }
  }
  std::ifstream stat("/proc/stat");
  k.steal.assign(size_t(ncpu), -1);
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(3));
    int c;
    int64_t f[8] = {};
    in >> c;
    for (auto& v : f) in >> v;
    if (c < ncpu) k.steal[size_t(c)] = f[7];  // user nice system idle iowait irq softirq steal
  }
  return k;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"comms-noise: how often this machine takes a core away, and for how long (one spinning thread per "
               "core; run it on an otherwise idle machine)"};
  double seconds = 2;
  int64_t threshold_ns = 1000;
  std::vector<int> cpus;
  std::string json_path;
  app.add_option("--seconds", seconds, "how long each thread reads the clock")->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  app.add_option("--threshold-ns", threshold_ns, "a gap between two clock reads longer than this is time lost")
      ->check(CLI::Range(int64_t(100), int64_t(1000000)))
      ->capture_default_str();
  app.add_option("--cpus", cpus, "the cores to probe (default: every core this process may run on)");
  app.add_option("--json", json_path, "also write the result as JSON to this file (-: stdout alone)");
  CLI11_PARSE(app, argc, argv);
  if (cpus.empty()) cpus = allowed_cpus();
  const int ncpu = *std::max_element(cpus.begin(), cpus.end()) + 1;

  std::vector<CoreNoise> cores(cpus.size());
  for (size_t i = 0; i < cpus.size(); ++i) cores[i].cpu = cpus[i];
  const KernelCounts before = kernel_counts(ncpu);
  std::vector<std::thread> threads;
  for (auto& c : cores) threads.emplace_back(spin, std::ref(c), seconds, threshold_ns);
  for (auto& t : threads) t.join();
  const KernelCounts after = kernel_counts(ncpu);
  const long ticks_per_second = sysconf(_SC_CLK_TCK);

  nlohmann::ordered_json out = {{"seconds", seconds}, {"threshold_ns", threshold_ns}, {"cores", nlohmann::ordered_json::array()}};
  for (const auto& c : cores) {
    const double spun_s = c.spun_ns / 1e9;
    nlohmann::ordered_json j = {{"cpu", c.cpu},
                        {"bound", c.bound},
                        {"gaps", c.gaps},
                        {"gaps_per_second", spun_s > 0 ? double(c.gaps) / spun_s : 0},
                        {"lost_fraction", c.spun_ns > 0 ? c.lost_ns / c.spun_ns : 0},
                        {"mean_gap_us", c.gaps ? c.lost_ns / double(c.gaps) / 1000 : 0},
                        {"longest_gap_us", c.longest_ns / 1000}};
    nlohmann::ordered_json buckets = nlohmann::ordered_json::object();
    for (size_t b = 0; b < kBucketFloorUs.size(); ++b) {
      const std::string name = b + 1 < kBucketFloorUs.size()
                                   ? std::to_string(int(kBucketFloorUs[b])) + "-" + std::to_string(int(kBucketFloorUs[b + 1])) + "us"
                                   : ">" + std::to_string(int(kBucketFloorUs[b])) + "us";
      buckets[name] = c.buckets[b];
    }
    j["gaps_by_length"] = buckets;
    const auto cpu = size_t(c.cpu);
    if (cpu < before.interrupts.size() && cpu < after.interrupts.size() && spun_s > 0) {
      j["kernel_interrupts_per_second"] = double(after.interrupts[cpu] - before.interrupts[cpu]) / spun_s;
    }
    if (cpu < before.steal.size() && before.steal[cpu] >= 0 && after.steal[cpu] >= 0 && spun_s > 0) {
      j["steal_fraction"] = double(after.steal[cpu] - before.steal[cpu]) / double(ticks_per_second) / spun_s;
    }
    out["cores"].push_back(j);
  }
  if (json_path != "-") {
    std::printf("# comms-noise: gaps over %lld ns between clock reads, one bound thread per core, %.1f s\n",
                static_cast<long long>(threshold_ns), seconds);
    std::printf("# %4s %9s %8s %9s %12s %13s %9s  %s\n", "cpu", "gaps/s", "lost(%)", "mean(us)", "longest(us)",
                "kernel irq/s", "steal(%)", "gaps by length");
    auto or_dash = [](const nlohmann::ordered_json& j, const char* key, double scale) {
      return j.contains(key) ? std::to_string(int64_t(j[key].get<double>() * scale)) : std::string("-");
    };
    for (const auto& j : out["cores"]) {
      std::string hist;
      for (const auto& [k, v] : j["gaps_by_length"].items()) hist += k + ":" + std::to_string(v.get<int64_t>()) + " ";
      std::printf("  %4d %9.0f %8.2f %9.2f %12.1f %13s %9s  %s%s\n", j["cpu"].get<int>(),
                  j["gaps_per_second"].get<double>(), 100 * j["lost_fraction"].get<double>(),
                  j["mean_gap_us"].get<double>(), j["longest_gap_us"].get<double>(),
                  or_dash(j, "kernel_interrupts_per_second", 1).c_str(), or_dash(j, "steal_fraction", 100).c_str(),
                  hist.c_str(), j["bound"].get<bool>() ? "" : "(not bound)");
    }
  }
  if (!json_path.empty()) {
    if (json_path == "-") std::printf("%s\n", out.dump(2).c_str());
    else std::ofstream(json_path) << out.dump(2) << "\n";
  }
  return 0;
}
