// Copyright 2026 The ckptd Authors.
//
// The safetensors export (format/convert/export_safetensors.h) and the dtype
// conversions it uses; the torch.save import
// (format/convert/import_torch_save.h) round trip. The export is read back with
// ckptd's own safetensors header reader here; the `safetensors` library and
// torch's Tensor.to check it in tests/interop/test_safetensors_export_torch2.py
// and tests/python/test_safetensors_export.py.
#include "format/convert/export_safetensors.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "format/checkpoint/checkpoint_reader.h"
#include "format/convert/convert.h"
#include "format/convert/import_torch_save.h"
#include "format/convert/safetensors.h"
#include "format/tensor/dtype_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_util.h"
#include "tests/testing/two_rank_checkpoint.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DTypeConvertTest, HalfAndBFloat16RoundToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  // float16: exact, ties, overflow, subnormals, signed zero, NaN.
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the tie: down
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie: to even = inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);      // tie: even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: even (up)
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);             // tie: even = 0
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);         // tie: even (up)
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-26f), 0x0400);  // rounds to normal
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::nanf("")) & 0x7e00, 0x7e00);  // quiet NaN
  // bfloat16.
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);      // tie: even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie: even (up)
  EXPECT_EQ(FloatToBFloat16(3.4028235e38f), 0x7f80);       // rounds to inf
  EXPECT_EQ(FloatToBFloat16(-inf), 0xff80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  // Back to float: exact.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    ASSERT_EQ(FloatToBFloat16(BFloat16ToFloat(static_cast<uint16_t>(h))), h)
        << std::hex << h;
  }
  // ConvertElements: float64 → bfloat16 through float32.
  const double d[3] = {1.5, -0.25, 1e300};
  uint16_t out[3];
  ConvertElements(DType::kFloat64, DType::kBFloat16,
                  reinterpret_cast<const char*>(d), 3,
                  reinterpret_cast<char*>(out));
  EXPECT_THAT(out, ElementsAre(0x3fc0, 0xbe80, 0x7f80));
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.Join("ckpt");
    ASSERT_OK_AND_ASSIGN(auto c,
                         ::ckptd::testing::WriteTwoRankCheckpoint(dir_));
    data_ = std::move(c.data);
  }

  // The bytes of tensor `name` of safetensors file `path`.
  std::string TensorBytes(const std::string& path, const std::string& name,
                          SafetensorsTensor* info) {
    auto file = Env::Default()->NewRandomAccessFile(path);
    EXPECT_TRUE(file.ok()) << file.status();
    auto h = ReadSafetensorsHeader(file->get(), 0);
    EXPECT_TRUE(h.ok()) << h.status();
    auto it = h->tensors.find(name);
    EXPECT_NE(it, h->tensors.end()) << name;
    *info = it->second;
    std::string bytes(info->end - info->begin, '\0');
    EXPECT_TRUE(
        (*file)->ReadExact(info->begin, bytes.size(), bytes.data()).ok());
    EXPECT_EQ(h->metadata.at("format"), "pt");
    return bytes;
  }

  TempDir tmp_;
  std::string dir_;
  std::vector<float> data_;
};

TEST_F(ExportTest, OneFileWholeTensorsAndSkippedBytesItems) {
  const std::string out = tmp_.Join("hf");
  ASSERT_OK_AND_ASSIGN(SafetensorsExportStats stats,
                       ExportSafetensors(dir_, out));
  EXPECT_THAT(stats.files, ElementsAre("model.safetensors"));
  EXPECT_EQ(stats.tensors, 1u);
  EXPECT_EQ(stats.tensor_bytes, data_.size() * 4);
  ASSERT_EQ(stats.skipped.size(), 1u);
  EXPECT_THAT(stats.skipped[0], HasSubstr("optim.param_groups: bytes item"));
  SafetensorsTensor t;
  const std::string bytes =
      TensorBytes(JoinPath(out, "model.safetensors"), "w", &t);
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_THAT(t.shape, ElementsAre(64, 32));
  ASSERT_EQ(bytes.size(), data_.size() * 4);
  EXPECT_EQ(std::memcmp(bytes.data(), data_.data(), bytes.size()), 0);
}

TEST_F(ExportTest, BFloat16SmallBlocksAndOverwrite) {
  const std::string out = tmp_.Join("hf");
  SafetensorsExportOptions options;
  options.dtype = DType::kBFloat16;
  options.block_bytes = 1000;  // many slabs, each a few rows
  options.strip = "w";         // would leave an empty name
  EXPECT_THAT(ExportSafetensors(dir_, out, options).status().message(),
              HasSubstr("no name left"));
  options.strip.clear();
  options.only = {"optim."};
  EXPECT_THAT(ExportSafetensors(dir_, out, options).status().message(),
              HasSubstr("no tensor to export"));
  options.only.clear();
  ASSERT_OK(ExportSafetensors(dir_, out, options).status());
  SafetensorsTensor t;
  const std::string bytes =
      TensorBytes(JoinPath(out, "model.safetensors"), "w", &t);
  EXPECT_EQ(t.dtype, DType::kBFloat16);
  ASSERT_EQ(bytes.size(), data_.size() * 2);
  for (size_t i = 0; i < data_.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    ASSERT_EQ(b, FloatToBFloat16(data_[i])) << i;
  }
  // A second export into the same directory: refused, then replaced.
  EXPECT_EQ(ExportSafetensors(dir_, out, options).status().code(),
            absl::StatusCode::kAlreadyExists);
  options.overwrite = true;
  options.dtype = DType::kInt8;
  EXPECT_EQ(ExportSafetensors(dir_, out, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.dtype.reset();
  ASSERT_OK(ExportSafetensors(dir_, out, options).status());
  TensorBytes(JoinPath(out, "model.safetensors"), "w", &t);
  EXPECT_EQ(t.dtype, DType::kFloat32);
}

TEST_F(ExportTest, ImportOfTheTorchSaveConvertRoundTrips) {
  // checkpoint → one torch.save file → import → the same tensors and values.
  const std::string pt = tmp_.Join("full.pt"), back = tmp_.Join("back");
  ASSERT_OK(ConvertToTorchSave(dir_, pt).status());
  ImportOptions options;
  ASSERT_OK_AND_ASSIGN(ImportStats stats, ImportTorchSave(pt, back, options));
  EXPECT_EQ(stats.tensors, 1u);
  EXPECT_EQ(stats.tensor_bytes, data_.size() * 4);
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(back));
  std::vector<float> out;
  ASSERT_OK(::ckptd::testing::ReadBoxOfW(*reader, {0, 0}, {64, 32}, {}, &out));
  EXPECT_EQ(out, data_);
  // "optim.param_groups" was a list of dicts: DCP flattens it further.
  ASSERT_OK_AND_ASSIGN(PyValue lr,
                       reader->ReadObject("optim.param_groups.0.lr"));
  EXPECT_EQ(lr, PyValue::Float(0.1));
  // w, optim.param_groups.0.{lr, betas, params}.
  EXPECT_EQ(reader->compact().num_items(), 4u);
  // A committed checkpoint is not replaced without overwrite.
  EXPECT_EQ(ImportTorchSave(pt, back, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options.overwrite = true;
  ASSERT_OK(ImportTorchSave(pt, back, options).status());
  // Not a torch.save file; missing.
  EXPECT_EQ(ImportTorchSave(JoinPath(back, ".metadata"), tmp_.Join("x"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ImportTorchSave(tmp_.Join("nope.pt"), tmp_.Join("x")).status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckptd::format
