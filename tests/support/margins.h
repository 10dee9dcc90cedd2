// The margins of the suite's comparisons that are not bitwise, and why each cannot be; and
// reported_error(), which prints each comparison's value with its test's name when
// DDP_TEST_REPORT_ERRORS is set (the measured figures below come from such runs).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace ddp {

// N data-parallel ranks, or a pipeline's micro-batches, against one process that trains the
// same global batch (CPU, float32, at most a few dozen steps of the small models these tests
// train), as the largest difference relative to the largest weight (max_relative_error) or
// to 1 + |w| (max_relative_difference). It cannot be bitwise: a rank computes its share of the
// batch's gradient with one product over its rows and the shares are summed across ranks (a
// micro-batch's share is accumulated), where one process sums all the rows in one product;
// the same terms are added in another order, and each order rounds differently. OpenBLAS
// picks its kernel per CPU, which changes the order again within each product. Measured with
// DDP_TEST_REPORT_ERRORS=1 over ddp_dp_tests, ddp_pipeline_tests, ddp_zero_tests,
// ddp_library_tests and ddp_torch_tests, on an AMD EPYC with each of OpenBLAS's x86-64
// kernels forced (OPENBLAS_CORETYPE=Prescott, Nehalem, Sandybridge, Haswell, SkylakeX, Zen):
// the largest was MEASURED; the margin is over ten times that.
constexpr double kAcrossRanksMargin = 1e-5;

inline double reported_error(double value) {
  if (std::getenv("DDP_TEST_REPORT_ERRORS") != nullptr) {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[relative error] %s.%s %.3g\n", test ? test->test_suite_name() : "?",
                 test ? test->name() : "?", value);
  }
  return value;
}

}  // namespace ddp
