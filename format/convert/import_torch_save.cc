// Copyright 2026 The ckptd Authors.
#include "format/convert/import_torch_save.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/pickle.h"
#include "format/pickle/py_value.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace ckptd::format {
namespace {

using K = pickle::Value::Kind;

// The input file mapped read-only: tensors are written straight from it.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      const std::string msg =
          fmt::format("open {}: {}", path, std::strerror(e));
      return e == ENOENT ? absl::NotFoundError(msg)
                         : absl::InvalidArgumentError(msg);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(
          fmt::format("{} is not a regular file", path));
    }
    auto m = std::unique_ptr<MappedFile>(new MappedFile());
    m->size_ = static_cast<uint64_t>(st.st_size);
    if (m->size_ > 0) {
      void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        return absl::ResourceExhaustedError(
            fmt::format("mmap {}: {}", path, std::strerror(e)));
      }
      m->data_ = static_cast<const char*>(p);
      ::madvise(p, m->size_, MADV_SEQUENTIAL);
    }
    ::close(fd);
    return m;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  const char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
};

// The mapping as a RandomAccessFile, for the zip reader (no copy).
class MappedView final : public RandomAccessFile {
 public:
  MappedView(const MappedFile& map, std::string path)
      : map_(map), path_(std::move(path)) {}
  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    if (offset > map_.size() || n > map_.size() - offset) {
      return absl::OutOfRangeError(
          fmt::format("{}: read of {} bytes at {} past the end ({} bytes)",
                      path_, n, offset, map_.size()));
    }
    if (n > 0) std::memcpy(scratch, map_.data() + offset, n);
    return absl::OkStatus();
  }
  uint64_t Size() const override { return map_.size(); }
  const std::string& path() const override { return path_; }

 private:
  const MappedFile& map_;
  const std::string path_;
};

bool IsDictLike(const pickle::Value& v) {
  return v.kind == K::kDict ||
         (v.kind == K::kObject && v.IsCallTo("collections", "OrderedDict"));
}

// torch.distributed.checkpoint._traverse's _is_terminal for a list: not
// descended unless it holds a tensor, a dict, or a descended list.
bool IsTerminalList(const pickle::Value& v) {
  for (const pickle::Value* e : v.items) {
    if (e == nullptr) continue;
    if (IsDictLike(*e) || IsTensorValue(*e)) return false;
    if (e->kind == K::kList && !IsTerminalList(*e)) return false;
  }
  return true;
}

std::string Fqn(const std::vector<PathElement>& path) {
  std::string out;
  for (const PathElement& p : path) {
    if (!out.empty()) out += '.';
    if (const auto* s = std::get_if<std::string>(&p)) {
      out += *s;
    } else {
      out += std::to_string(std::get<int64_t>(p));
    }
  }
  return out;
}

class Importer {
 public:
  Importer(const ZipArchiveReader& archive, const MappedFile& map,
           bool big_endian, const ImportOptions& options)
      : archive_(archive),
        map_(map),
        big_endian_(big_endian),
        options_(options) {}

  absl::Status Walk(const pickle::Value& root) {
    if (!IsDictLike(root)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: the saved object is a {}, not a state dict (a dict)",
                      archive_.Describe(), pickle::DebugString(root, 1, 80)));
    }
    std::vector<PathElement> path;
    return Visit(root, path);
  }

  std::vector<WriteItem>& items() { return items_; }
  ImportStats& stats() { return stats_; }

 private:
  absl::Status Visit(const pickle::Value& v, std::vector<PathElement>& path) {
    if (path.size() > 256) {
      return absl::InvalidArgumentError(
          fmt::format("{}: nested more than 256 levels", Fqn(path)));
    }
    if (IsDictLike(v)) {
      for (const auto& [k, val] : v.entries) {
        if (k == nullptr || val == nullptr) continue;
        // DCP makes every dict key a str path element (str(key)).
        if (k->kind == K::kString) {
          path.emplace_back(k->str);
        } else if (k->kind == K::kInt) {
          path.emplace_back(std::to_string(k->i));
        } else {
          return absl::InvalidArgumentError(
              fmt::format("{}: a dict key that is {}, not a str or int",
                          Fqn(path), pickle::DebugString(*k, 1, 60)));
        }
        absl::Status s = Visit(*val, path);
        path.pop_back();
        RETURN_IF_ERROR(s);
      }
      return absl::OkStatus();
    }
    if (v.kind == K::kList && !IsTerminalList(v)) {
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (v.items[i] == nullptr) continue;
        path.emplace_back(static_cast<int64_t>(i));
        absl::Status s = Visit(*v.items[i], path);
        path.pop_back();
        RETURN_IF_ERROR(s);
      }
      return absl::OkStatus();
    }
    if (path.empty()) return absl::OkStatus();
    return IsTensorValue(v) ? AddTensor(v, path) : AddObject(v, path);
  }

  absl::Status AddTensor(const pickle::Value& v,
                         const std::vector<PathElement>& path) {
    const std::string fqn = Fqn(path);
    ASSIGN_OR_RETURN(TensorRecord rec,
                     ParseTensorValue(archive_, v, big_endian_, fqn));
    if (rec.big_endian) {
      return absl::UnimplementedError(
          fmt::format("{}: the file was saved on a big-endian machine", fqn));
    }
    if (options_.verify_crc && checked_.insert(rec.entry).second) {
      RETURN_IF_ERROR(archive_.VerifyCrc(*rec.entry));
    }
    WriteItem item;
    item.desc.fqn = fqn;
    item.desc.type = ItemDesc::Type::kTensor;
    item.desc.dtype = rec.dtype;
    item.desc.global_shape = rec.sizes;
    item.desc.chunk_offsets.assign(rec.sizes.size(), 0);
    item.desc.chunk_sizes = rec.sizes;
    item.desc.path = path;
    item.tensor.dtype = rec.dtype;
    item.tensor.sizes = rec.sizes;
    item.tensor.strides = rec.strides;
    item.tensor.data =
        map_.data() + rec.entry->data_offset +
        static_cast<uint64_t>(rec.storage_offset) * ElementSize(rec.dtype);
    stats_.tensors++;
    stats_.tensor_bytes += item.tensor.nbytes();
    items_.push_back(std::move(item));
    return absl::OkStatus();
  }

  absl::Status AddObject(const pickle::Value& v,
                         const std::vector<PathElement>& path) {
    const std::string fqn = Fqn(path);
    absl::StatusOr<PyValue> value = PyValueFromPickle(v);
    if (!value.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: ckptd cannot re-encode this value as a bytes item ({}); "
          "nothing in the file was run",
          fqn, value.status().message()));
    }
    payloads_.push_back(EncodeTorchSaveObject(*value));
    WriteItem item;
    item.desc.fqn = fqn;
    item.desc.type = ItemDesc::Type::kBytes;
    item.desc.path = path;
    item.bytes = payloads_.back();
    stats_.objects++;
    items_.push_back(std::move(item));
    return absl::OkStatus();
  }

  const ZipArchiveReader& archive_;
  const MappedFile& map_;
  const bool big_endian_;
  const ImportOptions& options_;
  std::vector<WriteItem> items_;
  std::deque<std::string> payloads_;  // stable addresses for item.bytes
  absl::flat_hash_set<const ZipEntry*> checked_;
  ImportStats stats_;
};

}  // namespace

absl::StatusOr<ImportStats> ImportTorchSave(const std::string& file,
                                            const std::string& dir,
                                            const ImportOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(file));
  MappedView view(*map, file);
  auto archive = ZipArchiveReader::Open(&view, 0, map->size());
  if (!archive.ok()) {
    return absl::InvalidArgumentError(fmt::format(
        "{} is not a torch.save file: {}", file, archive.status().message()));
  }
  bool big_endian = false;
  if (const ZipEntry* bo = (*archive)->Find("byteorder"); bo != nullptr) {
    ASSIGN_OR_RETURN(std::string order, (*archive)->ReadRecord(*bo, 64));
    big_endian = order == "big";
  }
  ASSIGN_OR_RETURN(
      auto doc, ParseArchivePickle(**archive, options.max_pickle_bytes, file));
  Importer importer(**archive, *map, big_endian, options);
  RETURN_IF_ERROR(importer.Walk(doc->root()));
  if (importer.items().empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: the state dict holds nothing to save", file));
  }
  CheckpointWriterOptions wopts;
  wopts.env = options.env;
  wopts.overwrite = options.overwrite;
  wopts.sync = options.sync;
  const std::vector<std::vector<WriteItem>> ranks = {
      std::move(importer.items())};
  ASSIGN_OR_RETURN(WriteResult written, WriteCheckpoint(dir, ranks, wopts));
  ImportStats stats = importer.stats();
  stats.bytes_written = written.data_bytes + written.metadata_bytes;
  return stats;
}

}  // namespace ckptd::format
