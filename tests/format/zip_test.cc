// Copyright 2026 The ckptd Authors.
#include "format/zip/zip.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/crc32.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

// An in-memory file named "mem.zip" in messages.
class StringFile : public InMemoryFile {
 public:
  explicit StringFile(std::string data, std::string path = "mem.zip")
      : InMemoryFile(std::move(data), std::move(path)) {}
};

absl::Status OpenAndRead(const std::string& bytes, uint64_t offset = 0,
                         const ZipReaderOptions& options = {});

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Concat(const std::vector<std::string_view>& segs) {
  std::string out;
  for (std::string_view s : segs) out.append(s);
  return out;
}

struct TestRecord {
  std::string name;
  std::string data;
};

// Builds an archive of `records`, each split into up to 3 pieces, via
// FinishInto; checks that segments() and size() agree with it.
std::string Build(const std::vector<TestRecord>& records, std::mt19937_64& rng,
                  const std::string& prefix = "archive") {
  ZipArchiveBuilder b(prefix);
  for (const TestRecord& r : records) {
    std::vector<std::string_view> pieces;
    std::string_view rest = r.data;
    while (!rest.empty() && pieces.size() < 2) {
      const size_t n = rng() % (rest.size() + 1);
      pieces.push_back(rest.substr(0, n));
      rest.remove_prefix(n);
    }
    pieces.push_back(rest);
    b.AddRecord(r.name, pieces);
  }
  const uint64_t size = b.size();
  std::string out(size, '\0');
  b.FinishInto(out.data());
  EXPECT_EQ(b.size(), size);
  EXPECT_EQ(Concat(b.segments()), out);
  return out;
}

void ExpectRoundTrip(const std::string& archive,
                     const std::vector<TestRecord>& records,
                     uint64_t archive_offset, const std::string& file_bytes,
                     const std::string& prefix = "archive") {
  StringFile file(file_bytes);
  ASSERT_OK_AND_ASSIGN(auto reader, ZipArchiveReader::Open(
                                        &file, archive_offset, archive.size()));
  EXPECT_EQ(reader->prefix(), prefix);
  ASSERT_EQ(reader->entries().size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const ZipEntry& e = reader->entries()[i];
    EXPECT_EQ(e.name, prefix + "/" + records[i].name);
    EXPECT_EQ(e.size, records[i].data.size());
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    EXPECT_EQ(e.crc32,
              Crc32(0, records[i].data.data(), records[i].data.size()));
    EXPECT_EQ(reader->Find(records[i].name), &e);
    ASSERT_OK_AND_ASSIGN(std::string data, reader->ReadRecord(e, 1 << 30));
    EXPECT_EQ(data, records[i].data) << e.name;
    EXPECT_OK(reader->VerifyCrc(e));
    if (e.size >= 3) {
      char buf[2];
      ASSERT_OK(reader->ReadRange(e, 1, 2, buf));
      EXPECT_EQ(std::string_view(buf, 2), records[i].data.substr(1, 2));
    }
    EXPECT_EQ(reader->ReadRange(e, e.size, 1, nullptr).code(),
              absl::StatusCode::kOutOfRange);
  }
  EXPECT_EQ(reader->Find("no/such/record"), nullptr);
}

std::vector<TestRecord> RandomRecords(std::mt19937_64& rng, int n,
                                      size_t max_size) {
  std::vector<TestRecord> records;
  for (int i = 0; i < n; ++i) {
    size_t size = 0;
    switch (rng() % 4) {
      case 0:
        size = 0;
        break;
      case 1:
        size = rng() % 70;
        break;
      default:
        size = rng() % (max_size + 1);
    }
    std::string name = i == 0 ? "data.pkl" : "data/" + std::to_string(i);
    if (rng() % 5 == 0) name += std::string(rng() % 100, 'n');
    records.push_back({name, RandomBytes(rng, size)});
  }
  return records;
}

TEST(Crc32Test, CombinedCrcsAreTheCrcOfTheWhole) {
  std::mt19937_64 rng(7);
  const std::string bytes = RandomBytes(rng, (3 << 20) + 12345);
  const uint32_t whole = Crc32(0, bytes.data(), bytes.size());
  // Cut points that test empty pieces, odd lengths and lengths above 2^21.
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096},
                     size_t{(2 << 20) + 3}, bytes.size() - 1, bytes.size()}) {
    const uint32_t a = Crc32(0, bytes.data(), cut);
    const uint32_t b = Crc32(0, bytes.data() + cut, bytes.size() - cut);
    EXPECT_EQ(Crc32Combine(a, b, bytes.size() - cut), whole) << "cut " << cut;
  }
  // Many pieces of one length with one shift, as the memory tier does.
  constexpr size_t kPiece = 65536;
  const uint32_t shift = Crc32ShiftFor(kPiece);
  uint32_t crc = 0;
  size_t at = 0;
  for (; at + kPiece <= bytes.size(); at += kPiece) {
    crc = Crc32Shift(crc, shift) ^ Crc32(0, bytes.data() + at, kPiece);
  }
  crc = Crc32(crc, bytes.data() + at, bytes.size() - at);
  EXPECT_EQ(crc, whole);
  // A wrong length gives another value.
  const uint32_t a = Crc32(0, bytes.data(), 100);
  const uint32_t b = Crc32(0, bytes.data() + 100, bytes.size() - 100);
  EXPECT_NE(Crc32Combine(a, b, bytes.size() - 101), whole);
}

TEST(Crc32Test, FileCrcOfARangeReadsItInBlocks) {
  std::mt19937_64 rng(8);
  const std::string bytes = RandomBytes(rng, (5 << 20) / 2 + 77);
  const InMemoryFile file(bytes, "crc.bin");
  EXPECT_EQ(file.Crc32(0, bytes.size()).value(),
            Crc32(0, bytes.data(), bytes.size()));
  EXPECT_EQ(file.Crc32(123, (1 << 20) + 5).value(),
            Crc32(0, bytes.data() + 123, (1 << 20) + 5));
  EXPECT_EQ(file.Crc32(bytes.size(), 0).value(), 0u);
  const absl::StatusOr<uint32_t> past = file.Crc32(bytes.size() - 10, 11);
  EXPECT_TRUE(absl::IsOutOfRange(past.status())) << past.status();
}

TEST(ZipTest, RoundTripRandom) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int iter = 0; iter < 30; ++iter) {
    auto records = RandomRecords(rng, 1 + static_cast<int>(rng() % 40), 20000);
    const std::string archive = Build(records, rng);
    ExpectRoundTrip(archive, records, 0, archive);
    // Inside a bigger file, at a non-zero offset.
    const uint64_t off = rng() % 10000;
    const std::string file =
        RandomBytes(rng, off) + archive + RandomBytes(rng, rng() % 3000);
    ExpectRoundTrip(archive, records, off, file);
  }
}

TEST(ZipTest, EmptyRecordsAndEmptyArchive) {
  std::mt19937_64 rng(1);
  std::vector<TestRecord> records = {{"a", ""}, {"b", ""}, {"c", "x"}};
  const std::string archive = Build(records, rng, "p");
  ExpectRoundTrip(archive, records, 0, archive, "p");

  ZipArchiveBuilder b;
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  EXPECT_EQ(out.size(), 22u);
  StringFile file(out);
  ASSERT_OK_AND_ASSIGN(auto reader,
                       ZipArchiveReader::Open(&file, 0, out.size()));
  EXPECT_TRUE(reader->entries().empty());
  EXPECT_EQ(reader->prefix(), "");
}

TEST(ZipTest, FinishWithoutCopyMatchesFinishInto) {
  std::mt19937_64 rng(testing::TestSeed());
  auto records = RandomRecords(rng, 10, 5000);
  ZipArchiveBuilder a, b;
  for (const auto& r : records) {
    const std::string_view piece = r.data;
    a.AddRecord(r.name, {&piece, 1});
    b.AddRecord(r.name, {&piece, 1});
  }
  a.Finish();
  std::string copied(b.size(), '\0');
  b.FinishInto(copied.data());
  EXPECT_EQ(Concat(a.segments()), copied);
  EXPECT_EQ(a.size(), copied.size());
  // FinishInto after Finish copies the same bytes.
  std::string again(a.size(), '\0');
  a.FinishInto(again.data());
  EXPECT_EQ(again, copied);
}

TEST(ZipTest, MovedBuilderKeepsSegmentsValid) {
  std::vector<ZipArchiveBuilder> builders;
  std::vector<std::string> expected;
  for (int i = 0; i < 20; ++i) {
    ZipArchiveBuilder b;
    b.AddOwnedRecord("data.pkl", "p" + std::to_string(i));  // SSO-sized
    b.AddOwnedRecord("version", "3\n");
    if (i % 2 == 0) b.Finish();
    builders.push_back(std::move(b));  // reallocations move them again
  }
  for (ZipArchiveBuilder& b : builders) {
    std::string out(b.size(), '\0');
    b.FinishInto(out.data());
    EXPECT_EQ(Concat(b.segments()), out);
    EXPECT_OK(OpenAndRead(out));
  }
}

TEST(ZipTest, OwnedRecordsAndStockLayout) {
  ZipArchiveBuilder b;
  b.AddOwnedRecord("data.pkl", std::string(154, 'p'));
  b.AddOwnedRecord("data/0", std::string(24, 'd'));
  b.AddOwnedRecord("version", "3\n");
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  // Same offsets as torch 1.13's torch.save of a 2x3 float tensor (its
  // zip64 end records aside): data.pkl at 64, data/0 at 320, version at 448.
  StringFile file(out);
  ASSERT_OK_AND_ASSIGN(auto reader,
                       ZipArchiveReader::Open(&file, 0, out.size()));
  ASSERT_EQ(reader->entries().size(), 3u);
  EXPECT_EQ(reader->entries()[0].data_offset, 64u);
  EXPECT_EQ(reader->entries()[1].data_offset, 320u);
  EXPECT_EQ(reader->entries()[2].data_offset, 448u);
  // Local header: flags 0x0808, method 0, sizes 0, "FB" padding.
  EXPECT_EQ(out.substr(0, 4), std::string("PK\x03\x04", 4));
  EXPECT_EQ(out.substr(6, 2), std::string("\x08\x08", 2));
  EXPECT_EQ(out.substr(14, 12), std::string(12, '\0'));
  EXPECT_EQ(out.substr(46, 2), "FB");
  // Data descriptor after data.pkl.
  EXPECT_EQ(out.substr(64 + 154, 4), std::string("PK\x07\x08", 4));
  // No zip64 end records for a small archive.
  EXPECT_EQ(out.find(std::string("PK\x06\x06", 4)), std::string::npos);
}

TEST(ZipTest, ForcedZip64) {
  std::mt19937_64 rng(testing::TestSeed());
  for (uint64_t threshold :
       {uint64_t{0}, uint64_t{1}, uint64_t{300}, uint64_t{5000}}) {
    ZipArchiveBuilder::SetZip64ThresholdForTest(threshold);
    auto records = RandomRecords(rng, 12, 4000);
    records.push_back({"big", RandomBytes(rng, threshold + 1)});
    const std::string archive = Build(records, rng);
    ZipArchiveBuilder::SetZip64ThresholdForTest(0xffffffff);
    EXPECT_NE(archive.find(std::string("PK\x06\x06", 4)), std::string::npos);
    EXPECT_NE(archive.find(std::string("PK\x06\x07", 4)), std::string::npos);
    ExpectRoundTrip(archive, records, 0, archive);
    const std::string file = RandomBytes(rng, 777) + archive;
    ExpectRoundTrip(archive, records, 777, file);
  }
}

TEST(ZipTest, ArchiveInRealFile) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  auto records = RandomRecords(rng, 8, 100000);
  ZipArchiveBuilder b;
  for (const auto& r : records) {
    const std::string_view piece = r.data;
    b.AddRecord(r.name, {&piece, 1});
  }
  b.Finish();
  const std::string path = dir.Join("__0_0.distcp");
  Env* env = Env::Default();
  {
    ASSERT_OK_AND_ASSIGN(auto f, env->NewWritableFile(path));
    ASSERT_OK(f->Append(std::string(4096, 'x')));
    ASSERT_OK(f->AppendV(b.segments()));
    ASSERT_OK(f->Append("trailing"));
    ASSERT_OK(f->Close());
  }
  ASSERT_OK_AND_ASSIGN(auto file, env->NewRandomAccessFile(path));
  ASSERT_OK_AND_ASSIGN(auto reader,
                       ZipArchiveReader::Open(file.get(), 4096, b.size()));
  ASSERT_EQ(reader->entries().size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::string d,
                         reader->ReadRecord(reader->entries()[i], 1 << 20));
    EXPECT_EQ(d, records[i].data);
  }
  EXPECT_EQ(reader->Describe(), path + " @ 4096");
  // A range past the end of the file.
  auto bad = ZipArchiveReader::Open(file.get(), 4096, b.size() + 100);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
}

// A real zip64 archive: a 4 GiB + 100 byte record of zero pages (an
// anonymous PROT_READ mapping costs no memory), so its size, the following
// header offset, the central directory offset all need zip64. Written as a
// sparse file and read back by our reader and by Python's zipfile.
class SegmentsFile : public RandomAccessFile {
 public:
  explicit SegmentsFile(const std::vector<std::string_view>& segs)
      : segs_(segs) {
    for (std::string_view s : segs) size_ += s.size();
  }
  absl::Status ReadExact(uint64_t offset, size_t n, char* dst) const override {
    if (offset > size_ || n > size_ - offset)
      return absl::OutOfRangeError("eof");
    uint64_t pos = 0;
    for (std::string_view s : segs_) {
      if (n == 0) break;
      if (offset < pos + s.size()) {
        const uint64_t in = offset - pos;
        const size_t k = std::min<uint64_t>(n, s.size() - in);
        std::memcpy(dst, s.data() + in, k);
        dst += k;
        offset += k;
        n -= k;
      }
      pos += s.size();
    }
    return absl::OkStatus();
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  std::vector<std::string_view> segs_;
  uint64_t size_ = 0;
  std::string path_ = "segments";
};

TEST(ZipTest, RealZip64HugeRecord) {
  const size_t huge = (size_t{4} << 30) + 100;
  void* p = mmap(nullptr, huge, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) GTEST_SKIP() << "cannot map 4 GiB of address space";
  const std::string_view zeros(static_cast<const char*>(p), huge);
  ZipArchiveBuilder b;
  b.AddOwnedRecord("data.pkl", "pkl");
  b.AddRecord("data/0", {&zeros, 1});
  b.AddOwnedRecord("version", "3\n");
  const uint64_t size = b.size();
  b.Finish();
  SegmentsFile mem(b.segments());
  ASSERT_EQ(mem.Size(), size);
  {
    ASSERT_OK_AND_ASSIGN(auto reader, ZipArchiveReader::Open(&mem, 0, size));
    ASSERT_EQ(reader->entries().size(), 3u);
    const ZipEntry* big = reader->Find("data/0");
    ASSERT_NE(big, nullptr);
    EXPECT_EQ(big->size, huge);
    EXPECT_EQ(big->data_offset % 64, 0u);
    const ZipEntry* version = reader->Find("version");
    ASSERT_NE(version, nullptr);
    EXPECT_GT(version->data_offset, uint64_t{0xffffffff});
    EXPECT_EQ(*reader->ReadRecord(*version, 10), "3\n");
    // CRC-32 of 4 GiB + 100 zero bytes, from Python's zlib.crc32 (an
    // independent implementation; computing it here again was a third of
    // the test's time under ASan).
    EXPECT_EQ(big->crc32, 0xa92a4ce5u);
    char tail[4];
    ASSERT_OK(reader->ReadRange(*big, huge - 4, 4, tail));
    EXPECT_EQ(std::string_view(tail, 4), std::string_view("\0\0\0\0", 4));
  }
  // A sparse file: the zero record becomes a hole.
  testing::TempDir dir;
  const std::string path = dir.Join("huge.pt");
  {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    for (std::string_view s : b.segments()) {
      if (s.data() == zeros.data()) {
        ASSERT_GE(lseek(fd, static_cast<off_t>(s.size()), SEEK_CUR), 0);
      } else {
        ASSERT_EQ(write(fd, s.data(), s.size()),
                  static_cast<ssize_t>(s.size()));
      }
    }
    ASSERT_EQ(close(fd), 0);
  }
  munmap(p, huge);
  ASSERT_OK_AND_ASSIGN(auto file, Env::Default()->NewRandomAccessFile(path));
  ASSERT_EQ(file->Size(), size);
  ASSERT_OK_AND_ASSIGN(auto reader,
                       ZipArchiveReader::Open(file.get(), 0, size));
  EXPECT_EQ(*reader->ReadRecord(*reader->Find("version"), 10), "3\n");
  EXPECT_EQ(*reader->ReadRecord(*reader->Find("data.pkl"), 10), "pkl");
  // Python's zipfile reads the zip64 directory the same way.
  if (access("/usr/bin/python3", X_OK) == 0) {
    std::string out;
    const int rc = testing::RunCommand(
        "/usr/bin/python3 -c \"import zipfile,sys; "
        "z=zipfile.ZipFile(sys.argv[1]); "
        "print([(i.filename, i.file_size) for i in z.infolist()], "
        "z.read('archive/version'))\" " +
            path,
        &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_TRUE(absl::StrContains(
        out, "('archive/data/0', 4294967396), ('archive/version', 2)] b'3\\n'"))
        << out;
  }
}

// ---------------------------------------------------------------------------
// Corruption: the reader must return an error (never crash, hang or allocate
// unboundedly), and whatever it accepts must be self-consistent.
// ---------------------------------------------------------------------------

// Opens `bytes` and, if that succeeds, reads every entry.
absl::Status OpenAndRead(const std::string& bytes, uint64_t offset,
                         const ZipReaderOptions& options) {
  StringFile file(bytes);
  auto reader =
      ZipArchiveReader::Open(&file, offset, bytes.size() - offset, options);
  if (!reader.ok()) return reader.status();
  for (const ZipEntry& e : (*reader)->entries()) {
    EXPECT_LE(e.data_offset + e.size, bytes.size() - offset);
    auto d = (*reader)->ReadRecord(e, 1 << 20);
    if (!d.ok()) return d.status();
  }
  return absl::OkStatus();
}

std::string SmallArchive(uint64_t zip64_threshold = 0xffffffff) {
  ZipArchiveBuilder::SetZip64ThresholdForTest(zip64_threshold);
  ZipArchiveBuilder b;
  b.AddOwnedRecord("data.pkl", "pickle-bytes");
  b.AddOwnedRecord("byteorder", "little");
  b.AddOwnedRecord("data/0", std::string(100, 'd'));
  b.AddOwnedRecord("version", "3\n");
  ZipArchiveBuilder::SetZip64ThresholdForTest(0xffffffff);
  std::string out(b.size(), '\0');
  b.FinishInto(out.data());
  return out;
}

TEST(ZipCorruptionTest, Truncation) {
  for (uint64_t t : {uint64_t{0xffffffff}, uint64_t{0}}) {
    const std::string archive = SmallArchive(t);
    ASSERT_OK(OpenAndRead(archive));
    for (size_t len = 0; len < archive.size(); ++len) {
      // The archive range is cut short ...
      EXPECT_FALSE(OpenAndRead(archive.substr(0, len)).ok()) << len;
      // ... or the range is right but the file is shorter.
      StringFile file(archive.substr(0, len));
      auto r = ZipArchiveReader::Open(&file, 0, archive.size());
      EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
    }
    // Truncated at the front: offsets no longer match.
    for (size_t cut = 1; cut < archive.size(); ++cut) {
      EXPECT_FALSE(OpenAndRead(archive.substr(cut)).ok()) << cut;
    }
  }
}

TEST(ZipCorruptionTest, EveryByteFlipped) {
  for (uint64_t t : {uint64_t{0xffffffff}, uint64_t{0}}) {
    const std::string archive = SmallArchive(t);
    int accepted = 0;
    for (size_t pos = 0; pos < archive.size(); ++pos) {
      for (int x : {0x01, 0x80, 0xff, 0x5a}) {
        std::string bad = archive;
        bad[pos] = static_cast<char>(bad[pos] ^ x);
        // Must not crash; payload flips are caught by the CRC.
        if (OpenAndRead(bad).ok()) ++accepted;
      }
    }
    // Flips in ignored fields (times, attributes, local sizes, padding
    // bytes, descriptor) are accepted; most are not.
    EXPECT_LT(accepted, static_cast<int>(archive.size()) * 4);
  }
}

TEST(ZipCorruptionTest, RandomMutations) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::string archive = SmallArchive(0);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bad = archive;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      const size_t pos = rng() % bad.size();
      switch (rng() % 3) {
        case 0:
          bad[pos] = static_cast<char>(rng());
          break;
        case 1: {  // a 32-bit field set to a boundary value
          const uint32_t vals[] = {0,          0xffffffff, 0xfffffffe,
                                   0x7fffffff, 0x10000,    0xffff};
          const uint32_t v = vals[rng() % 6];
          if (pos + 4 <= bad.size()) std::memcpy(&bad[pos], &v, 4);
          break;
        }
        default: {  // a 64-bit field
          const uint64_t v = rng() % 2 ? ~uint64_t{0} : rng();
          if (pos + 8 <= bad.size()) std::memcpy(&bad[pos], &v, 8);
        }
      }
    }
    (void)OpenAndRead(bad);
  }
}

// Offsets of the parts of SmallArchive() (no zip64).
struct Layout {
  size_t cd;    // first central directory header
  size_t eocd;  // end of central directory record
};
Layout Find(const std::string& a) {
  return {a.find(std::string("PK\x01\x02", 4)),
          a.rfind(std::string("PK\x05\x06", 4))};
}

void Set32(std::string* s, size_t pos, uint32_t v) {
  std::memcpy(&(*s)[pos], &v, 4);
}
void Set16(std::string* s, size_t pos, uint16_t v) {
  std::memcpy(&(*s)[pos], &v, 2);
}
void Set64(std::string* s, size_t pos, uint64_t v) {
  std::memcpy(&(*s)[pos], &v, 8);
}

TEST(ZipCorruptionTest, BogusFields) {
  const std::string good = SmallArchive();
  const Layout l = Find(good);
  ASSERT_NE(l.cd, std::string::npos);
  ASSERT_NE(l.eocd, std::string::npos);
  auto expect = [&](std::string bad, absl::StatusCode code,
                    std::string_view needle) {
    const absl::Status s = OpenAndRead(bad);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_TRUE(absl::StrContains(
        s.message(), absl::string_view(needle.data(), needle.size())))
        << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "mem.zip @ 0")) << s;
  };
  std::string bad;
  // EOCD: central directory offset / size / count.
  bad = good;
  Set32(&bad, l.eocd + 16, 0xfffffff0);
  expect(bad, absl::StatusCode::kOutOfRange, "central directory [");
  bad = good;
  Set32(&bad, l.eocd + 12, 0xfffffff0);
  expect(bad, absl::StatusCode::kOutOfRange, "central directory [");
  bad = good;
  Set16(&bad, l.eocd + 8, 0xffff);
  Set16(&bad, l.eocd + 10, 0xffff);
  expect(bad, absl::StatusCode::kInvalidArgument, "entries do not fit");
  bad = good;
  Set16(&bad, l.eocd + 10, 3);
  expect(bad, absl::StatusCode::kInvalidArgument, "multi-disk");
  bad = good;
  Set16(&bad, l.eocd + 4, 1);
  expect(bad, absl::StatusCode::kInvalidArgument, "multi-disk");
  // Central directory entry fields.
  bad = good;
  Set32(&bad, l.cd, 0x12345678);
  expect(bad, absl::StatusCode::kInvalidArgument,
         "bad central directory signature");
  bad = good;
  Set16(&bad, l.cd + 10, 8);
  expect(bad, absl::StatusCode::kInvalidArgument, "compression method 8");
  bad = good;
  Set16(&bad, l.cd + 8, 0x0809);
  expect(bad, absl::StatusCode::kInvalidArgument, "encrypted");
  bad = good;
  Set32(&bad, l.cd + 20, 5);
  expect(bad, absl::StatusCode::kInvalidArgument, "compressed size");
  bad = good;
  Set32(&bad, l.cd + 42, 0xfffffff0);
  expect(bad, absl::StatusCode::kOutOfRange, "local header at");
  bad = good;
  Set32(&bad, l.cd + 42, 1);
  expect(bad, absl::StatusCode::kInvalidArgument, "bad local header signature");
  bad = good;
  Set16(&bad, l.cd + 28, 0xffff);
  expect(bad, absl::StatusCode::kInvalidArgument,
         "extends past the central directory end");
  bad = good;
  Set16(&bad, l.cd + 30, 0xfff0);
  expect(bad, absl::StatusCode::kInvalidArgument,
         "extends past the central directory end");
  bad = good;
  bad[l.cd + 46 + 3] ^= 1;  // name differs from the local header
  expect(bad, absl::StatusCode::kInvalidArgument, "names a different entry");
  // Sizes: data past the end, and a CRC mismatch.
  bad = good;
  Set32(&bad, l.cd + 24, 0x7fffffff);
  Set32(&bad, l.cd + 20, 0x7fffffff);
  expect(bad, absl::StatusCode::kOutOfRange,
         "entry 'archive/data.pkl': data [64, +2147483647) extends past the "
         "archive end");
  bad = good;
  Set32(&bad, l.cd + 16, 0xdeadbeef);
  expect(bad, absl::StatusCode::kInvalidArgument, "CRC-32 mismatch");
  // Zip64 sentinel without a zip64 extra field is taken literally.
  bad = good;
  Set32(&bad, l.cd + 24, 0xffffffff);
  Set32(&bad, l.cd + 20, 0xffffffff);
  expect(bad, absl::StatusCode::kOutOfRange, "extends past the archive end");
  // Local header extra length pushes the data out.
  bad = good;
  Set16(&bad, 28, 0xffff);
  expect(bad, absl::StatusCode::kOutOfRange, "extends past the archive end");
  // No EOCD at all.
  bad = good;
  Set32(&bad, l.eocd, 0);
  expect(bad, absl::StatusCode::kInvalidArgument,
         "no end of central directory");
  // Duplicate names.
  {
    ZipArchiveBuilder b;
    b.AddOwnedRecord("x", "1");
    b.AddOwnedRecord("x", "2");
    std::string dup(b.size(), '\0');
    b.FinishInto(dup.data());
    expect(dup, absl::StatusCode::kInvalidArgument,
           "duplicate entry 'archive/x'");
  }
}

TEST(ZipCorruptionTest, BogusZip64Fields) {
  const std::string good = SmallArchive(0);
  ASSERT_OK(OpenAndRead(good));
  const size_t z = good.rfind(std::string("PK\x06\x06", 4));
  const size_t loc = good.rfind(std::string("PK\x06\x07", 4));
  ASSERT_NE(z, std::string::npos);
  ASSERT_NE(loc, std::string::npos);
  auto code = [](const std::string& b) { return OpenAndRead(b).code(); };
  std::string bad;
  for (uint64_t v : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{0xffffffff}}) {
    bad = good;
    Set64(&bad, z + 48, v);  // cd offset
    EXPECT_EQ(code(bad), absl::StatusCode::kOutOfRange);
    bad = good;
    Set64(&bad, z + 40, v);  // cd size
    EXPECT_NE(code(bad), absl::StatusCode::kOk);
    bad = good;
    Set64(&bad, z + 32, v);
    Set64(&bad, z + 24, v);  // counts
    EXPECT_NE(code(bad), absl::StatusCode::kOk);
    bad = good;
    Set64(&bad, loc + 8, v);  // zip64 EOCD offset
    EXPECT_EQ(code(bad), absl::StatusCode::kOutOfRange);
  }
  bad = good;
  Set32(&bad, z, 0);
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = good;
  Set32(&bad, loc + 16, 2);
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  // Zip64 extra field too short in the central directory.
  const size_t cd = good.find(std::string("PK\x01\x02", 4));
  const uint16_t name_len = static_cast<uint16_t>(good[cd + 28]);
  bad = good;
  Set16(&bad, cd + 46 + name_len + 2, 8);  // claims 8 of 24 bytes
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
}

TEST(ZipCorruptionTest, Limits) {
  const std::string good = SmallArchive();
  ZipReaderOptions o;
  o.max_entries = 3;
  EXPECT_EQ(OpenAndRead(good, 0, o).code(),
            absl::StatusCode::kResourceExhausted);
  o = {};
  o.max_central_directory_bytes = 100;
  EXPECT_EQ(OpenAndRead(good, 0, o).code(),
            absl::StatusCode::kResourceExhausted);
  StringFile file(good);
  ASSERT_OK_AND_ASSIGN(auto reader,
                       ZipArchiveReader::Open(&file, 0, good.size()));
  EXPECT_EQ(reader->ReadRecord(*reader->Find("data/0"), 99).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A foreign entry that points outside the archive.
  ZipEntry e{"archive/bogus", good.size() - 2, 10, 0};
  EXPECT_EQ(reader->ReadRecord(e, 100).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(reader->VerifyCrc(e).code(), absl::StatusCode::kOutOfRange);
  // Too short to be a zip.
  EXPECT_EQ(OpenAndRead("PK").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenAndRead("").code(), absl::StatusCode::kInvalidArgument);
}

TEST(ZipCorruptionTest, CommentAndTrailingBytes) {
  std::string a = SmallArchive();
  const Layout l = Find(a);
  // A comment after the EOCD.
  std::string with_comment = a + "hello";
  Set16(&with_comment, l.eocd + 20, 5);
  EXPECT_OK(OpenAndRead(with_comment));
  // A comment that itself contains an EOCD signature.
  std::string tricky = a + std::string("PK\x05\x06", 4) + std::string(30, '\0');
  Set16(&tricky, l.eocd + 20, 34);
  EXPECT_OK(OpenAndRead(tricky));
  // Trailing bytes that the comment length does not cover are tolerated.
  EXPECT_OK(OpenAndRead(a + "junk"));
}

TEST(ZipCorruptionTest, GarbageWithFakeEnd) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int iter = 0; iter < 5000; ++iter) {
    std::string g = RandomBytes(rng, rng() % 300);
    // Sprinkle signatures.
    for (const char* sig :
         {"PK\x01\x02", "PK\x03\x04", "PK\x06\x06", "PK\x06\x07"}) {
      if (g.size() > 8 && rng() % 2)
        g.replace(rng() % (g.size() - 4), 4, sig, 4);
    }
    std::string eocd("PK\x05\x06", 4);
    eocd += RandomBytes(rng, 16);
    eocd += std::string(2, '\0');
    if (rng() % 2) {  // plausible counts
      Set16(&eocd, 4, 0);
      Set16(&eocd, 6, 0);
      const uint16_t n = static_cast<uint16_t>(rng() % 4);
      Set16(&eocd, 8, n);
      Set16(&eocd, 10, n);
      const uint32_t cd_off = static_cast<uint32_t>(rng() % (g.size() + 1));
      Set32(&eocd, 16, cd_off);
      Set32(&eocd, 12, static_cast<uint32_t>(g.size() - cd_off));
    }
    (void)OpenAndRead(g + eocd);
  }
}

// ---------------------------------------------------------------------------
// FinishInto of a 64 MiB record: the archive holds the bytes and their CRC.
// (Its speed against memcpy is a benchmark figure, format_bench's
// serialize_64mib workload: a timed assertion here failed whenever the
// other core was busy.)
// ---------------------------------------------------------------------------

TEST(ZipLargeTest, FinishIntoOf64MiBRecordRoundTrips) {
  constexpr size_t kSize = size_t{64} << 20;
  std::string src(kSize, '\0');
  for (size_t i = 0; i < kSize; i += 8) src[i] = static_cast<char>(i * 31);
  ZipArchiveBuilder b;
  b.AddOwnedRecord("data.pkl", std::string(200, 'p'));
  b.AddOwnedRecord("byteorder", "little");
  const std::string_view piece = src;
  b.AddRecord("data/0", {&piece, 1});
  b.AddOwnedRecord("version", "3\n");
  std::string dst(b.size(), '\1');
  b.FinishInto(dst.data());
  InMemoryFile file(std::move(dst));
  ASSERT_OK_AND_ASSIGN(auto archive,
                       ZipArchiveReader::Open(&file, 0, file.Size()));
  const ZipEntry* data = archive->Find("data/0");
  ASSERT_NE(data, nullptr);
  ASSERT_EQ(data->size, kSize);
  ASSERT_OK(archive->VerifyCrc(*data));
  ASSERT_OK_AND_ASSIGN(std::string back, archive->ReadRecord(*data, kSize));
  EXPECT_TRUE(back == src);
}

}  // namespace
}  // namespace ckptd::format
