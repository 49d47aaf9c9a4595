// The process-wide registries of comm names: names are unique while alive
// (they key the rendezvous namespace), and each namespace counts its
// incarnations so a comm recreated under the same name rendezvouses afresh.
#include <mutex>
#include <set>
#include <unordered_map>

#include "comm/comm_impl.h"
#include "util/strutil.h"

namespace comms::internal {
namespace {
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::set<std::string>& live_names() {
  static auto* names = new std::set<std::string>();
  return *names;
}
std::unordered_map<std::string, int>& incarnations() {
  static auto* m = new std::unordered_map<std::string, int>();
  return *m;
}
}  // namespace

void register_comm_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu());
  if (!live_names().insert(name).second) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("a comm named '", name,
                             "' is already alive in this process; comm names must be unique "
                             "(they key the rendezvous namespace)"));
  }
}

void unregister_comm_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mu());
  live_names().erase(name);
}

int next_incarnation(const std::string& ns) {
  std::lock_guard<std::mutex> lock(registry_mu());
  return incarnations()[ns]++;
}

}  // namespace comms::internal

namespace comms {

std::vector<std::string> live_comm_names() {
  std::lock_guard<std::mutex> lock(internal::registry_mu());
  return {internal::live_names().begin(), internal::live_names().end()};
}

}  // namespace comms
