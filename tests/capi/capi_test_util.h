// Helpers shared by the C ABI test binaries: status assertions that print
// the ABI's last error, and a tiny trainer's options.
#ifndef SHARDKIT_TESTS_CAPI_CAPI_TEST_UTIL_H_
#define SHARDKIT_TESTS_CAPI_CAPI_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <string>

#include "shardkit/shardkit.h"

namespace sk_capi_test {

inline std::string LastError() { return sk_last_error_message(); }

#define EXPECT_STATUS(code, call)                                              \
  do {                                                                         \
    sk_status_t st_ = (call);                                                  \
    EXPECT_EQ(st_, code) << #call << ": " << sk_status_name(st_) << ": "       \
                         << sk_last_error_message();                           \
  } while (0)
#define ASSERT_OK(call)                                                        \
  do {                                                                         \
    sk_status_t st_ = (call);                                                  \
    ASSERT_EQ(st_, SK_STATUS_OK) << #call << ": " << sk_status_name(st_) << ": " \
                                 << sk_last_error_message();                   \
  } while (0)
#define EXPECT_ERROR_MENTIONS(text) \
  EXPECT_NE(sk_capi_test::LastError().find(text), std::string::npos) \
      << "message: " << sk_capi_test::LastError()

inline sk_trainer_options TinyTrainer(const sk_fsdp_options* fsdp = nullptr,
                                      const sk_optimizer_options* opt = nullptr) {
  sk_trainer_options o = SK_TRAINER_OPTIONS_INIT;
  o.model = "gpt-tiny";
  o.fsdp = fsdp;
  o.optimizer = opt;
  o.data_tokens = 64;
  return o;
}

}  // namespace sk_capi_test

#endif  // SHARDKIT_TESTS_CAPI_CAPI_TEST_UTIL_H_
