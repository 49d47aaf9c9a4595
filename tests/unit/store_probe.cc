// A rank program for commsrun_test: joins the TCP store that commsrun hosts
// (MASTER_ADDR/MASTER_PORT), checks that every rank can see every other
// rank's key, and prints one line that the test reads.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "comms/error.h"
#include "comms/store.h"
#include "store/store_tcp.h"  // core/, internal

namespace {

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') throw std::runtime_error(std::string(name) + " is not set");
  return value;
}

}  // namespace

int main() {
  try {
    const int rank = std::stoi(required_env("RANK"));
    const int world_size = std::stoi(required_env("WORLD_SIZE"));
    const std::string host = required_env("MASTER_ADDR");
    const int port = std::stoi(required_env("MASTER_PORT"));
    if (required_env("COMMS_LAUNCHER_STORE") != "1") throw std::runtime_error("COMMS_LAUNCHER_STORE is not 1");

    auto store = comms::connect_tcp_store(host, static_cast<uint16_t>(port), std::chrono::seconds(5));
    store->set("probe/rank/" + std::to_string(rank), std::to_string(rank * 10));
    int64_t joined = store->add("probe/joined", 1);
    std::vector<std::string> keys;
    for (int r = 0; r < world_size; ++r) keys.push_back("probe/rank/" + std::to_string(r));
    store->wait(keys, std::chrono::seconds(5));
    int64_t sum = 0;
    for (const auto& key : keys) sum += std::stoll(store->get(key, std::chrono::seconds(1)));
    std::cout << "probe ok rank=" << rank << " sum=" << sum << " joined_at=" << joined
              << " local_address=" << comms::tcp_store_local_address(*store) << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "probe failed: " << e.what() << std::endl;
    return 1;
  }
}
