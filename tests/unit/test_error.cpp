// What a user reads of an internal failure: the cause and the process context, no build path
// or assert text; DDP_DEBUG=1 adds where in the source it failed (Error::where()).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace ddp {
namespace {

Error failed_check() {
  try {
    const int answer = 41;
    DDP_CHECK(answer == 42, "the answer is {}", answer);
  } catch (const Error& e) {
    return e;
  }
  return Error("no failure");
}

TEST(ErrorText, AUserReadsNoBuildPathOrAssertTextUnlessDebugging) {
  const Error e = failed_check();
  const std::string what = e.what();
  EXPECT_EQ(what.rfind("the answer is 41 [rank ", 0), 0u) << what;
  EXPECT_NE(what.find(", device "), std::string::npos) << what;
  EXPECT_EQ(what.find("test_error.cpp"), std::string::npos) << what;
  EXPECT_EQ(what.find("answer == 42"), std::string::npos) << what;
  EXPECT_NE(e.where().find("test_error.cpp:"), std::string::npos) << e.where();
  EXPECT_NE(e.where().find(": answer == 42"), std::string::npos) << e.where();
  ::unsetenv("DDP_DEBUG");
  EXPECT_EQ(error_text(e), what);
  ::setenv("DDP_DEBUG", "1", 1);
  EXPECT_EQ(error_text(e), what + " [at " + e.where() + "]");
  const UsageError usage("--lr x: expected a number");
  EXPECT_EQ(error_text(usage), "--lr x: expected a number");  // no source to name
  ::unsetenv("DDP_DEBUG");
}

}  // namespace
}  // namespace ddp
