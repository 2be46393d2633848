// Copyright 2026 The ckptd Authors.
//
// The pieces both `.metadata` decoders share (schema_common.h).
#include "format/metadata/schema_common.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "format/metadata/dcp_modules.h"
#include "format/metadata/metadata.h"

namespace ckptd::format {

std::string ObjectPath::Render() const {
  std::vector<const ObjectPath*> chain;
  for (const ObjectPath* p = this; p != nullptr; p = p->parent) {
    chain.push_back(p);
  }
  std::string out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ObjectPath& p = **it;
    switch (p.type) {
      case Type::kRoot:
        break;
      case Type::kField:
        if (!out.empty()) out += '.';
        out.append(p.text);
        break;
      case Type::kKey:
        out += fmt::format("['{}']", p.text.substr(0, 200));
        break;
      case Type::kIndex:
        out += fmt::format("[{}]", p.index);
        break;
      case Type::kEntryKey:
        out += fmt::format(" entry {} (key)", p.index);
        break;
      case Type::kText:
        out += '[';
        out.append(p.text);
        out += ']';
        break;
      case Type::kStorage:
        out += '[';
        out += DescribeKey(*p.key);
        out += ']';
        break;
    }
  }
  return out;
}

absl::StatusOr<uint64_t> BigIntToUInt64(std::string_view b) {
  // Little-endian two's complement: non-negative and no set bit above
  // bit 63.
  if (b.empty()) return uint64_t{0};
  if (static_cast<unsigned char>(b.back()) & 0x80) {
    return absl::InvalidArgumentError("negative value");
  }
  for (size_t i = 8; i < b.size(); ++i) {
    if (b[i] != 0) return absl::InvalidArgumentError("int out of uint64 range");
  }
  uint64_t u = 0;
  for (size_t i = 0; i < b.size() && i < 8; ++i) {
    u |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
  }
  return u;
}

bool IsPathlibClass(std::string_view module, std::string_view name) {
  if (module != "pathlib" && module != "pathlib._local") return false;
  return name == "PosixPath" || name == "PurePosixPath" ||
         name == "WindowsPath" || name == "PureWindowsPath" || name == "Path" ||
         name == "PurePath";
}

PurePathJoiner::PurePathJoiner(std::string_view class_name)
    : sep_(class_name.find("Windows") != std::string_view::npos ? '\\' : '/') {}

void PurePathJoiner::Add(std::string_view s) {
  if (s.empty()) return;
  if (s.front() == '/' || (sep_ == '\\' && s.size() >= 2 && s[1] == ':')) {
    out_ = std::string(s);
  } else if (out_.empty() || out_.back() == sep_ || out_.back() == '/') {
    out_ += s;
  } else {
    out_ += sep_;
    out_ += s;
  }
}

std::string PurePathJoiner::Finish() && {
  if (out_.empty()) return std::string(".");
  return std::move(out_);
}

bool IsMemoryFormatEnum(std::string_view module, std::string_view name) {
  return (module == kMetadataModule || module == kShardModule) &&
         (name == "_MEM_FORMAT_ENCODING" || name == "MEM_FORMAT_ENCODING");
}

std::optional<int> MemoryFormatOfTorchGlobal(std::string_view name) {
  if (name == "contiguous_format") return 0;
  if (name == "channels_last") return 1;
  if (name == "preserve_format") return 2;
  return std::nullopt;
}

std::optional<int> MemoryFormatOfEnumMember(std::string_view member) {
  if (member == "TORCH_CONTIGUOUS_FORMAT") return 0;
  if (member == "TORCH_CHANNELS_LAST") return 1;
  if (member == "TORCH_PRESERVE_FORMAT") return 2;
  return std::nullopt;
}

}  // namespace ckptd::format
