#include "nccl_hints.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "comms/env.h"

namespace comms::nccl {
namespace {

constexpr int kCtaPolicyZeroVersion = 22800;
// Upper bounds of our own (NCCL only requires >= 0 / > 0): a value past
// them is a typo, not a configuration.
constexpr int kMaxRmaCtx = 64;
constexpr int kMaxP2pPeers = 1 << 20;

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

Status invalid(std::string_view key, std::string_view value, std::string_view why) {
  return {ErrorCode::kInvalidArgument,
          "nccl hint " + std::string(key) + "=" + std::string(value) + ": " + std::string(why)};
}

Status parse_int(std::string_view key, std::string_view value, int lo, int hi, int* out) {
  const std::string v = trim(value);
  int parsed = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || parsed < lo || parsed > hi) {
    return invalid(key, value,
                   "must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  *out = parsed;
  return {};
}

Status parse_bool(std::string_view key, std::string_view value, bool* out) {
  const std::string v = lower(trim(value));
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off") {
    *out = false;
  } else {
    return invalid(key, value, "must be a boolean (1/0, true/false, yes/no, on/off)");
  }
  return {};
}

Status parse_flag(std::string_view key, std::string_view value, std::optional<int>* out) {
  bool b = false;
  Status s = parse_bool(key, value, &b);
  if (s.is_ok()) *out = b ? 1 : 0;
  return s;
}

Status parse_range(std::string_view key, std::string_view value, int lo, int hi,
                   std::optional<int>* out) {
  int v = 0;
  Status s = parse_int(key, value, lo, hi, &v);
  if (s.is_ok()) *out = v;
  return s;
}

Status parse_cta_policy(std::string_view key, std::string_view value, int version, int* out) {
  const std::string v = lower(trim(value));
  int policy = -1;
  if (v == "default" || v == "0") policy = 0;
  else if (v == "efficiency" || v == "1") policy = 1;
  else if (v == "zero" || v == "2") policy = 2;
  if (policy < 0) return invalid(key, value, "must be one of default, efficiency, zero (or 0, 1, 2)");
  if (policy == 2 && version < kCtaPolicyZeroVersion) {
    return invalid(key, value,
                   "the zero CTA policy needs NCCL >= " + nccl_version_string(kCtaPolicyZeroVersion) +
                       "; the loaded NCCL is " + nccl_version_string(version));
  }
  *out = policy;
  return {};
}

std::string known_keys_list() {
  std::string out;
  for (const HintKeyVersion& k : kHintKeyVersions) {
    if (!out.empty()) out += ", ";
    out += k.key;
  }
  return out;
}

}  // namespace

std::span<const char* const> hint_keys() {
  return {kHintKeys.data(), kHintKeys.size() - 1};
}

std::string nccl_version_string(int code) {
  int major, minor, patch;
  if (code >= 10000) {
    major = code / 10000;
    minor = code / 100 % 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = code / 100 % 10;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// Printable names only: the name goes into describe()/explain JSON and NCCL's logs.
std::optional<std::string> canonical_net_name(std::string_view name) {
  if (!std::all_of(name.begin(), name.end(), [](unsigned char ch) { return std::isprint(ch) != 0; })) {
    return std::nullopt;
  }
  std::vector<std::string> known = {"IB", "Socket"};
  if (const auto extra = comms::env::get("COMMS_NCCL_NET_NAMES")) {
    std::string_view rest(*extra);  // a view of *extra, which outlives the loop
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string item = trim(rest.substr(0, comma));
      if (!item.empty()) known.push_back(item);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
  }
  const std::string wanted = lower(trim(name));
  for (const std::string& k : known) {
    if (lower(k) == wanted) return k;
  }
  return std::nullopt;
}

namespace {

// One key (known, and available at `version`) into `t`.
Status parse_key(std::string_view key, const std::string& value, int version, TranslatedHints* t) {
  NcclConfigFields& c = t->config;
  Status s;
  if (key == "blocking") {
    bool b = true;
    s = parse_bool(key, value, &b);
    // Communicators are always created non-blocking so that init and every
    // enqueue are bounded by the comm's timeouts; a blocking NCCL call could
    // hang forever on a dead peer.
    if (s.is_ok() && b) {
      s = invalid(key, value,
                  "the nccl backend always creates non-blocking communicators so that init "
                  "and ops are bounded by their timeouts; only blocking=0 is accepted");
    }
    if (s.is_ok()) c.blocking = 0;
  } else if (key == "cga_cluster_size") {
    s = parse_range(key, value, 0, 8, &c.cga_cluster_size);
  } else if (key == "min_ctas") {
    s = parse_range(key, value, 1, kMaxCtas, &c.min_ctas);
  } else if (key == "max_ctas") {
    s = parse_range(key, value, 1, kMaxCtas, &c.max_ctas);
  } else if (key == "net_name") {
    auto name = canonical_net_name(value);
    if (!name) {
      s = invalid(key, value,
                  "unknown network (or not printable); NCCL's built-in ones are IB and Socket (add a net "
                  "plugin's names to COMMS_NCCL_NET_NAMES)");
    } else {
      c.net_name = *name;
    }
  } else if (key == "split_share") {
    s = parse_flag(key, value, &c.split_share);
  } else if (key == "traffic_class") {
    s = parse_range(key, value, 0, 255, &c.traffic_class);
  } else if (key == "comm_name") {
    const std::string v = trim(value);
    const bool printable = std::all_of(v.begin(), v.end(), [](unsigned char ch) {
      return std::isprint(ch) != 0;
    });
    if (v.empty() || !printable) {
      s = invalid(key, value, "must be a non-empty printable name");
    } else {
      c.comm_name = v;
    }
  } else if (key == "collnet_enable") {
    s = parse_flag(key, value, &c.collnet_enable);
  } else if (key == "cta_policy") {
    int p = 0;
    s = parse_cta_policy(key, value, version, &p);
    if (s.is_ok()) c.cta_policy = p;
  } else if (key == "shrink_share") {
    s = parse_flag(key, value, &c.shrink_share);
  } else if (key == "nvls_ctas") {
    s = parse_range(key, value, 1, kMaxCtas, &c.nvls_ctas);
  } else if (key == "nchannels_per_net_peer") {
    s = parse_range(key, value, 1, kMaxCtas, &c.nchannels_per_net_peer);
  } else if (key == "nvlink_centric_sched") {
    s = parse_flag(key, value, &c.nvlink_centric_sched);
  } else if (key == "graph_usage_mode") {
    // The values NCCL's parseCommConfig accepts (2, its default, lets graphs mix with eager ops).
    s = parse_range(key, value, 0, 2, &c.graph_usage_mode);
  } else if (key == "num_rma_ctx") {
    s = parse_range(key, value, 0, kMaxRmaCtx, &c.num_rma_ctx);
  } else if (key == "max_p2p_peers") {
    s = parse_range(key, value, 1, kMaxP2pPeers, &c.max_p2p_peers);
  } else if (key == "graph_stream_ordering") {
    s = parse_flag(key, value, &c.graph_stream_ordering);
  } else if (key == "high_priority_stream") {
    bool b = false;
    s = parse_bool(key, value, &b);
    if (s.is_ok()) t->priority = b ? StreamPriority::kHigh : StreamPriority::kDefault;
  }
  return s;
}

}  // namespace

Status translate_hints(const Hints& hints, int version, TranslatedHints* out) {
  // The core refuses "k" with "nccl.k" when it routes hints; the plugin
  // must not let one silently win either, whoever calls it.
  for (const auto& [key, value] : hints) {
    if (key.starts_with("nccl.") && hints.count(key.substr(5))) {
      return {ErrorCode::kInvalidArgument, "nccl hints " + key.substr(5) + "=" + hints.find(key.substr(5))->second +
                                               " and " + key + "=" + value + " both set " + key.substr(5) +
                                               "; give it once"};
    }
  }
  TranslatedHints t;
  NcclConfigFields& c = t.config;
  for (const auto& [raw_key, value] : hints) {
    std::string_view key = raw_key;
    if (key.starts_with("nccl.")) key.remove_prefix(5);
    const int needed = min_nccl_version_for(key);
    if (needed < 0) {
      return invalid(key, value, "unknown key; the nccl backend accepts " + known_keys_list());
    }
    if (needed > version) {
      return {ErrorCode::kUnsupported,
              "nccl hint " + std::string(key) + "=" + value + ": needs NCCL >= " +
                  nccl_version_string(needed) + " (ncclConfig_t has no such field before it); "
                  "the loaded NCCL is " + nccl_version_string(version)};
    }
    if (Status s = parse_key(key, value, version, &t); !s.is_ok()) return s;
  }
  if (c.min_ctas && c.max_ctas && *c.min_ctas > *c.max_ctas) {
    return {ErrorCode::kInvalidArgument,
            "nccl hints min_ctas=" + std::to_string(*c.min_ctas) + " and max_ctas=" +
                std::to_string(*c.max_ctas) + ": min_ctas must not exceed max_ctas"};
  }
  *out = std::move(t);
  return {};
}

NcclConfigFields plugin_config_fields(NcclConfigFields hinted, const std::string& comm_name) {
  hinted.blocking = 0;
  if (!hinted.comm_name) hinted.comm_name = comm_name;
  return hinted;
}

Hints merge_split_hints(const Hints& parent, const Hints& call) {
  Hints merged;
  for (const auto& [k, v] : parent) {
    if (k != "comm_name" && k != "nccl.comm_name") merged[k] = v;
  }
  for (const auto& [k, v] : call) {
    // A prefixed and an unprefixed spelling of one key must not both survive.
    std::string key = k.starts_with("nccl.") ? k.substr(5) : k;
    merged.erase("nccl." + key);
    merged[key] = v;
  }
  return merged;
}

namespace {

nlohmann::ordered_json config_object(const NcclConfigFields& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  auto put = [&j](const char* name, const auto& field) {
    if (field) j[name] = *field;
    else j[name] = nullptr;
  };
  put("blocking", c.blocking);
  put("cga_cluster_size", c.cga_cluster_size);
  put("min_ctas", c.min_ctas);
  put("max_ctas", c.max_ctas);
  put("net_name", c.net_name);
  put("split_share", c.split_share);
  put("traffic_class", c.traffic_class);
  put("comm_name", c.comm_name);
  put("collnet_enable", c.collnet_enable);
  put("cta_policy", c.cta_policy);
  put("shrink_share", c.shrink_share);
  put("nvls_ctas", c.nvls_ctas);
  put("nchannels_per_net_peer", c.nchannels_per_net_peer);
  put("nvlink_centric_sched", c.nvlink_centric_sched);
  put("graph_usage_mode", c.graph_usage_mode);
  put("num_rma_ctx", c.num_rma_ctx);
  put("max_p2p_peers", c.max_p2p_peers);
  put("graph_stream_ordering", c.graph_stream_ordering);
  return j;
}

}  // namespace

std::string config_json(const NcclConfigFields& c) {
  return config_object(c).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // net_name may not be UTF-8
}

std::string explain_json(const TranslatedHints& t) {
  nlohmann::ordered_json j;
  j["nccl_config"] = config_object(t.config);
  j["high_priority_stream"] = t.priority == StreamPriority::kHigh;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // hint and name text may not be UTF-8
}

}  // namespace comms::nccl
