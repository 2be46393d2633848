// An Env whose files tell a RestoreObserver how many bytes restores read
// from them: the checkpoint's data files on storage, below the memory
// tier's Env (what the tier serves from memory is not read from a file and
// is not counted here; a held file the tier evicted reads through this Env
// again and is). Reads, direct reads and CRC checks count; `.metadata`
// (decoded once per cached checkpoint) does not.
#ifndef CKPTD_DAEMON_RESTORE_COUNTING_ENV_H_
#define CKPTD_DAEMON_RESTORE_COUNTING_ENV_H_

#include <memory>

#include "common/env.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

// `base` and `observer` are not owned and must outlive the Env and every
// file it opened.
std::unique_ptr<Env> NewFileReadCountingEnv(Env* base,
                                            RestoreObserver* observer);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_COUNTING_ENV_H_
