// The Gloo plugin's translation of hints and COMMS_GLOO_* variables into its
// configuration (resolve_config), and the plugin's dry run (explain_hints)
// that comms-info shows. Input lines:
//   1  hints, "k=v,..." (parsed with comms::parse_hints; a "gloo." prefix is
//      removed as the core does before the plugin sees them)
//   2, 3, 4  COMMS_GLOO_IFNAME, COMMS_GLOO_HOSTNAME, COMMS_GLOO_BUSY_POLL,
//      each unset when its line is absent
// Properties:
//   - only ok or kInvalidArgument; an unknown key is named in the error;
//   - accepted: busy_poll is auto, 1 or 0, and the spin agrees with it; exactly
//     one of interface and hostname is set; a hint wins over its variable,
//     and interface and hostname given together are rejected;
//   - explain_hints agrees with resolve_config and its JSON (built with
//     nlohmann) is valid and reports the same values, on every input.
// getaddrinfo is replaced here (below) so that no fuzzed host name goes to
// a name server.
#include <dlfcn.h>
#include <netdb.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comms/options.h"
#include "comms/env.h"
#include "comms/plugin.h"
#include "fuzz_check.h"
#include "gloo_backend.h"

extern "C" const comms::plugin::PluginDescriptor* comms_plugin_entry();

// The bind-address check (bind_address.cc) resolves host names with
// getaddrinfo, which would send every fuzzed name to the system's resolver
// (DNS): slow (about 100 executions a second), dependent on the network and
// noise for a name server. This definition, in the fuzz build only, takes
// the place of libc's for the whole program: numeric addresses are
// resolved by the real getaddrinfo with AI_NUMERICHOST (never a lookup),
// "localhost" is 127.0.0.1, and any other name does not resolve, as an
// unknown name would not.
extern "C" int getaddrinfo(const char* node, const char* service, const struct addrinfo* hints,
                           struct addrinfo** res) {
  using Real = int (*)(const char*, const char*, const struct addrinfo*, struct addrinfo**);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "getaddrinfo"));
  if (!real) return EAI_SYSTEM;
  struct addrinfo numeric = hints ? *hints : addrinfo{};
  numeric.ai_flags |= AI_NUMERICHOST;
  if (node && std::strcmp(node, "localhost") == 0) node = "127.0.0.1";
  return real(node, service, &numeric, res);
}

namespace {

using comms::ErrorCode;
using comms::Hints;
using comms::gloo_backend::GlooConfig;

const char* const kVariables[] = {"COMMS_GLOO_IFNAME", "COMMS_GLOO_HOSTNAME", "COMMS_GLOO_BUSY_POLL"};

std::string describe(const Hints& h, const std::vector<std::string>& lines) {
  std::string out = "hints '" + comms::format_hints(h) + "'";
  for (size_t i = 1; i < lines.size(); ++i) out += std::string(", ") + kVariables[i - 1] + "='" + lines[i] + "'";
  return out;
}

void check_config(const GlooConfig& cfg, const Hints& h, const std::string& env_ifname,
                  const std::string& env_hostname, const std::string& why) {
  FUZZ_CHECK(cfg.busy_poll == "auto" || cfg.busy_poll == "1" || cfg.busy_poll == "0", "busy_poll '" + cfg.busy_poll + "' from " + why);
  FUZZ_CHECK(cfg.busy_poll == "auto" || cfg.spin.count() == 0, "a spin without busy_poll=auto from " + why);
  FUZZ_CHECK(cfg.busy_poll_enabled == (cfg.busy_poll == "1" || cfg.spin.count() > 0), "busy_poll_enabled wrong from " + why);
  FUZZ_CHECK(cfg.interface.empty() != cfg.hostname.empty(), "not exactly one of interface and hostname from " + why);
  FUZZ_CHECK(!(h.count("interface") && h.count("hostname")), "interface and hostname hints both accepted from " + why);
  if (h.count("interface") && !h.at("interface").empty()) {
    FUZZ_CHECK(cfg.interface == h.at("interface"), "the interface hint lost from " + why);
  } else if (h.count("hostname") && !h.at("hostname").empty()) {
    FUZZ_CHECK(cfg.interface.empty(), "the hostname hint lost to an interface from " + why);
  } else if (!h.count("interface") && !h.count("hostname") && !env_ifname.empty()) {
    FUZZ_CHECK(cfg.interface == env_ifname, "COMMS_GLOO_IFNAME lost from " + why);
  } else if (!h.count("interface") && !h.count("hostname") && env_hostname.empty()) {
    FUZZ_CHECK(!cfg.hostname.empty(), "no default address from " + why);
  }
  if (h.count("busy_poll")) {
    // Accepted: auto in any case, or a boolean (yes, On, ...) as 1 or 0.
    std::string v = h.at("busy_poll");
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const std::string expected = v == "auto" ? "auto" : comms::env::parse_bool(h.at("busy_poll"), "busy_poll") ? "1" : "0";
    FUZZ_CHECK(cfg.busy_poll == expected, "the busy_poll hint lost from " + why);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> lines;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (lines.size() < 4) {
    const size_t nl = rest.find('\n');
    lines.emplace_back(rest.substr(0, nl));
    if (nl == rest.npos) break;
    rest.remove_prefix(nl + 1);
  }
  for (size_t i = 1; i < lines.size(); ++i) lines[i] = lines[i].substr(0, lines[i].find('\0'));  // as setenv sees it
  for (size_t i = 0; i < 3; ++i) {
    if (i + 1 < lines.size()) setenv(kVariables[i], lines[i + 1].c_str(), 1);
    else unsetenv(kVariables[i]);
  }
  const std::string env_ifname = lines.size() > 1 ? lines[1] : "";
  const std::string env_hostname = lines.size() > 2 ? lines[2] : "";

  Hints hints;
  try {
    for (auto& [k, v] : comms::parse_hints(lines[0])) hints[k.starts_with("gloo.") ? k.substr(5) : k] = v;
  } catch (const comms::Error&) {
    return -1;  // not a hint string: fuzz_hints covers the parser
  }
  const std::string why = describe(hints, lines);

  // As a job on one host without a TCP store, on two hosts reaching the store.
  GlooConfig one_host, two_hosts;
  const comms::Status s1 = comms::gloo_backend::resolve_config(hints, 1, 1, "", &one_host);
  // The store is reached from an address of this host (loopback here, since
  // a bind address must be local to be valid).
  const comms::Status s2 = comms::gloo_backend::resolve_config(hints, 2, 4, "127.0.0.1", &two_hosts);
  FUZZ_CHECK(s1.code == s2.code, "the host layout changes whether " + why + " is valid");
  for (const auto* s : {&s1, &s2}) {
    FUZZ_CHECK(s->is_ok() || s->code == ErrorCode::kInvalidArgument, "failed with " + s->message);
  }
  bool unknown_key = false, unknown_named = false;
  for (const auto& [k, v] : hints) {
    if (k == "interface" || k == "hostname" || k == "busy_poll") continue;
    unknown_key = true;
    unknown_named = unknown_named || s1.message.find("'" + k + "'") != std::string::npos;
  }
  // Interface and hostname together is refused first; any other error must
  // name the unknown key.
  const bool both_bind_hints = hints.count("interface") && hints.count("hostname");
  FUZZ_CHECK(!unknown_key || (!s1.is_ok() && (unknown_named || both_bind_hints)),
             "no unknown key named: " + s1.message + " for " + why);

  std::string json;
  const comms::Status se = comms_plugin_entry()->explain_hints(hints, &json);
  FUZZ_CHECK(se.code == s1.code, "explain_hints and resolve_config disagree on " + why);
  if (!s1.is_ok()) return 0;
  check_config(one_host, hints, env_ifname, env_hostname, why);
  check_config(two_hosts, hints, env_ifname, env_hostname, why);
  if (!hints.count("interface") && !hints.count("hostname") && env_ifname.empty() && env_hostname.empty()) {
    FUZZ_CHECK(one_host.hostname == "127.0.0.1" && two_hosts.hostname == "127.0.0.1",
               "the default address is not loopback / the store's from " + why);
  }

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fuzz::fail(FUZZ_HERE, "explain_hints gave invalid JSON", json + " from " + why);
  }
  const auto& g = j["gloo_config"];
  FUZZ_CHECK(g["interface"] == one_host.interface && g["hostname"] == one_host.hostname &&
                 g["busy_poll"] == one_host.busy_poll,
             "explain_hints reports " + json + " but resolve_config gives other values for " + why);
  return 0;
}
