// Copyright 2026 The ckptd Authors.
//
// Whether this test binary runs under a sanitizer that makes it an order of
// magnitude slower (ASan, TSan). Scale tests use it to take the same code
// paths with fewer repetitions there; the release pass runs them whole.
#ifndef CKPTD_TESTS_TESTING_SANITIZERS_H_
#define CKPTD_TESTS_TESTING_SANITIZERS_H_

namespace ckptd::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSlowSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSlowSanitizer = true;
#else
inline constexpr bool kSlowSanitizer = false;
#endif
#else
inline constexpr bool kSlowSanitizer = false;
#endif

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_SANITIZERS_H_
