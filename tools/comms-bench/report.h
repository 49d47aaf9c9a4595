// comms-bench's output: the table rank 0 prints and the --json file.
#pragma once

#include <string>
#include <vector>

#include "options.h"
#include "runner.h"

namespace comms::bench {

// What the header line and the JSON say about the run.
struct RunInfo {
  const OpInfo* op = nullptr;
  int ranks = 0;
  std::string backend;
  std::string where;  // "cpu", with where its buffers live unless plain, or "cuda:N"
  bool cuda = false;
  std::string baseline;  // Baseline::name() of the connected baseline; "" without one
  int iters = 0, warmup = 0;
};

void print_header(const Flags& flags, const RunInfo& run);
void print_row(const Flags& flags, const Row& r);
void write_json(const Flags& flags, const RunInfo& run, const std::vector<Row>& rows);

}  // namespace comms::bench
