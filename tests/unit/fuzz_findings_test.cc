// Inputs the fuzz targets (tests/fuzz) found mishandled, fed here byte for
// byte through the normal build so that the suite keeps them fixed. Each is
// also in its target's corpus under tests/fuzz/corpus/.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comms/bootstrap.h"
#include "comms/error.h"
#include "comms/options.h"
#include "config/env.h"
#include "plugins/plugin_registry.h"

namespace comms {
namespace {

ErrorCode duration_error(const std::string& text, std::string* message = nullptr) {
  try {
    env::parse_duration(text, "COMMS_OP_TIMEOUT");
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return ErrorCode::kOk;
}

// fuzz_env: "nan" passed every comparison and was cast to an integer (UB;
// on x86 a negative timeout).
TEST(FuzzFindings, ADurationOfNanIsAnErrorNamingTheVariable) {
  std::string message;
  EXPECT_EQ(duration_error("nan", &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("COMMS_OP_TIMEOUT='nan'"), std::string::npos) << message;
  EXPECT_EQ(duration_error("NaNs"), ErrorCode::kInvalidArgument);
}

// fuzz_env: a positive value under half a millisecond was read as a 0 ms timeout.
TEST(FuzzFindings, ADurationThatRoundsToNoMillisecondsIsAnError) {
  EXPECT_EQ(duration_error("0.4ms"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(duration_error("0.0001"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(env::parse_duration("0.5ms", "X").count(), 1);
}

// fuzz_env: "333333333s" was accepted but the same time in ms,
// "333333333000ms", was not: the bound was on the number, not the time.
TEST(FuzzFindings, EveryAcceptedDurationIsAlsoAcceptedInMilliseconds) {
  EXPECT_EQ(env::parse_duration("333333333s", "X").count(), 333333333000);
  EXPECT_EQ(env::parse_duration("333333333000ms", "X").count(), 333333333000);
  EXPECT_EQ(env::parse_duration("1e9", "X").count(), 1'000'000'000'000);
  EXPECT_EQ(duration_error("1e9h"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(duration_error("1000000000001ms"), ErrorCode::kInvalidArgument);
}

// fuzz_env: from_chars reads "-0" after the '+' was dropped, so "+-0" and
// "+-5" were integers.
TEST(FuzzFindings, AnIntegerVariableWithBothSignsIsAnError) {
  const char* before = std::getenv("COMMS_LOCAL_RANK");
  const std::string saved = before ? before : "";
  for (const char* bad : {"+-0\n", "+-5", " +-2147483648"}) {
    setenv("COMMS_LOCAL_RANK", bad, 1);
    EXPECT_THROW(env::get_int("COMMS_LOCAL_RANK", 0), Error) << bad;
  }
  setenv("COMMS_LOCAL_RANK", " +7 ", 1);
  EXPECT_EQ(env::get_int("COMMS_LOCAL_RANK", 0), 7);
  if (before) setenv("COMMS_LOCAL_RANK", saved.c_str(), 1);
  else unsetenv("COMMS_LOCAL_RANK");
}

// Sets launcher variables for one test and restores every family after it.
class LauncherVariables {
 public:
  LauncherVariables() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~LauncherVariables() {
    for (const auto& [name, v] : saved_) {
      if (v) setenv(name, v->c_str(), 1);
      else unsetenv(name);
    }
  }

 private:
  static constexpr const char* kNames[] = {
      "COMMS_RANK", "COMMS_WORLD_SIZE", "COMMS_LOCAL_RANK", "COMMS_LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE",
      "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

// fuzz_env: "\x033\n8\n2147483647\0...\0" "0\n4(": SLURM_LOCALID=2147483647 with
// SLURM_NTASKS_PER_NODE=4( made local_world_size = local_rank + 1 overflow
// (UB; in practice a negative local world size).
TEST(FuzzFindings, ALocalRankOutsideTheWorldIsAnError) {
  LauncherVariables guard;
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", std::string("2147483647\0\0", 12).c_str(), 1);
  setenv("SLURM_NTASKS_PER_NODE", "4(", 1);
  try {
    const BootstrapInfo info = bootstrap_from_environment();
    ADD_FAILURE() << "accepted: local rank " << info.local_rank << " of " << info.local_world_size;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("SLURM_LOCALID=2147483647 is not below SLURM_NTASKS=8"), std::string::npos)
        << e.what();
  }
  // A node with fewer tasks than this rank's local id (SLURM's "2,4") still widens.
  setenv("SLURM_LOCALID", "3", 1);
  setenv("SLURM_NTASKS_PER_NODE", "2,4", 1);
  const BootstrapInfo info = bootstrap_from_environment();
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.local_world_size, 4);
}

// fuzz_gloo_hints: "hostname=h,interface=eth0" was accepted and the hostname
// silently dropped (each hint clears the other's variable, in key order).
TEST(FuzzFindings, GlooInterfaceAndHostnameHintsTogetherAreAnError) {
  const auto& gloo = internal::PluginRegistry::instance().get("gloo");
  ASSERT_NE(gloo.descriptor->explain_hints, nullptr);
  std::string json;
  const Status s = gloo.descriptor->explain_hints(parse_hints("hostname=h,interface=eth0"), &json);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument) << json;
  EXPECT_NE(s.message.find("gloo.interface='eth0' and gloo.hostname='h' are both given"), std::string::npos) << s.message;
  EXPECT_TRUE(gloo.descriptor->explain_hints(parse_hints("interface=lo"), &json).is_ok());
}

// fuzz_gloo_hints: an empty hostname hint was reported instead of an
// unknown key that sorted after it ("\310...bname"), so the unknown key
// went unnamed; keys are now all checked before any value.
TEST(FuzzFindings, AnUnknownGlooHintIsNamedEvenWhenAnEmptyHostnameSortsBeforeIt) {
  const auto& gloo = internal::PluginRegistry::instance().get("gloo");
  const std::string input =
      "gloo.hostname=,"
      "\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310\310"
      "\310\310\310\310\310\310\310bname=,busy_poll=1y_\220\220\223\223\302\316\302\323";
  Hints hints;  // as the target: the core removes the "gloo." prefix
  for (const auto& [k, v] : parse_hints(input)) hints[k.starts_with("gloo.") ? k.substr(5) : k] = v;
  std::string json;
  const Status s = gloo.descriptor->explain_hints(hints, &json);
  EXPECT_EQ(s.code, ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message.find("unknown gloo hint '\310\310"), std::string::npos) << s.message;
  // An empty hint with only known keys is still an error of its own.
  const Status empty = gloo.descriptor->explain_hints(parse_hints("hostname="), &json);
  EXPECT_NE(empty.message.find("hint gloo.hostname is empty"), std::string::npos) << empty.message;
}

}  // namespace
}  // namespace comms
