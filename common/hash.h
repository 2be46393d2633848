// Copyright 2026 The ckptd Authors.
//
// FNV-1a (64-bit): a small, stable, non-cryptographic hash for names of
// state files and digests of item indexes (the plan cache). Not for
// security: nothing an attacker controls may depend on its collisions.
#ifndef CKPTD_COMMON_HASH_H_
#define CKPTD_COMMON_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ckptd {

class Fnv1a {
 public:
  Fnv1a& Add(const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= 1099511628211ull;
    }
    return *this;
  }
  Fnv1a& Add(std::string_view s) { return Add(s.data(), s.size()); }
  // The value's bytes (integers, in host order).
  template <typename T>
  Fnv1a& AddValue(const T& v) {
    return Add(&v, sizeof v);
  }
  uint64_t digest() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

inline uint64_t Fnv1aHash(std::string_view s) {
  return Fnv1a().Add(s).digest();
}

}  // namespace ckptd

#endif  // CKPTD_COMMON_HASH_H_
