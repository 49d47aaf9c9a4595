// The NCCL plugin's translation of hints (backends/nccl/nccl_hints.h), for
// every NCCL version the plugin gates keys on. Input lines:
//   1  the comm's hints, "k=v,..." (parsed with comms::parse_hints)
//   2  a split call's hints (merge_split_hints with line 1)
//   3  COMMS_NCCL_NET_NAMES, when the line is present
// Properties:
//   - translate_hints returns ok, kInvalidArgument or kUnsupported; an error
//     names one of the keys given; a key given both bare and prefixed ("k"
//     and "nccl.k") is kInvalidArgument at every version, and a doubly
//     prefixed one ("nccl.nccl.k") is refused at every version;
//   - accepted fields are in NCCL's ranges, come from a key that was given,
//     and every key is one the version has;
//   - what a version accepts, every later version accepts the same way;
//   - explain_json is valid JSON, and the values it reports, given back as
//     hints, translate to the same result;
//   - merge_split_hints (of hints the core routes: no key twice, no
//     nccl.nccl.*) keeps the call's values, drops comm_name from the parent
//     and never keeps both spellings of a key.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comms/options.h"
#include "fuzz_check.h"
#include "nccl_hints.h"

namespace {

using comms::Hints;
using comms::nccl::TranslatedHints;

// The oldest supported NCCL, each release that added keys, and a newer one.
constexpr int kVersions[] = {21400, 21700, 21800, 22700, 22800, 22809, 22900, 23003, 23006, 23203};

std::string bare(const std::string& key) { return key.starts_with("nccl.") ? key.substr(5) : key; }

bool given(const Hints& h, const std::string& key) { return h.count(key) || h.count("nccl." + key); }

std::string describe(const Hints& h) { return "hints '" + comms::format_hints(h) + "'"; }

void check_ranges(const TranslatedHints& t, const Hints& h) {
  const auto& c = t.config;
  auto in = [](const std::optional<int>& v, int lo, int hi) { return !v || (*v >= lo && *v <= hi); };
  FUZZ_CHECK(in(c.blocking, 0, 0) && in(c.cga_cluster_size, 0, 8) && in(c.min_ctas, 1, 64) &&
                 in(c.max_ctas, 1, 64) && in(c.split_share, 0, 1) && in(c.traffic_class, 0, 255) &&
                 in(c.collnet_enable, 0, 1) && in(c.cta_policy, 0, 2) && in(c.shrink_share, 0, 1) &&
                 in(c.nvls_ctas, 1, 64) && in(c.nchannels_per_net_peer, 1, 64) && in(c.nvlink_centric_sched, 0, 1) &&
                 in(c.graph_usage_mode, 0, 2) && in(c.num_rma_ctx, 0, 64) && in(c.max_p2p_peers, 1, 1 << 20) &&
                 in(c.graph_stream_ordering, 0, 1),
             "a field out of NCCL's range from " + describe(h));
  FUZZ_CHECK(!c.min_ctas || !c.max_ctas || *c.min_ctas <= *c.max_ctas, "min_ctas > max_ctas from " + describe(h));
  if (c.comm_name) {
    const std::string& n = *c.comm_name;
    FUZZ_CHECK(!n.empty() && !std::isspace(static_cast<unsigned char>(n.front())) &&
                   !std::isspace(static_cast<unsigned char>(n.back())),
               "comm_name '" + n + "' is empty or untrimmed");
    for (unsigned char ch : n) FUZZ_CHECK(std::isprint(ch), "comm_name with an unprintable byte");
  }
}

// The hints that say what `j` (explain_json's nccl_config) reports.
Hints hints_from_explanation(const nlohmann::json& j) {
  Hints h;
  for (const auto& [k, v] : j["nccl_config"].items()) {
    if (v.is_null()) continue;
    h[k] = v.is_string() ? v.get<std::string>() : std::to_string(v.get<int>());
  }
  h["high_priority_stream"] = j["high_priority_stream"].get<bool>() ? "1" : "0";
  return h;
}

// The key given both as "k" and "nccl.k", if any.
std::optional<std::string> twice(const Hints& h) {
  for (const auto& [k, v] : h)
    if (h.count("nccl." + k)) return k;
  return std::nullopt;
}

bool doubly_prefixed(const Hints& h) {
  for (const auto& [k, v] : h)
    if (k.starts_with("nccl.nccl.")) return true;
  return false;
}

// Translates at every version; returns the result at the newest.
std::optional<TranslatedHints> check_translation(const Hints& h) {
  const auto both = twice(h);
  const bool malformed = both || doubly_prefixed(h);
  std::optional<TranslatedHints> accepted_at_older;
  std::optional<TranslatedHints> last;
  for (int version : kVersions) {
    TranslatedHints t;
    const comms::Status s = comms::nccl::translate_hints(h, version, &t);
    if (!s.is_ok()) {
      FUZZ_CHECK(s.code == comms::ErrorCode::kInvalidArgument || s.code == comms::ErrorCode::kUnsupported,
                 "translate_hints failed with " + std::string(comms::to_string(s.code)) + ": " + s.message);
      bool names_a_key = false;
      for (const auto& [k, v] : h) names_a_key = names_a_key || s.message.find(bare(k)) != std::string::npos;
      FUZZ_CHECK(names_a_key, "the error names no key of " + describe(h) + ": " + s.message);
      if (both) {
        FUZZ_CHECK(s.code == comms::ErrorCode::kInvalidArgument &&
                       s.message.find("nccl." + *both) != std::string::npos,
                   "'" + *both + "' given twice is not rejected naming it: " + describe(h) + ": " + s.message);
      }
      FUZZ_CHECK(!accepted_at_older, "accepted by an older NCCL, rejected at " + std::to_string(version) + ": " +
                                         describe(h) + ": " + s.message);
      last.reset();
      continue;
    }
    FUZZ_CHECK(!malformed, "a key given twice or as nccl.nccl.* accepted at " + std::to_string(version) + ": " +
                               describe(h));
    if (accepted_at_older) {
      FUZZ_CHECK(t == *accepted_at_older, "a newer NCCL translates " + describe(h) + " differently");
    }
    accepted_at_older = t;
    last = t;
    for (const auto& [k, v] : h) {
      const int needed = comms::nccl::min_nccl_version_for(bare(k));
      FUZZ_CHECK(needed >= 0 && needed <= version, "key '" + k + "' accepted at " + std::to_string(version));
    }
    check_ranges(t, h);
    if (version != kVersions[std::size(kVersions) - 1]) continue;  // the same t at every later version

    const std::string json = comms::nccl::explain_json(t);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(json);
    } catch (const nlohmann::json::exception& e) {
      fuzz::fail(FUZZ_HERE, "explain_json is not JSON", json + ": " + e.what());
    }
    for (const auto& [k, v] : j["nccl_config"].items()) {
      if (!v.is_null()) FUZZ_CHECK(given(h, k), "field '" + k + "' set though no hint gave it: " + describe(h));
    }
    if (j["high_priority_stream"].get<bool>()) FUZZ_CHECK(given(h, "high_priority_stream"), describe(h));
    const Hints back = hints_from_explanation(j);
    TranslatedHints again;
    const comms::Status s2 = comms::nccl::translate_hints(back, version, &again);
    FUZZ_CHECK(s2.is_ok() && again == t, "the explained values " + describe(back) + " of " + describe(h) +
                                             " do not translate back: " + s2.message);
  }
  return last;
}

void check_merge(const Hints& parent, const Hints& call) {
  const Hints merged = comms::nccl::merge_split_hints(parent, call);
  for (const auto& [k, v] : merged) {
    FUZZ_CHECK(!(k.starts_with("nccl.") && merged.count(k.substr(5))), "both spellings of '" + k + "' kept");
    if (bare(k) == "comm_name") FUZZ_CHECK(given(call, "comm_name"), "comm_name inherited from the parent");
  }
  for (const auto& [k, v] : call) {
    FUZZ_CHECK(merged.count(bare(k)) && merged.at(bare(k)) == v, "the call's '" + k + "' lost");
  }
  for (const auto& [k, v] : parent) {
    if (bare(k) == "comm_name" || given(call, bare(k))) continue;
    FUZZ_CHECK(merged.count(k) && merged.at(k) == v, "the parent's '" + k + "' lost");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> lines;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (lines.size() < 3) {
    const size_t nl = rest.find('\n');
    lines.emplace_back(rest.substr(0, nl));
    if (nl == rest.npos) break;
    rest.remove_prefix(nl + 1);
  }
  if (lines.size() == 3) setenv("COMMS_NCCL_NET_NAMES", lines[2].c_str(), 1);
  else unsetenv("COMMS_NCCL_NET_NAMES");

  Hints hints, call;
  try {
    hints = comms::parse_hints(lines[0]);
    if (lines.size() > 1) call = comms::parse_hints(lines[1]);
  } catch (const comms::Error&) {
    return -1;  // not a hint string: fuzz_hints covers the parser
  }
  check_translation(hints);
  if (lines.size() > 1) {
    check_translation(call);
    // The core refuses both spellings of a key and nccl.nccl.* when it
    // routes hints, so such hints never reach a split's merge.
    if (!twice(hints) && !doubly_prefixed(hints) && !twice(call) && !doubly_prefixed(call)) check_merge(hints, call);
  }
  return 0;
}
