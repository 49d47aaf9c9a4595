// Every variable of docs/ENVIRONMENT.md is checked where it is read: a
// malformed value is an error naming the variable and the value. The test
// walks the whole table; a variable added to it without a malformed case
// here, or a reason why it has none, fails the first test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm_impl.h"
#include "comms/comms.h"
#include "config/env.h"
#include "plugins/plugin_registry.h"
#include "subprocess.h"

namespace comms {
namespace {

using namespace std::chrono_literals;

struct Malformed {
  std::string variable;  // as set: a family (COMMS_BACKEND_LIB_<NAME>) sets one member
  std::string value;
  std::map<std::string, std::string> with = {};  // what it is read together with
};

// For each documented variable: a malformed value, or why it has none.
struct Decision {
  std::optional<Malformed> malformed;
  const char* no_malformed_form = nullptr;
};

const std::map<std::string, Decision>& decisions() {
  static const std::map<std::string, std::string> rank0 = {{"COMMS_RANK", "0"}, {"COMMS_WORLD_SIZE", "1"}};
  // Two ranks under srun: the store's address comes from Slurm's variables.
  static const std::map<std::string, std::string> slurm_job = {
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "localhost"}};
  static const std::map<std::string, std::string> slurm_nodes = {
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "1"}};
  static const std::map<std::string, Decision> d = {
      {"COMMS_BACKEND", {Malformed{"COMMS_BACKEND", "cpu=gloo"}}},
      {"COMMS_ROUTE", {Malformed{"COMMS_ROUTE", "sideways"}}},
      {"COMMS_INIT_TIMEOUT", {Malformed{"COMMS_INIT_TIMEOUT", "soon"}}},
      {"COMMS_OP_TIMEOUT", {Malformed{"COMMS_OP_TIMEOUT", "nan"}}},
      {"COMMS_ELASTIC", {Malformed{"COMMS_ELASTIC", "maybe"}}},
      {"COMMS_ELASTIC_LIVENESS_TIMEOUT", {Malformed{"COMMS_ELASTIC_LIVENESS_TIMEOUT", "briefly"}}},
      {"COMMS_STORE", {Malformed{"COMMS_STORE", "http://host:1"}}},
      {"COMMS_LAUNCHER_STORE",
       {Malformed{"COMMS_LAUNCHER_STORE", "maybe", {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}}}},
      {"COMMS_STORE_TOKEN", {std::nullopt, "a secret of any bytes; a wrong one is refused by the store, which the "
                                           "StoreAuth tests cover"}},
      {"COMMS_STORE_TOKEN_FILE",
       {Malformed{"COMMS_STORE_TOKEN_FILE", "/nonexistent/token", {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}}}}},
      {"COMMS_REPLACEMENT", {std::nullopt, "its presence, not its value, is what a program reads; libcomms never reads it"}},
      {"COMMS_PLUGIN_PATH", {std::nullopt, "a list of directories, searched in turn; one that does not exist is "
                                           "skipped, as PATH does"}},
      {"COMMS_BACKEND_LIB_<NAME>", {Malformed{"COMMS_BACKEND_LIB_GLOO", "/nonexistent/libcomms-gloo.so"}}},
      {"COMMS_HINTS_STRICT", {Malformed{"COMMS_HINTS_STRICT", "maybe"}}},
      {"COMMS_LOG_LEVEL", {Malformed{"COMMS_LOG_LEVEL", "abc"}}},
      {"COMMS_RANK", {Malformed{"COMMS_RANK", "first", {{"COMMS_WORLD_SIZE", "1"}}}}},
      {"COMMS_WORLD_SIZE", {Malformed{"COMMS_WORLD_SIZE", "one", {{"COMMS_RANK", "0"}}}}},
      {"COMMS_LOCAL_RANK", {Malformed{"COMMS_LOCAL_RANK", "-1", rank0}}},
      {"COMMS_LOCAL_WORLD_SIZE", {Malformed{"COMMS_LOCAL_WORLD_SIZE", "0", rank0}}},
      {"COMMS_TRACE_BUFFER", {Malformed{"COMMS_TRACE_BUFFER", "lots"}}},
      {"COMMS_TRACE_DIR", {std::nullopt, "a directory path; one that cannot be written is logged when a dump is due"}},
      {"COMMS_DEBUG", {Malformed{"COMMS_DEBUG", "verbose"}}},
      {"RANK", {Malformed{"RANK", "0x0", {{"WORLD_SIZE", "1"}}}}},
      {"WORLD_SIZE", {Malformed{"WORLD_SIZE", "1.0", {{"RANK", "0"}}}}},
      {"LOCAL_RANK", {Malformed{"LOCAL_RANK", "zero", {{"RANK", "0"}, {"WORLD_SIZE", "1"}}}}},
      {"LOCAL_WORLD_SIZE", {Malformed{"LOCAL_WORLD_SIZE", "many", {{"RANK", "0"}, {"WORLD_SIZE", "1"}}}}},
      // Rank 0 of a one-rank job hosts the store, so the address is resolved at once.
      {"MASTER_ADDR", {Malformed{"MASTER_ADDR", "-1", {{"MASTER_PORT", "1"}}}}},
      {"MASTER_PORT", {Malformed{"MASTER_PORT", "http", {{"MASTER_ADDR", "127.0.0.1"}}}}},
      {"OMPI_COMM_WORLD_RANK", {Malformed{"OMPI_COMM_WORLD_RANK", "r0", {{"OMPI_COMM_WORLD_SIZE", "1"}}}}},
      {"OMPI_COMM_WORLD_SIZE", {Malformed{"OMPI_COMM_WORLD_SIZE", "-1", {{"OMPI_COMM_WORLD_RANK", "0"}}}}},
      {"OMPI_COMM_WORLD_LOCAL_RANK",
       {Malformed{"OMPI_COMM_WORLD_LOCAL_RANK", "x",
                  {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}}}},
      {"OMPI_COMM_WORLD_LOCAL_SIZE",
       {Malformed{"OMPI_COMM_WORLD_LOCAL_SIZE", "x",
                  {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}}}},
      {"PMI_RANK", {Malformed{"PMI_RANK", "r1", {{"PMI_SIZE", "2"}}}}},
      {"PMI_SIZE", {Malformed{"PMI_SIZE", "2k", {{"PMI_RANK", "0"}}}}},
      {"MPI_LOCALRANKID", {Malformed{"MPI_LOCALRANKID", "x", {{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}}}},
      {"MPI_LOCALNRANKS", {Malformed{"MPI_LOCALNRANKS", "x", {{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}}}},
      {"SLURM_PROCID", {Malformed{"SLURM_PROCID", "x", {{"SLURM_NTASKS", "1"}}}}},
      {"SLURM_NTASKS", {Malformed{"SLURM_NTASKS", "x", {{"SLURM_PROCID", "0"}}}}},
      {"SLURM_LOCALID", {Malformed{"SLURM_LOCALID", "x", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}}}},
      {"SLURM_NTASKS_PER_NODE",
       {Malformed{"SLURM_NTASKS_PER_NODE", "x4", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}}}},
      {"SLURM_JOB_ID", {Malformed{"SLURM_JOB_ID", "x", slurm_job}}},
      {"SLURM_STEP_ID", {std::nullopt, "only names the file store's subfolder with SLURM_JOB_ID; Slurm's own "
                                       "values include words (batch, extern)"}},
      {"SLURM_STEP_NODELIST", {Malformed{"SLURM_STEP_NODELIST", "node[01-", slurm_nodes}}},
      {"SLURM_JOB_NODELIST", {Malformed{"SLURM_JOB_NODELIST", "node]", slurm_nodes}}},
      {"SLURM_NODELIST", {Malformed{"SLURM_NODELIST", "n[a-b]", slurm_nodes}}},
      {"COMMS_JOB_ID", {Malformed{"COMMS_JOB_ID", "a/b", {{"COMMS_STORE", "file:///tmp/comms-env-probe-store"}}}}},
      {"CUDA_VISIBLE_DEVICES", {std::nullopt, "read by commsrun --nproc-per-node=auto only, as CUDA reads it: up "
                                              "to its first invalid entry"}},
      {"PATH", {std::nullopt, "a list of directories commsrun searches for the program, as execvp(3) does; "
                              "one that does not exist is skipped"}},
      {"COMMS_GLOO_IFNAME", {Malformed{"COMMS_GLOO_IFNAME", "nosuchif0"}}},
      {"COMMS_GLOO_HOSTNAME", {Malformed{"COMMS_GLOO_HOSTNAME", "-1"}}},
      {"COMMS_GLOO_BUSY_POLL", {Malformed{"COMMS_GLOO_BUSY_POLL", "sometimes"}}},
      {"UCX_RNDV_THRESH", {std::nullopt, "UCX's own variable: UCX's parser rejects a malformed value when the plugin "
                                         "starts UCX; comms only checks whether it is set"}},
      {"UCX_SYSV_FIFO_ELEM_SIZE", {std::nullopt, "UCX's own variable: UCX's parser rejects a malformed value when "
                                                 "the plugin starts UCX; comms only checks whether it is set"}},
      {"UCX_POSIX_FIFO_ELEM_SIZE", {std::nullopt, "UCX's own variable, as UCX_SYSV_FIFO_ELEM_SIZE"}},
      {"UCX_MM_FIFO_ELEM_SIZE", {std::nullopt, "UCX's own variable, as UCX_SYSV_FIFO_ELEM_SIZE"}},
      {"UCX_SYSV_FIFO_SIZE", {std::nullopt, "UCX's own variable, as UCX_SYSV_FIFO_ELEM_SIZE"}},
      {"UCX_POSIX_FIFO_SIZE", {std::nullopt, "UCX's own variable, as UCX_SYSV_FIFO_ELEM_SIZE"}},
      {"UCX_MM_FIFO_SIZE", {std::nullopt, "UCX's own variable, as UCX_SYSV_FIFO_ELEM_SIZE"}},
#if UCX_PLUGIN_BUILT
      {"COMMS_UCX_BUSY_POLL", {Malformed{"COMMS_UCX_BUSY_POLL", "sometimes", {{"COMMS_BACKEND", "cpu:ucx"}}}}},
      {"COMMS_UCX_SHM", {Malformed{"COMMS_UCX_SHM", "sometimes", {{"COMMS_BACKEND", "cpu:ucx"}}}}},
      {"COMMS_UCX_ZERO_COPY_MIN_BYTES",
       {Malformed{"COMMS_UCX_ZERO_COPY_MIN_BYTES", "1X", {{"COMMS_BACKEND", "cpu:ucx"}}}}},
#else
      {"COMMS_UCX_BUSY_POLL", {std::nullopt, "read only by the UCX plugin, which this build lacks (no libucx-dev)"}},
      {"COMMS_UCX_SHM", {std::nullopt, "read only by the UCX plugin, which this build lacks (no libucx-dev)"}},
      {"COMMS_UCX_ZERO_COPY_MIN_BYTES",
       {std::nullopt, "read only by the UCX plugin, which this build lacks (no libucx-dev)"}},
#endif
      {"COMMS_NCCL_NET_NAMES", {std::nullopt, "names of NCCL net plugins: any comma-separated names are accepted; "
                                              "they only widen what the nccl.net_name hint accepts"}},
      {"COMMS_TEST_REPORT_DIR", {std::nullopt, "test harness only: a directory path"}},
  };
  return d;
}

// Every documented variable's name: libcomms' table, then what each plugin
// found declares (PluginDescriptor::env_variables).
const std::vector<std::string>& documented_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& v : env::documented()) out.push_back(v.name);
    for (const auto& v : internal::PluginRegistry::instance().env_variables()) out.push_back(v.name);
    return out;
  }();
  return names;
}

bool is_documented(const std::string& name) {
  return std::find(documented_names().begin(), documented_names().end(), name) != documented_names().end();
}

// A decision for a plugin's variable names it only when the plugin loads
// here: the plugin of a variable, by its prefix ("" for libcomms').
std::string plugin_of(const std::string& name) {
  if (name.starts_with("COMMS_GLOO_")) return "gloo";
  if (name.starts_with("COMMS_UCX_") || name.starts_with("UCX_")) return "ucx";
  if (name.starts_with("COMMS_NCCL_")) return "nccl";
  return "";
}

bool plugin_loads(const std::string& plugin) {
  for (const auto& p : internal::PluginRegistry::instance().discover()) {
    if (p.name == plugin) return p.descriptor != nullptr;
  }
  return false;
}

// The probe's environment: every documented variable unset (PATH kept), so
// that only the case's variables are in play.
std::map<std::string, std::string> clean_environment() {
  std::map<std::string, std::string> env;
  for (const std::string& name : documented_names()) {
    if (name != "PATH" && name.find('<') == std::string::npos) env[name] = "";
  }
  for (char** e = environ; *e; ++e) {  // e.g. COMMS_BACKEND_LIB_FAKEGPU, set by other tests
    const std::string entry = *e;
    if (entry.rfind("COMMS_BACKEND_LIB_", 0) == 0) env[entry.substr(0, entry.find('='))] = "";
  }
  return env;
}

testing::Process probe(const std::map<std::string, std::string>& overrides) {
  auto env = clean_environment();
  for (const auto& [k, v] : overrides) env[k] = v;
  return testing::run({ENV_PROBE}, env, 30s);
}

TEST(EnvironmentValidation, EveryDocumentedVariableHasAMalformedCaseOrAReasonItHasNone) {
  for (const std::string& name : documented_names()) {
    const auto it = decisions().find(name);
    ASSERT_NE(it, decisions().end())
        << name << " is in the table (core/config/env.cc or a plugin's env_variables) but this test has no decision "
        << "for it: add a malformed value that must be an error, or the reason it has no malformed form";
    EXPECT_TRUE(it->second.malformed.has_value() != (it->second.no_malformed_form != nullptr)) << name;
  }
  for (const auto& [name, decision] : decisions()) {
    if (!plugin_of(name).empty() && !plugin_loads(plugin_of(name))) continue;
    EXPECT_TRUE(is_documented(name)) << name << " has a decision here but is not in the table";
  }
}

TEST(EnvironmentValidation, AMalformedValueOfEveryVariableIsAnErrorNamingItAndTheValue) {
  const auto clean = probe({});
  ASSERT_EQ(clean.exit_code(), 0) << "the probe fails without any variable set: " << clean.output;
  for (const auto& [name, decision] : decisions()) {
    if (!decision.malformed) continue;
    const Malformed& m = *decision.malformed;
    auto overrides = m.with;
    overrides[m.variable] = m.value;
    const auto p = probe(overrides);
    const std::string named = m.variable + "='" + m.value + "'";
    EXPECT_EQ(p.exit_code(), 2) << named << " was not an error (or crashed): " << p.output;
    EXPECT_NE(p.output.find(named), std::string::npos) << "the error does not name " << named << ": " << p.output;
  }
}

TEST(EnvironmentValidation, BooleansAcceptTheUsualSpellingsInAnyCaseAndNothingElse) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "Yes", "on", " on "}) EXPECT_TRUE(env::parse_bool(yes, "X")) << yes;
  for (const char* no : {"0", "false", "False", "no", "NO", "off"}) EXPECT_FALSE(env::parse_bool(no, "X")) << no;
  for (const char* bad : {"", "2", "-1", "y", "n", "truee", "enable", "1.0"}) {
    try {
      env::parse_bool(bad, "COMMS_X");
      ADD_FAILURE() << "'" << bad << "' was read as a boolean";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()), std::string("COMMS_X='") + bad +
                                           "' is not a boolean; use 1/0, true/false, yes/no or on/off");
    }
  }
}

TEST(EnvironmentValidation, LauncherStoreYesMeansTheLauncherHostsTheStoreNotRankZero) {
  const std::map<std::string, std::string> job = {{"MASTER_ADDR", "127.0.0.1"},
                                                  {"MASTER_PORT", std::to_string(comms::testing::free_loopback_port())},
                                                  {"COMMS_INIT_TIMEOUT", "1s"}};
  for (const char* off : {"0", "no", "False"}) {
    auto env = job;
    env["COMMS_LAUNCHER_STORE"] = off;
    const auto p = probe(env);
    EXPECT_EQ(p.exit_code(), 0) << "COMMS_LAUNCHER_STORE=" << off << ": rank 0 should host the store: " << p.output;
  }
  for (const char* on : {"1", "yes", "true", "ON"}) {
    auto env = job;
    env["COMMS_LAUNCHER_STORE"] = on;
    const auto p = probe(env);
    // No launcher runs here, so nothing listens: rank 0 must not have started
    // a store of its own, and its connection times out.
    EXPECT_EQ(p.exit_code(), 2) << "COMMS_LAUNCHER_STORE=" << on << " was read as 0: " << p.output;
    EXPECT_EQ(p.output.find("is not a boolean"), std::string::npos) << p.output;
  }
}

TEST(EnvironmentValidation, HintsStrictFalseMakesAnUnknownHintAWarning) {
  const BackendSpec gloo = BackendSpec::parse("cpu:gloo");
  setenv("COMMS_HINTS_STRICT", "false", 1);
  std::array<Hints, kNumDeviceTypes> routed;
  EXPECT_NO_THROW(routed = internal::route_hints({{"no_such_key", "1"}, {"busy_poll", "0"}}, gloo, "t"));
  EXPECT_EQ(routed[0], (Hints{{"busy_poll", "0"}}));
  setenv("COMMS_HINTS_STRICT", "Yes", 1);
  EXPECT_THROW(internal::route_hints({{"no_such_key", "1"}}, gloo, "t"), Error);
  unsetenv("COMMS_HINTS_STRICT");
}

// torch's test harness sets WORLD_SIZE and passes each rank by hand: the
// caller's rank and size stand, the launcher's pair is neither needed nor
// checked, and a consistent LOCAL_RANK/LOCAL_WORLD_SIZE still places the process.
TEST(EnvironmentValidation, AGivenRankAndSizeNeedNoLauncherPairAndKeepAConsistentLocalRank) {
  CommOptions given;
  given.rank = 0;
  given.world_size = 1;
  struct Case {
    std::map<std::string, std::string> env;
    int local_rank, local_size;
  };
  const Case cases[] = {
      {{{"WORLD_SIZE", "4"}}, 0, 1},                            // no RANK: not required
      {{{"RANK", "3"}}, 0, 1},                                  // no WORLD_SIZE
      {{{"RANK", "7"}, {"WORLD_SIZE", "2"}}, 0, 1},             // a pair that does not hold
      {{{"RANK", "x"}, {"WORLD_SIZE", "4"}}, 0, 1},             // nor parses
      {{{"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}}, 2, 4},
      {{{"COMMS_LOCAL_RANK", "1"}, {"COMMS_LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}}, 1, 2},  // first family
      {{{"LOCAL_RANK", "3"}}, 3, 4},                             // no local size: at least local rank + 1
      {{{"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "2"}}, 0, 1},  // inconsistent: one host
      {{{"LOCAL_RANK", "-1"}}, 0, 1},
  };
  for (const auto& c : cases) {
    std::string label;
    for (const auto& [k, v] : c.env) {
      setenv(k.c_str(), v.c_str(), 1);
      label += k + "=" + v + " ";
    }
    try {
      const auto comm = new_comm("cpu:gloo", std::nullopt, "given-rank", given);
      EXPECT_EQ(comm->rank(), 0) << label;
      EXPECT_EQ(comm->size(), 1) << label;
      EXPECT_EQ(comm->local_rank(), c.local_rank) << label;
      EXPECT_EQ(comm->local_size(), c.local_size) << label;
      comm->finalize();
    } catch (const Error& e) {
      ADD_FAILURE() << label << ": " << e.what();
    }
    for (const auto& [k, v] : c.env) unsetenv(k.c_str());
  }
  // Without a given rank the launcher's pair is still required.
  setenv("WORLD_SIZE", "4", 1);
  EXPECT_THROW(new_comm("cpu:gloo", std::nullopt, "env-rank", CommOptions{}), Error);
  unsetenv("WORLD_SIZE");
}

}  // namespace
}  // namespace comms
