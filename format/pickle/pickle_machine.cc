// Copyright 2026 The ckptd Authors.
#include "format/pickle/pickle_machine.h"

#include "common/absl_fmt.h"

namespace ckptd::pickle::internal {

bool SetError(MachineState& m, uint64_t input_size, absl::StatusCode code,
              std::string_view what) {
  if (!m.error.ok()) return false;
  std::string op;
  if (m.op_pos < input_size) {
    const uint8_t c = m.op;
    op = c >= 0x20 && c < 0x7f
             ? fmt::format("opcode 0x{:02x} '{}' ({}): ", c,
                           static_cast<char>(c), OpName(c))
             : fmt::format("opcode 0x{:02x} ({}): ", c, OpName(c));
  }
  m.error = absl::Status(code, fmt::format("{}: offset {}: {}{}", m.source_name,
                                           m.op_pos, op, what));
  return false;
}

bool SetIoError(MachineState& m, const Source& in) {
  if (!m.error.ok()) return false;
  m.error = absl::DataLossError(fmt::format(
      "{}: offset {}: {}", m.source_name, in.pos(), in.io_status().message()));
  return false;
}

}  // namespace ckptd::pickle::internal
