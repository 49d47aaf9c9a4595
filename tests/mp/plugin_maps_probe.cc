// Parses the backend string argv[1] as a job would (BackendSpec::parse
// through the plugin registry), prints "ERROR: <message>" if it fails, then
// "MAPS: <names>": the plugins and UCX libraries this process has mapped.
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "comms/comms.h"

int main(int argc, char** argv) {
  try {
    comms::BackendSpec::parse(argc > 1 ? argv[1] : "");
  } catch (const comms::Error& e) {
    std::printf("ERROR: %s\n", e.what());
  }
  std::set<std::string> names;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const std::string file = line.substr(line.rfind('/') + 1);
    if (line.find('/') != std::string::npos && (file.starts_with("libcomms-") || file.starts_with("libuc"))) {
      names.insert(file);
    }
  }
  std::printf("MAPS:");
  for (const auto& n : names) std::printf(" %s", n.c_str());
  std::printf("\n");
  return 0;
}
