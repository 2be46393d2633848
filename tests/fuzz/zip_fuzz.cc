// Copyright 2026 The ckptd Authors.
//
// libFuzzer target for torch.save archives. An input that starts with the
// pickle PROTO opcode (0x80) is a data.pkl: it is wrapped in a valid archive
// (with data/0 and version records) so that mutations reach the payload
// parser past the CRC check. Any other input is the archive file itself.
// Runs ZipArchiveReader::Open (at offset 0 and at a small offset), reads and
// CRC-checks every record, and parses the tensor payload; a payload the
// parser accepts is then gathered with StridedCopy, so a view that the
// parser wrongly lets outside its storage shows up as an ASan error.
//
//   cmake -S . -B build-fuzz-zip -G Ninja -DCMAKE_C_COMPILER=clang \
//     -DCMAKE_CXX_COMPILER=clang++ -DCKPTD_FUZZ=ON
//   ninja -C build-fuzz-zip zip_fuzz
//   build-fuzz-zip/fuzz/zip_fuzz -max_total_time=60 tests/fuzz/corpus/zip
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/env.h"
#include "format/tensor/strided_copy.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace {

using namespace ckptd;          // NOLINT
using namespace ckptd::format;  // NOLINT

// An in-memory RandomAccessFile over the fuzzer's input.
class MemFile : public RandomAccessFile {
 public:
  MemFile(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError("read past the end");
    }
    if (n > 0) std::memcpy(scratch, data_ + offset, n);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  const char* data_;
  size_t size_;
  std::string path_ = "fuzz";
};

constexpr uint64_t kMaxRecord = 1 << 16;

void Exercise(const MemFile& file, uint64_t offset, uint64_t length) {
  ZipReaderOptions zopts;
  zopts.max_entries = 64;
  zopts.max_central_directory_bytes = 1 << 16;
  auto reader = ZipArchiveReader::Open(&file, offset, length, zopts);
  if (!reader.ok()) return;
  const ZipArchiveReader& r = **reader;
  for (const ZipEntry& e : r.entries()) {
    if (e.data_offset + e.size > length) __builtin_trap();  // Open's promise
    (void)r.ReadRecord(e, kMaxRecord);
    if (e.size <= kMaxRecord) (void)r.VerifyCrc(e);
    char buf[8];
    (void)r.ReadRange(e, e.size / 2, e.size >= 8 ? 8 : 0, buf);
  }
  TensorPayloadOptions popts;
  popts.max_pickle_bytes = kMaxRecord;
  auto rec = ParseTensorPayload(r, popts);
  if (!rec.ok()) return;
  if (rec->entry == nullptr || rec->entry->size < rec->storage_nbytes) {
    __builtin_trap();
  }
  if (rec->storage_nbytes > kMaxRecord) return;
  // Gather the view out of exactly storage_nbytes bytes (ASan-visible).
  std::vector<char> storage(rec->storage_nbytes);
  if (!r.ReadRange(*rec->entry, 0, storage.size(), storage.data()).ok()) {
    return;
  }
  const size_t esize = ElementSize(rec->dtype);
  uint64_t numel = 1;
  for (int64_t s : rec->sizes) numel *= static_cast<uint64_t>(s);
  if (numel == 0 || numel > kMaxRecord) return;
  std::vector<char> out(numel * esize);
  StridedCopy(esize, rec->sizes,
              storage.data() + rec->storage_offset * static_cast<int64_t>(esize),
              rec->strides, out.data(), ContiguousStrides(rec->sizes));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 0x80) {
    const std::string_view pkl(reinterpret_cast<const char*>(data), size);
    const std::string storage(4096 - size % 64, 'd');
    const std::string_view storage_view = storage;
    ZipArchiveBuilder b;
    b.AddRecord("data.pkl", absl::MakeConstSpan(&pkl, 1));
    b.AddRecord("data/0", absl::MakeConstSpan(&storage_view, 1));
    b.AddOwnedRecord("version", "3\n");
    std::string archive(b.size(), '\0');
    b.FinishInto(archive.data());
    MemFile file(reinterpret_cast<const uint8_t*>(archive.data()),
                 archive.size());
    Exercise(file, 0, archive.size());
    return 0;
  }
  MemFile file(data, size);
  Exercise(file, 0, size);
  if (size > 7) Exercise(file, 7, size - 7);  // an item inside a bigger file
  return 0;
}
