// The Gloo backend's bind address is checked before Gloo sees it: a host name
// that does not resolve used to crash Gloo's CreateDevice (SIGSEGV), and one
// with a quote broke describe()'s JSON. Every error names the variable or
// hint, the value and why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "comms/comms.h"

namespace comms {
namespace {

// A one-rank comm on the Gloo backend, created eagerly (Device::cpu()), so
// the backend resolves its configuration at once.
std::shared_ptr<Comm> gloo_comm(const std::string& name, Hints hints = {}) {
  CommOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.hints = std::move(hints);
  return new_comm("gloo", Device::cpu(), name, o);
}

std::string creation_error(const std::string& name, Hints hints = {}) {
  try {
    gloo_comm(name, std::move(hints));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "comm '" << name << "' was created";
  return {};
}

class GlooBindAddress : public ::testing::Test {
 protected:
  void TearDown() override {
    unsetenv("COMMS_GLOO_HOSTNAME");
    unsetenv("COMMS_GLOO_IFNAME");
  }
};

#define EXPECT_MENTIONS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(GlooBindAddress, AHostNameThatDoesNotResolveIsAnErrorNamingTheVariable) {
  setenv("COMMS_GLOO_HOSTNAME", "-1", 1);
  const std::string e = creation_error("host-minus-one");
  EXPECT_MENTIONS(e, "COMMS_GLOO_HOSTNAME='-1' does not resolve");
}

TEST_F(GlooBindAddress, AHostNameWithAQuoteIsRefusedBeforeItReachesDescribe) {
  const std::string e = creation_error("host-quote", {{"gloo.hostname", "a\"b"}});
  EXPECT_MENTIONS(e, "hint gloo.hostname='a\"b' does not resolve");
}

TEST_F(GlooBindAddress, AnAddressOfAnotherHostIsAnErrorSayingItCannotBeBound) {
  // 198.51.100.0/24 is a documentation range: never this host's.
  const std::string e = creation_error("host-remote", {{"gloo.hostname", "198.51.100.7"}});
  EXPECT_MENTIONS(e, "hint gloo.hostname='198.51.100.7' resolves to 198.51.100.7, which this host cannot bind");
}

TEST_F(GlooBindAddress, TheWildcardAddressIsAnErrorSinceItIsNoInterfacesAddress) {
  const std::string e = creation_error("host-any", {{"gloo.hostname", "0.0.0.0"}});
  EXPECT_MENTIONS(e, "hint gloo.hostname='0.0.0.0' resolves to 0.0.0.0, which is no interface's address");
}

TEST_F(GlooBindAddress, AnInterfaceThatDoesNotExistIsAnErrorListingTheInterfaces) {
  setenv("COMMS_GLOO_IFNAME", "nosuchif0", 1);
  const std::string e = creation_error("iface-missing");
  EXPECT_MENTIONS(e, "COMMS_GLOO_IFNAME='nosuchif0' is not a network interface of this host; its interfaces are");
  EXPECT_MENTIONS(e, "lo");
}

TEST_F(GlooBindAddress, AnEmptyHintIsAnErrorNotTheDefault) {
  EXPECT_MENTIONS(creation_error("iface-empty", {{"gloo.interface", ""}}), "hint gloo.interface is empty");
  EXPECT_MENTIONS(creation_error("host-empty", {{"gloo.hostname", ""}}), "hint gloo.hostname is empty");
}

TEST_F(GlooBindAddress, AHintWithANulOrControlByteIsRefusedNotCheckedOnItsCutCString) {
  // "127.0.0.1" and "lo" pass the checks; what follows the NUL used to be
  // ignored by getaddrinfo / the interface lookup, so these were accepted.
  const std::string host_nul("127.0.0.1\0.evil", 15);
  EXPECT_MENTIONS(creation_error("host-nul", {{"gloo.hostname", host_nul}}),
                  "hint gloo.hostname='127.0.0.1\\x00.evil' contains a control character");
  EXPECT_MENTIONS(creation_error("iface-nul", {{"gloo.interface", std::string("lo\0x", 4)}}),
                  "hint gloo.interface='lo\\x00x' contains a control character");
  EXPECT_MENTIONS(creation_error("host-newline", {{"gloo.hostname", "localhost\n"}}),
                  "hint gloo.hostname='localhost\\x0a' contains a control character");
  EXPECT_MENTIONS(creation_error("iface-tab", {{"gloo.interface", "lo\t"}}),
                  "hint gloo.interface='lo\\x09' contains a control character");
}

TEST_F(GlooBindAddress, InterfaceAndHostNameHintsTogetherAreAnErrorNotOneSilentlyWinning) {
  EXPECT_MENTIONS(creation_error("both", {{"gloo.interface", "lo"}, {"gloo.hostname", "127.0.0.1"}}),
                  "hints gloo.interface='lo' and gloo.hostname='127.0.0.1' are both given; give one");
}

TEST_F(GlooBindAddress, LoopbackByNameAndByAddressWorkAndDescribeIsJson) {
  setenv("COMMS_GLOO_HOSTNAME", "-1", 1);  // the hint wins over it, and it is not checked then
  for (const auto& [key, value] : {std::pair{"gloo.interface", "lo"}, {"gloo.hostname", "localhost"},
                                   {"gloo.hostname", "127.0.0.1"}}) {
    auto c = gloo_comm(std::string("loopback-") + value, {{key, value}});
    const auto j = nlohmann::json::parse(c->describe());
    const auto& config = j["backends"]["cpu"]["config"];
    ASSERT_TRUE(config.is_object()) << j.dump();
    const std::string field = std::string(key) == "gloo.interface" ? "interface" : "hostname";
    EXPECT_EQ(config[field], value) << j.dump();
    // A one-rank comm copies every op (describe()'s path table).
    EXPECT_EQ(config["paths"]["all_reduce"].dump(), R"([{"max_bytes":null,"path":"one-rank copy"}])") << j.dump();
  }
}

TEST_F(GlooBindAddress, BusyPollTakesAutoOrABooleanAndNamesItsSource) {
  EXPECT_EQ(nlohmann::json::parse(gloo_comm("poll-yes", {{"gloo.busy_poll", "yes"}})->describe())["backends"]["cpu"]
                ["config"]["busy_poll"],
            "1");
  EXPECT_MENTIONS(creation_error("poll-bad", {{"gloo.busy_poll", "sometimes"}}),
                  "hint gloo.busy_poll='sometimes' is not auto or a boolean");
  setenv("COMMS_GLOO_BUSY_POLL", "often", 1);
  const std::string e = creation_error("poll-env");
  unsetenv("COMMS_GLOO_BUSY_POLL");
  EXPECT_MENTIONS(e, "COMMS_GLOO_BUSY_POLL='often' is not auto or a boolean");
}

}  // namespace
}  // namespace comms
