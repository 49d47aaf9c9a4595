// One owner for NCCL's keys: the plugin's key table (nccl_hints.h) is the
// source, and comms::dist's typed NcclOptions, through their one table of
// spellings (kOptionSpellings), are checked against it, so a key the plugin
// gains without a typed option (or a typed option the plugin does not
// accept) fails here.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

#include "comms/dist.h"
#include "nccl_hints.h"

namespace comms {
namespace {

// Plugin keys with no typed option, and why.
const std::map<std::string, std::string> kNotTyped = {
    {"blocking", "communicators are always non-blocking; only blocking=0 is accepted"},
    {"comm_name", "each group's NCCL communicator is named after the group"},
    // Newer than torch's and Megatron's NCCL options: set as nccl.<key> hints.
    {"graph_usage_mode", "NCCL 2.29's; neither torch nor Megatron names it"},
    {"num_rma_ctx", "NCCL 2.29's; neither torch nor Megatron names it"},
    {"max_p2p_peers", "NCCL 2.30's; neither torch nor Megatron names it"},
    {"graph_stream_ordering", "NCCL 2.30's; neither torch nor Megatron names it"},
};

// Calls `f` on every field of NcclOptions. A structured binding must name
// every field, so a field added to NcclOptions without a name here fails to
// compile instead of escaping the checks below.
template <class F>
void for_each_field(dist::NcclOptions& o, F f) {
  auto& [is_high_priority_stream, cga_cluster_size, min_ctas, max_ctas, net_name, split_share,
         traffic_class, collnet_enable, cta_policy, shrink_share, nvls_ctas,
         nchannels_per_net_peer, nvlink_centric_sched] = o;
  f(is_high_priority_stream);
  f(cga_cluster_size);
  f(min_ctas);
  f(max_ctas);
  f(net_name);
  f(split_share);
  f(traffic_class);
  f(collnet_enable);
  f(cta_policy);
  f(shrink_share);
  f(nvls_ctas);
  f(nchannels_per_net_peer);
  f(nvlink_centric_sched);
}

constexpr int kFieldCount = 13;

// A value every key accepts for its type: 1 is in range for every integer
// key (a CTA count, a flag, a class, the efficiency CTA policy), IB is a net.
template <class T>
void set_sample(std::optional<T>& field) {
  if constexpr (std::is_same_v<T, bool>) field = true;
  else if constexpr (std::is_same_v<T, int>) field = 1;
  else field = std::string("IB");
}

// The hints the typed option `index` (alone) becomes.
Hints hints_of_field(int index) {
  dist::BackendOptions options;
  int i = 0;
  for_each_field(options.nccl, [&](auto& field) {
    if (i++ == index) set_sample(field);
  });
  EXPECT_EQ(i, kFieldCount);
  return dist::to_hints(options);
}

std::set<std::string> plugin_keys() {
  std::set<std::string> keys;
  for (const char* k : nccl::hint_keys()) keys.insert(k);
  return keys;
}

TEST(NcclKeyOwnership, EveryTypedNcclOptionBecomesExactlyOneKeyThePluginAccepts) {
  const std::set<std::string> plugin = plugin_keys();
  for (int i = 0; i < kFieldCount; ++i) {
    const Hints h = hints_of_field(i);
    ASSERT_EQ(h.size(), 1u) << "NcclOptions field #" << i << " gives " << h.size() << " hints";
    const std::string& key = h.begin()->first;
    ASSERT_TRUE(key.starts_with("nccl.")) << key << " is not routed to the nccl backend";
    EXPECT_TRUE(plugin.count(key.substr(5)))
        << "NcclOptions field #" << i << " becomes " << key
        << ", which the NCCL plugin's key table (nccl_hints.h) does not have";
    // The value is one the plugin takes (any NCCL version: this checks
    // names and values, not the linked release).
    nccl::TranslatedHints t;
    Status s = nccl::translate_hints(h, 99'99'99, &t);
    EXPECT_TRUE(s.is_ok()) << key << "=" << h.begin()->second << ": " << s.message;
  }
}

TEST(NcclKeyOwnership, EveryPluginKeyHasATypedNcclOptionOrAStatedReason) {
  std::set<std::string> typed;
  for (int i = 0; i < kFieldCount; ++i) {
    const Hints h = hints_of_field(i);
    if (h.size() == 1) {
      const bool fresh = typed.insert(h.begin()->first.substr(5)).second;
      EXPECT_TRUE(fresh) << "two NcclOptions fields both set " << h.begin()->first;
    }
  }
  for (const std::string& key : plugin_keys()) {
    if (kNotTyped.count(key)) {
      EXPECT_FALSE(typed.count(key)) << key << " has a typed option; drop it from kNotTyped";
      continue;
    }
    EXPECT_TRUE(typed.count(key)) << "the NCCL plugin accepts " << key
                                  << " but dist::NcclOptions has no field for it (a field and a row of "
                                     "kOptionSpellings in include/comms/dist.h)";
  }
  for (const auto& [key, why] : kNotTyped) {
    EXPECT_TRUE(plugin_keys().count(key)) << key << " is listed as untyped but the plugin has no such key";
  }
}

}  // namespace
}  // namespace comms
