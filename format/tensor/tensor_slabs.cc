// Copyright 2026 The ckptd Authors.
#include "format/tensor/tensor_slabs.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::format {

absl::Status StreamTensorSlabs(
    CheckpointReader& reader, std::string_view fqn, uint64_t block_bytes,
    const std::function<absl::Status(std::string_view)>& sink) {
  const CompactMetadata& md = reader.compact();
  const std::optional<size_t> item = md.FindItem(fqn);
  if (!item.has_value() || !md.item(*item).tensor) {
    return absl::NotFoundError(
        fmt::format("{}: no tensor of that name in {}", fqn, reader.dir()));
  }
  const DType dtype = md.item(*item).properties.dtype;
  const std::vector<int64_t> shape(md.shape(*item).begin(),
                                   md.shape(*item).end());
  const size_t es = ElementSize(dtype);
  const size_t nd = shape.size();
  for (int64_t s : shape) {
    if (s == 0) return absl::OkStatus();
  }
  std::string buf;
  std::vector<int64_t> offsets(nd, 0), sizes = shape;
  auto slab = [&]() -> absl::Status {
    uint64_t n = es;
    for (int64_t s : sizes) n *= static_cast<uint64_t>(s);
    buf.resize(n);
    TensorRequest req{
        std::string(fqn), offsets, {dtype, sizes, {}, buf.data()}};
    RETURN_IF_ERROR(reader.ReadTensors({&req, 1}));
    return sink(buf);
  };
  // Fix leading indices until the rest fits in a block.
  std::function<absl::Status(size_t)> rec = [&](size_t d) -> absl::Status {
    if (d >= nd) {  // 0-d
      sizes.clear();
      return slab();
    }
    uint64_t inner = es;
    for (size_t k = d + 1; k < nd; ++k)
      inner *= static_cast<uint64_t>(shape[k]);
    if (inner <= block_bytes || d + 1 == nd) {
      const int64_t step = std::max<int64_t>(
          1, static_cast<int64_t>(block_bytes / std::max<uint64_t>(inner, 1)));
      for (int64_t start = 0; start < shape[d]; start += step) {
        offsets[d] = start;
        sizes[d] = std::min<int64_t>(step, shape[d] - start);
        RETURN_IF_ERROR(slab());
      }
    } else {
      for (int64_t i = 0; i < shape[d]; ++i) {
        offsets[d] = i;
        sizes[d] = 1;
        RETURN_IF_ERROR(rec(d + 1));
      }
    }
    offsets[d] = 0;
    sizes[d] = shape[d];
    return absl::OkStatus();
  };
  return rec(0);
}

}  // namespace ckptd::format
