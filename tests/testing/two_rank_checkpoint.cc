// Copyright 2026 The ckptd Authors.
#include "tests/testing/two_rank_checkpoint.h"

#include "common/status_macros.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/py_value.h"
#include "format/tensor/tensor_payload.h"

namespace ckptd::testing {

using format::DType;
using format::ItemDesc;
using format::PyValue;
using format::WriteItem;

absl::StatusOr<TwoRankCheckpoint> WriteTwoRankCheckpoint(
    const std::string& dir) {
  constexpr int64_t kRows = TwoRankCheckpoint::kRows;
  constexpr int64_t kCols = TwoRankCheckpoint::kCols;
  TwoRankCheckpoint c;
  c.data.resize(kRows * kCols);
  for (size_t i = 0; i < c.data.size(); ++i)
    c.data[i] = 0.5f * static_cast<float>(i);
  std::vector<std::vector<WriteItem>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    WriteItem it;
    it.desc = {"w",
               ItemDesc::Type::kTensor,
               DType::kFloat32,
               {kRows, kCols},
               {r * kRows / 2, 0},
               {kRows / 2, kCols},
               {}};
    it.tensor = {
        DType::kFloat32,
        {kRows / 2, kCols},
        {},
        reinterpret_cast<const char*>(c.data.data() + r * kRows / 2 * kCols)};
    ranks[r].push_back(it);
  }
  c.groups = format::EncodeTorchSaveObject(PyValue::List({PyValue::Dict(
      {{PyValue::Str("lr"), PyValue::Float(0.1)},
       {PyValue::Str("betas"),
        PyValue::Tuple({PyValue::Float(0.9), PyValue::Float(0.99)})},
       {PyValue::Str("params"), PyValue::List({PyValue::Int(0)})}})}));
  WriteItem b;
  b.desc.fqn = "optim.param_groups";
  b.desc.type = ItemDesc::Type::kBytes;
  b.desc.path = {std::string("optim"), std::string("param_groups")};
  b.bytes = c.groups;
  ranks[0].push_back(b);
  ASSIGN_OR_RETURN(format::WriteResult wr, format::WriteCheckpoint(dir, ranks));
  c.metadata = wr.metadata;
  return c;
}

absl::Status ReadBoxOfW(format::CheckpointReader& reader,
                        std::vector<int64_t> off, std::vector<int64_t> size,
                        std::vector<int64_t> strides, std::vector<float>* out) {
  int64_t span = 1;
  for (size_t d = 0; d < size.size(); ++d) {
    span +=
        (size[d] - 1) * (strides.empty() ? (d == 0 ? size[1] : 1) : strides[d]);
  }
  out->assign(span, -1.0f);
  format::TensorRequest req{
      "w",
      std::move(off),
      {DType::kFloat32, std::move(size), std::move(strides),
       reinterpret_cast<char*>(out->data())}};
  return reader.ReadTensors({&req, 1});
}

}  // namespace ckptd::testing
