// A program that reads every environment variable a job reads at start-up:
// bootstrap, store, route, backend string, timeouts, hint strictness, log
// level and the Gloo settings (through an eagerly bound world). For
// env_validation_test, which runs it with one malformed variable at a time.
// Prints "ok" and exits 0, or prints the error and exits 2.
#include <cstdio>

#include "comms/comms.h"

int main() {
  try {
    comms::dist::InitOptions options;
    options.device = comms::Device::cpu();
    comms::dist::init_process_group(options);
    comms::dist::destroy_process_group();
    std::printf("ok\n");
    return 0;
  } catch (const comms::Error& e) {
    std::printf("error: %s: %s\n", std::string(comms::to_string(e.code())).c_str(), e.what());
    return 2;
  }
}
