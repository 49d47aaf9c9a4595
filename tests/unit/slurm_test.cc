// Slurm's compact node lists and job ids, as the store address under srun
// is derived from them (core/bootstrap/slurm.h).
#include <gtest/gtest.h>

#include "comms/error.h"
#include "bootstrap/slurm.h"

namespace {

using comms::slurm::first_host;
using comms::slurm::port_for_job;

TEST(SlurmNodeList, TheFirstHostKeepsItsZeroPaddingAndIgnoresTheRest) {
  EXPECT_EQ(first_host("node[01-04,07]", "L"), "node01");
  EXPECT_EQ(first_host("node[07,01-04]", "L"), "node07");
  EXPECT_EQ(first_host("gpu5,node[01-04]", "L"), "gpu5");
  EXPECT_EQ(first_host("rack[2-3]-n[008-009],x", "L"), "rack2-n008");
  EXPECT_EQ(first_host("localhost", "L"), "localhost");
  EXPECT_EQ(first_host(" a1 ", "L"), "a1");
}

TEST(SlurmNodeList, WhatIsNotANodeListIsRefusedNamingTheVariableAndValue) {
  for (const char* bad : {"node[01-", "node]", "n[a-b]", "", "[]", ",x"}) {
    try {
      first_host(bad, "SLURM_NODELIST");
      ADD_FAILURE() << "'" << bad << "' was read as a node list";
    } catch (const comms::Error& e) {
      EXPECT_EQ(e.code(), comms::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("SLURM_NODELIST='") + bad + "' is not a Slurm node list"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(SlurmJobId, ThePortIsTheSameForTheWholeJobAndInItsRange) {
  EXPECT_EQ(port_for_job("0"), 15000);
  EXPECT_EQ(port_for_job("123456"), 15000 + 123456 % 20000);
  EXPECT_EQ(port_for_job("19999"), 34999);
  EXPECT_EQ(port_for_job("20000"), 15000);
  EXPECT_THROW(port_for_job("12a"), comms::Error);
  EXPECT_THROW(port_for_job("-3"), comms::Error);
}

}  // namespace
