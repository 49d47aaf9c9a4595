// A rank program for commsrun_test: joins the TCP store that commsrun hosts
// (COMMS_STORE=tcp://host:port), checks that every rank can see every other
// rank's key, and prints one line that the test reads. Rank 0 also binds
// MASTER_ADDR:MASTER_PORT, as a torch program's TCPStore would: nothing of
// commsrun's may listen there.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

// Throws unless a listening socket can take MASTER_ADDR:MASTER_PORT (an
// IPv4 address here, as commsrun's tests give).
void bind_master_port(const std::string& addr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) throw std::runtime_error("MASTER_ADDR=" + addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 && ::listen(fd, 1) == 0;
  const int err = errno;
  ::close(fd);
  if (!bound) throw std::runtime_error("MASTER_PORT " + std::to_string(port) + " is taken: " + std::strerror(err));
}

}  // namespace

int main() {
  try {
    const int rank = std::stoi(required_env("RANK"));
    const int world_size = std::stoi(required_env("WORLD_SIZE"));
    const std::string url = required_env("COMMS_STORE");
    const size_t colon = url.rfind(':');
    if (url.rfind("tcp://", 0) != 0 || colon == std::string::npos) throw std::runtime_error("COMMS_STORE=" + url);
    const std::string host = url.substr(6, colon - 6);
    const int port = std::stoi(url.substr(colon + 1));
    if (rank == 0) bind_master_port(required_env("MASTER_ADDR"), std::stoi(required_env("MASTER_PORT")));

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
