// Copyright 2026 The ckptd Authors.
//
// FetchShare's answer on the wire (daemon/cluster/share_wire.h): what the
// holder writes is a FetchShareResponse to protobuf, what protobuf writes
// decodes, and a damaged, short, long or malformed answer is DATA_LOSS.

#include "daemon/cluster/share_wire.h"

#include <string>
#include <vector>

#include "ckptd/v1/peer.pb.h"
#include "common/crc32.h"
#include "gmock/gmock.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::HasSubstr;

std::string Flatten(grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `wire` cut into slices of `cut` bytes (as a socket may deliver it).
grpc::ByteBuffer Sliced(const std::string& wire, size_t cut) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += cut)
    slices.emplace_back(wire.data() + at, std::min(cut, wire.size() - at));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Data(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + 7);
  return s;
}

TEST(ShareWireTest, TheAnswerIsAFetchShareResponseAndDecodesIntoPlace) {
  for (size_t n : {size_t{1}, size_t{127}, size_t{128}, size_t{70000}}) {
    const std::string data = Data(n);
    const uint32_t crc = Crc32(0, data.data(), data.size());
    grpc::ByteBuffer b = EncodeFetchAnswer(nullptr, data.data(), n, crc);
    const std::string wire = Flatten(b);
    v1::FetchShareResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    EXPECT_EQ(parsed.data(), data);
    EXPECT_EQ(parsed.crc32(), crc);
    for (size_t cut : {size_t{1}, size_t{3}, size_t{4096}, wire.size()}) {
      grpc::ByteBuffer in = Sliced(wire, cut);
      std::string out(n, 'x');
      ASSERT_OK(DecodeFetchAnswer(in, n, out.data()));
      EXPECT_EQ(out, data) << n << " cut " << cut;
    }
    // What protobuf writes (fields in its own order) decodes too.
    grpc::ByteBuffer proto = Sliced(parsed.SerializeAsString(), 5);
    std::string out(n, 'x');
    ASSERT_OK(DecodeFetchAnswer(proto, n, out.data()));
    EXPECT_EQ(out, data);
  }
}

TEST(ShareWireTest, ADamagedShortLongOrMalformedAnswerIsDataLoss) {
  const std::string data = Data(1000);
  const uint32_t crc = Crc32(0, data.data(), data.size());
  grpc::ByteBuffer b = EncodeFetchAnswer(nullptr, data.data(), 1000, crc);
  const std::string wire = Flatten(b);
  std::string out(1000, '\0');
  auto decode = [&](const std::string& w, uint64_t length) {
    grpc::ByteBuffer in = Sliced(w, 7);
    return DecodeFetchAnswer(in, length, out.data());
  };
  std::string damaged = wire;
  damaged[500] ^= 0x10;  // a byte of the data flipped on the way
  absl::Status s = decode(damaged, 1000);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("CRC-32 mismatch"));
  EXPECT_TRUE(absl::IsDataLoss(decode(wire, 999)));  // not what was asked
  EXPECT_TRUE(absl::IsDataLoss(decode(wire.substr(0, wire.size() - 2), 1000)));
  EXPECT_TRUE(absl::IsDataLoss(decode(wire.substr(0, 600), 1000)));
  EXPECT_TRUE(absl::IsDataLoss(decode(wire + "\x18\x01", 1000)));  // field 3
  v1::FetchShareResponse no_crc;
  no_crc.set_data(data);
  EXPECT_TRUE(absl::IsDataLoss(decode(no_crc.SerializeAsString(), 1000)));
}

TEST(ShareWireTest, AHeldFilesBytesAreSentFromItsMappingAndKeptMeanwhile) {
  auto file = std::make_shared<TierFileBytes>();
  file->name = "__0_0.distcp";
  const std::string data = Data(TierFileBytes::kHugeBytes * 2);
  ASSERT_OK(file->Write(data));
  ASSERT_OK(file->Seal());
  absl::StatusOr<const char*> m = file->Mapping();
  if (!m.ok()) GTEST_SKIP() << "no huge pages here: " << m.status();
  const uint64_t at = 12345, n = 3 << 20;
  ASSERT_OK_AND_ASSIGN(uint32_t crc, file->Crc32(at, n));
  grpc::ByteBuffer b = EncodeFetchAnswer(file, *m + at, n, crc);
  std::weak_ptr<TierFileBytes> weak = file;
  file.reset();  // the answer keeps the file
  ASSERT_FALSE(weak.expired());
  std::string out(n, '\0');
  ASSERT_OK(DecodeFetchAnswer(b, n, out.data()));
  EXPECT_EQ(out, data.substr(at, n));
  b.Clear();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace ckptd::daemon
