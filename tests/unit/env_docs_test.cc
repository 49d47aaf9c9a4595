// Every variable the library reads is documented in docs/ENVIRONMENT.md.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "env.h"

TEST(EnvironmentDocs, EveryVariableTheLibraryReadsIsInTheTable) {
  std::ifstream f(COMMS_SOURCE_ROOT "/docs/ENVIRONMENT.md");
  ASSERT_TRUE(f) << "docs/ENVIRONMENT.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& v : comms::env::documented()) {
    EXPECT_NE(doc.find(std::string("`") + v.name + "`"), std::string::npos)
        << v.name << " is read by the library but not documented in docs/ENVIRONMENT.md";
  }
}
