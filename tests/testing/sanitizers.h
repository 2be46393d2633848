// Copyright 2026 The ckptd Authors.
//
// Whether this test binary runs under a sanitizer that makes it an order of
// magnitude slower (ASan, TSan). Scale tests use it to take the same code
// paths with fewer repetitions there; the release pass runs them whole.
#ifndef CKPTD_TESTS_TESTING_SANITIZERS_H_
#define CKPTD_TESTS_TESTING_SANITIZERS_H_

namespace ckptd::testing {

// gcc defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__; clang (the ASan
// and TSan builds of scripts/test.sh) answers __has_feature.
#if defined(__has_feature)
#define CKPTD_TESTING_HAS_FEATURE(f) __has_feature(f)
#else
#define CKPTD_TESTING_HAS_FEATURE(f) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || \
    CKPTD_TESTING_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

#if defined(__SANITIZE_THREAD__) || CKPTD_TESTING_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

inline constexpr bool kSlowSanitizer = kAddressSanitizer || kThreadSanitizer;

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_SANITIZERS_H_
