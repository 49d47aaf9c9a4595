// Hints -> ncclConfig_t translation for the NCCL plugin. Pure: no NCCL or CUDA
// calls, so it is unit-tested on CPU and serves the descriptor's explain_hints.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "comms/error.h"
#include "comms/options.h"

namespace comms::nccl {

struct HintKeyVersion {
  const char* key;
  int min_version;
};

// NCCL's MAXCHANNELS: the most CTAs a collective uses, and maxCTAs' default.
inline constexpr int kMaxCtas = 64;

// The plugin's one key table: the keys it accepts (no "nccl." prefix), in
// ncclConfig_t order, then the stream key, each with the first NCCL release
// (as NCCL_VERSION_CODE) whose ncclConfig_t has its field; 0 for keys that
// are not config fields. A key is refused when the NCCL loaded at run time is
// older than its entry. The plugin fills its own copy of the newest layout it
// knows (NcclConfig, nccl_api.h), so a key needs no field in the header built
// against; nccl_api.cc checks the layout against the header's ncclConfig_t.
// comms::dist::kOptionSpellings maps torch's and Megatron's names onto these
// keys (tests/backends/nccl/nccl_options_test.cc).
inline constexpr HintKeyVersion kHintKeyVersions[] = {
    {"blocking", 21400},
    // NCCL reads cgaClusterSize, minCTAs, maxCTAs and netName only from a
    // config of version >= 2.17 (parseCommConfig in NCCL's init.cc).
    {"cga_cluster_size", 21700},
    {"min_ctas", 21700},
    {"max_ctas", 21700},
    {"net_name", 21700},
    {"split_share", 21800},
    {"traffic_class", 22700},
    {"comm_name", 22700},
    {"collnet_enable", 22700},
    {"cta_policy", 22700},
    {"shrink_share", 22700},
    {"nvls_ctas", 22700},
    {"nchannels_per_net_peer", 22800},
    {"nvlink_centric_sched", 22800},
    {"graph_usage_mode", 22900},
    {"num_rma_ctx", 22900},
    {"max_p2p_peers", 23003},
    {"graph_stream_ordering", 23006},
    {"high_priority_stream", 0},
};

// The keys the plugin accepts (no "nccl." prefix): kHintKeyVersions' keys,
// null-terminated for PluginDescriptor::hint_keys.
inline constexpr auto kHintKeys = [] {
  std::array<const char*, std::size(kHintKeyVersions) + 1> keys{};
  for (size_t i = 0; i < std::size(kHintKeyVersions); ++i) keys[i] = kHintKeyVersions[i].key;
  return keys;
}();
std::span<const char* const> hint_keys();  // without the terminating null

// The entry above for `key`, or -1 for an unknown key.
constexpr int min_nccl_version_for(std::string_view key) {
  for (const HintKeyVersion& k : kHintKeyVersions) {
    if (key == k.key) return k.min_version;
  }
  return -1;
}

// The user-settable ncclConfig_t fields, each unset unless a hint set it.
struct NcclConfigFields {
  std::optional<int> blocking;
  std::optional<int> cga_cluster_size;
  std::optional<int> min_ctas;
  std::optional<int> max_ctas;
  std::optional<std::string> net_name;
  std::optional<int> split_share;
  std::optional<int> traffic_class;
  std::optional<std::string> comm_name;
  std::optional<int> collnet_enable;
  std::optional<int> cta_policy;
  std::optional<int> shrink_share;
  std::optional<int> nvls_ctas;
  std::optional<int> nchannels_per_net_peer;
  std::optional<int> nvlink_centric_sched;
  std::optional<int> graph_usage_mode;
  std::optional<int> num_rma_ctx;
  std::optional<int> max_p2p_peers;
  std::optional<int> graph_stream_ordering;

  friend bool operator==(const NcclConfigFields&, const NcclConfigFields&) = default;
};

enum class StreamPriority { kDefault, kHigh };

struct TranslatedHints {
  NcclConfigFields config;
  StreamPriority priority = StreamPriority::kDefault;

  friend bool operator==(const TranslatedHints&, const TranslatedHints&) = default;
};

// Validates `hints` (keys without prefix) and translates them for an NCCL
// whose version code is `nccl_version_code` (the loaded library's
// ncclGetVersion in production; tests pass other codes to exercise the
// gating). Every error
// names the key and the value. A key that NCCL lacks is an error, never
// dropped; so is a key given both bare and prefixed ("k" and "nccl.k").
Status translate_hints(const Hints& hints, int nccl_version_code, TranslatedHints* out);

// The fields the plugin hands NCCL for a comm named `comm_name`: the hints'
// fields, always non-blocking (blocking=0, see README), and commName defaulting
// to the comm's name. describe() reports them as "nccl_config", from which
// comms-bench's raw-NCCL baseline builds its own communicator's config.
NcclConfigFields plugin_config_fields(NcclConfigFields hinted, const std::string& comm_name);

// The child's hints for a split: the parent's, overridden by the call's.
// comm_name is not inherited: it names one communicator in NCCL's logs.
Hints merge_split_hints(const Hints& parent, const Hints& call);

// {"nccl_config": {<hint name>: value or null, ...}, "high_priority_stream": bool}
std::string explain_json(const TranslatedHints& t);
// Just the "nccl_config" object, shared with describe().
std::string config_json(const NcclConfigFields& c);

// Net names accepted by net_name: NCCL's built-in transports ("IB",
// "Socket"), plus the comma-separated names in COMMS_NCCL_NET_NAMES for
// sites that load an NCCL net plugin. Matching is case-insensitive; the
// canonical spelling is stored.
std::optional<std::string> canonical_net_name(std::string_view name);

// "2.28.9" from a version code (22809; also the pre-2.9 form 2804).
std::string nccl_version_string(int code);

}  // namespace comms::nccl
