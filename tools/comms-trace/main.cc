// comms-trace DIR [--json]: merges the flight-recorder dumps of a job
// ($COMMS_TRACE_DIR) and says, per comm, how far each rank got, which op
// some ranks never entered, and where the ranks' arguments first differ.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "merge.h"

int main(int argc, char** argv) {
  CLI::App app{"comms-trace: merge the flight-recorder dumps of all ranks (COMMS_TRACE_DIR)"};
  std::string dir;
  bool as_json = false;
  app.add_option("dir", dir, "directory holding <comm>.rank<R>.json dumps")->required();
  app.add_flag("--json", as_json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto dumps = comms::trace_tool::read_dumps(dir);
    if (dumps.empty()) {
      std::cerr << "comms-trace: no dumps (*.json) in " << dir << "\n";
      return 1;
    }
    const auto merged = comms::trace_tool::merge(dumps);
    if (as_json) std::cout << merged.dump(2) << "\n";
    else std::cout << comms::trace_tool::to_text(merged);
  } catch (const std::exception& e) {
    std::cerr << "comms-trace: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
