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
// DDP_TEST_REPORT_ERRORS=1 over ddp_dp_tests, ddp_pipeline_tests, ddp_zero_tests and
// ddp_torch_tests, on an AMD EPYC with each of OpenBLAS's x86-64 kernels forced
// (OPENBLAS_CORETYPE=Prescott, Sandybridge, Haswell, SkylakeX, Zen; 2026-12-04): the largest
// of 380 comparisons was 1.02e-7 (data parallelism, 3 and 4 ranks), pipelines 8.7e-8, LibTorch
// 5.0e-8; the margin is a hundred times that, and a lost micro-batch or a gradient in the
// wrong slot is off by 1e-2 or more.
constexpr double kAcrossRanksMargin = 1e-5;

// The same for the deepest case, ZeRO 2/3 with 3 accumulated micro-batches of a 14-layer MLP
// under AdamW against one process: AdamW divides each update by the root of its second
// moment, so a small gradient's rounding moves its weight as far as a large one's does, and
// 14 layers and 12 steps add up. Measured over the kernels above and Core2, Nehalem,
// Cooperlake and SapphireRapids: 1.63e-5 to 4.05e-5; a gradient slot overwritten by a later
// bucket is off by ~1.
constexpr double kDeepAdamwAcrossRanksMargin = 1e-3;

inline double reported_error(double value) {
  if (std::getenv("DDP_TEST_REPORT_ERRORS") != nullptr) {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[relative error] %s.%s %.3g\n", test ? test->test_suite_name() : "?",
                 test ? test->name() : "?", value);
  }
  return value;
}

}  // namespace ddp
