// Without --config=cuda there is no nccl backend to test.
#include <gtest/gtest.h>

TEST(NcclProcessGroup, NeedsConfigCuda) { GTEST_SKIP() << "built without --config=cuda"; }
