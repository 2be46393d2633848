// Copyright 2026 The ckptd Authors.
//
// client::SaveItems for the client's tests: a tensor or bytes item over the
// caller's memory, and the C-order bytes a strided view must arrive as.
// Header-only; nothing here owns the memory an item points at.
#ifndef CKPTD_TESTS_TESTING_SAVE_ITEMS_H_
#define CKPTD_TESTS_TESTING_SAVE_ITEMS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/ckptd_client.h"

namespace ckptd::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;

// A whole (unsharded), C-contiguous tensor item `fqn` of `shape` over `data`.
inline client::SaveItem Tensor(std::string fqn, std::vector<int64_t> shape,
                               const void* data,
                               std::string dtype = "float32") {
  client::SaveItem it;
  it.fqn = std::move(fqn);
  it.dtype = std::move(dtype);
  it.global_shape = shape;
  it.chunk_offsets.assign(shape.size(), 0);
  it.chunk_sizes = shape;
  it.data = data;
  return it;
}

// A bytes item `fqn` whose payload is `payload`.
inline client::SaveItem Bytes(std::string fqn, std::string_view payload) {
  client::SaveItem it;
  it.fqn = std::move(fqn);
  it.is_bytes = true;
  it.bytes = payload;
  return it;
}

// The C-order bytes of a strided view (`strides` set), element by element;
// elements are `es` bytes.
inline std::string COrderBytes(const client::SaveItem& it, size_t es) {
  const size_t n = it.chunk_sizes.size();
  int64_t numel = 1;
  for (int64_t s : it.chunk_sizes) numel *= s;
  std::string out;
  std::vector<int64_t> idx(n, 0);
  for (int64_t e = 0; e < numel; ++e) {
    int64_t off = 0;
    for (size_t k = 0; k < n; ++k) off += idx[k] * it.strides[k];
    out.append(
        static_cast<const char*>(it.data) + off * static_cast<int64_t>(es), es);
    for (size_t k = n; k-- > 0;) {
      if (++idx[k] < it.chunk_sizes[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_SAVE_ITEMS_H_
