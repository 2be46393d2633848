#!/usr/bin/env bash
# Google clang-format (.clang-format) is enforced on the files listed in
# scripts/format_enforced.txt: the files a change creates or rewrites join
# the list, so formatting spreads with the changes instead of in one
# tree-wide reformat. Exit 1 naming every file that is not formatted
# (fix: clang-format -i FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
LIST=scripts/format_enforced.txt
command -v clang-format >/dev/null || { echo "check_format: clang-format missing (scripts/setup.sh installs it)" >&2; exit 1; }
bad=()
n=0
while IFS= read -r f; do
  [[ -z "$f" || "$f" == \#* ]] && continue
  if [[ ! -f "$f" ]]; then
    bad+=("$f (listed but missing)")
    continue
  fi
  n=$((n + 1))
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done < "$LIST"
if ((${#bad[@]})); then
  printf 'not clang-formatted: %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: $n files formatted"
