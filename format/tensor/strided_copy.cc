// Copyright 2026 The ckptd Authors.
#include "format/tensor/strided_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/container/inlined_vector.h"

namespace ckptd::format {
namespace {

// One dimension of the copy; strides in bytes.
struct Dim {
  int64_t size;
  int64_t s;  // source stride
  int64_t d;  // destination stride
};
using DimList = absl::InlinedVector<Dim, 8>;

// Calls f(src, dst) for every index of `outer` (outermost first).
template <typename F>
void ForEachOuter(const DimList& outer, const char* s, char* d, F&& f) {
  const size_t n = outer.size();
  absl::InlinedVector<int64_t, 8> idx(n, 0);
  while (true) {
    f(s, d);
    size_t k = n;
    while (k > 0) {
      --k;
      const Dim& dim = outer[k];
      if (++idx[k] < dim.size) {
        s += dim.s;
        d += dim.d;
        break;
      }
      s -= dim.s * (dim.size - 1);
      d -= dim.d * (dim.size - 1);
      idx[k] = 0;
      if (k == 0) return;
    }
    if (n == 0) return;
  }
}

template <size_t N>
void CopyLineN(char* d, int64_t ds, const char* s, int64_t ss, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(d, s, N);  // fixed size: a single load/store
    d += ds;
    s += ss;
  }
}

// Copies n elements of e bytes with byte strides ss (source) / ds (dest).
void CopyLine(size_t e, char* d, int64_t ds, const char* s, int64_t ss,
              int64_t n) {
  switch (e) {
    case 1:
      return CopyLineN<1>(d, ds, s, ss, n);
    case 2:
      return CopyLineN<2>(d, ds, s, ss, n);
    case 4:
      return CopyLineN<4>(d, ds, s, ss, n);
    case 8:
      return CopyLineN<8>(d, ds, s, ss, n);
    case 16:
      return CopyLineN<16>(d, ds, s, ss, n);
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(d, s, e);
        d += ds;
        s += ss;
      }
  }
}

// A 2-d transpose-like copy in square tiles: `a` is contiguous in the
// destination, `b` in the source, so each tile reads and writes whole cache
// lines.
void CopyTiled(size_t e, const Dim& a, const Dim& b, const char* s, char* d) {
  constexpr int64_t kTile = 32;
  for (int64_t b0 = 0; b0 < b.size; b0 += kTile) {
    const int64_t b1 = std::min(b.size, b0 + kTile);
    for (int64_t a0 = 0; a0 < a.size; a0 += kTile) {
      const int64_t an = std::min(a.size - a0, kTile);
      for (int64_t j = b0; j < b1; ++j) {
        CopyLine(e, d + j * b.d + a0 * a.d, a.d, s + j * b.s + a0 * a.s, a.s,
                 an);
      }
    }
  }
}

}  // namespace

void StridedCopy(size_t elem_size, absl::Span<const int64_t> sizes,
                 const char* src, absl::Span<const int64_t> src_strides,
                 char* dst, absl::Span<const int64_t> dst_strides) {
  const int64_t e = static_cast<int64_t>(elem_size);
  DimList dims;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] <= 0) return;
    if (sizes[k] == 1) continue;
    dims.push_back({sizes[k], src_strides[k] * e, dst_strides[k] * e});
  }
  if (dims.empty()) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // Iterate in destination order (outermost = largest destination stride),
  // then merge dimensions that are nested in both layouts.
  std::stable_sort(dims.begin(), dims.end(), [](const Dim& x, const Dim& y) {
    const int64_t xd = std::llabs(x.d), yd = std::llabs(y.d);
    if (xd != yd) return xd > yd;
    return std::llabs(x.s) > std::llabs(y.s);
  });
  DimList merged;
  for (const Dim& dim : dims) {
    if (!merged.empty()) {
      Dim& prev = merged.back();
      if (prev.s == dim.size * dim.s && prev.d == dim.size * dim.d) {
        prev.size *= dim.size;
        prev.s = dim.s;
        prev.d = dim.d;
        continue;
      }
    }
    merged.push_back(dim);
  }

  const Dim inner = merged.back();
  merged.pop_back();
  if (inner.s == e && inner.d == e) {
    // Runs contiguous on both sides.
    const size_t run = static_cast<size_t>(inner.size) * elem_size;
    ForEachOuter(merged, src, dst,
                 [run](const char* s, char* d) { std::memcpy(d, s, run); });
    return;
  }
  if (inner.d == e) {
    // Destination-contiguous, source-strided: tile with the dimension that
    // is contiguous in the source, if any (a transpose).
    for (size_t j = 0; j < merged.size(); ++j) {
      if (merged[j].s != e) continue;
      const Dim partner = merged[j];
      merged.erase(merged.begin() + static_cast<ptrdiff_t>(j));
      ForEachOuter(merged, src, dst, [&](const char* s, char* d) {
        CopyTiled(elem_size, inner, partner, s, d);
      });
      return;
    }
  }
  ForEachOuter(merged, src, dst, [&](const char* s, char* d) {
    CopyLine(elem_size, d, inner.d, s, inner.s, inner.size);
  });
}

bool IsCContiguous(absl::Span<const int64_t> sizes,
                   absl::Span<const int64_t> strides) {
  if (strides.empty()) return true;
  if (strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (sizes[k] != 1 && strides[k] != expected) return false;
    expected *= std::max<int64_t>(sizes[k], 1);
  }
  return true;
}

}  // namespace ckptd::format
