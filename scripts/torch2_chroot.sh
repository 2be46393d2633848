#!/usr/bin/env bash
# Real PyTorch 2.x on the build machine, without a GPU and without PyPI:
# a Debian 13 (trixie) root with Debian's python3-torch (2.6, CPU) made by
# debootstrap from the same Debian archive this machine's apt uses, and the
# tests/interop suite run inside it against this tree's build.
#
#   bash scripts/torch2_chroot.sh setup        # make the root (once; ~1.5 GB,
#                                              # a few minutes), idempotent
#   bash scripts/torch2_chroot.sh interop [BUILD_DIR]
#        # bundle BUILD_DIR (default build) with
#        # tests/interop/run_on_gpu_machine.sh --make-bundle, then run that
#        # script inside the root: stock dcp.save/dcp.load/async_save of
#        # torch 2.6 against ckptd in both directions, and make_fixtures.py
#        # (the fixtures land in tests/fixtures/dcp_torch<ver>/)
#   bash scripts/torch2_chroot.sh run CMD...   # any command inside the root,
#                                              # in this tree, as root
#
# Needs root (debootstrap, chroot, bind mounts). The tree is bind-mounted at
# its own path inside the root, so paths (build dirs, tmp dirs under /tmp)
# are the same on both sides. Environment: CKPTD_TORCH2_ROOT (default
# /var/cache/ckptd/torch2-trixie), CKPTD_TORCH2_SUITE (default trixie),
# CKPTD_DEBIAN_MIRROR (default: the first Debian archive in this machine's
# apt sources). Exit status 3: the root could not be made (no archive
# reachable, not root); callers treat that as "skipped", with the reason.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
CHROOT=${CKPTD_TORCH2_ROOT:-/var/cache/ckptd/torch2-trixie}
SUITE=${CKPTD_TORCH2_SUITE:-trixie}
# Debian packages inside the root: torch (the writer/reader of record),
# pytest, and what tests/python/daemon_util.py needs to talk to the daemon
# (grpcio, protobuf and the stub compilers).
# debootstrap's resolver does not follow virtual packages (gRPC's re2), so
# the second list goes in with apt inside the new root.
PACKAGES=python3-torch,python3-pytest,python3-numpy,python3-yaml,procps
# python3-zstandard: torch's ZStandard extension (zstd-compressed
# checkpoints, torch >= 2.7); python3-safetensors: the SAFETENSORS format.
APT_PACKAGES=(python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc
              python3-zstandard python3-safetensors)

die() { echo "torch2_chroot: $*" >&2; exit "${2:-1}"; }

mirror() {
  if [[ -n "${CKPTD_DEBIAN_MIRROR:-}" ]]; then echo "$CKPTD_DEBIAN_MIRROR"; return; fi
  local m=""
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z "$m" && -f /etc/apt/sources.list ]]; then
    m=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' \
          /etc/apt/sources.list)
  fi
  [[ -n "$m" ]] || return 1
  echo "${m%/}"
}

# A root made before a package joined APT_PACKAGES gets it now.
ensure_packages() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    chroot "$CHROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
      grep -q "install ok installed" || missing+=("$p")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "installing ${missing[*]} into $CHROOT needs root" 3
  echo "torch2_chroot: installing ${missing[*]} into $CHROOT"
  cp -f /etc/resolv.conf "$CHROOT/etc/resolv.conf" 2>/dev/null || true
  # (-o ...: a mirror snapshot's sid Release file may be past its Valid-Until.)
  if ! { chroot "$CHROOT" apt-get -o Acquire::Check-Valid-Until=false update -qq &&
         chroot "$CHROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
       > "$CHROOT.apt.log" 2>&1; then
    tail -n 20 "$CHROOT.apt.log" >&2
    die "apt-get install ${missing[*]} in $CHROOT failed (log: $CHROOT.apt.log)" 3
  fi
  chroot "$CHROOT" apt-get clean
  rm -f "$CHROOT.apt.log"
}

setup() {
  if [[ -f "$CHROOT/.ckptd-ready" ]]; then
    ensure_packages
    echo "torch2_chroot: $CHROOT is ready"
    return 0
  fi
  [[ $(id -u) -eq 0 ]] || die "setup needs root (debootstrap)" 3
  if ! command -v debootstrap >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
      >/dev/null || die "cannot install debootstrap" 3
  fi
  local m
  m=$(mirror) || die "no Debian archive in this machine's apt sources (set CKPTD_DEBIAN_MIRROR)" 3
  local tmp="$CHROOT.tmp"
  rm -rf "$tmp"
  mkdir -p "$(dirname "$CHROOT")"
  echo "torch2_chroot: debootstrap $SUITE into $CHROOT (python3-torch and test tools)"
  if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$m" \
        > "$tmp.log" 2>&1; then
    tail -n 20 "$tmp.log" >&2
    die "debootstrap of $SUITE failed (log: $tmp.log)" 3
  fi
  cp -f /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
  if ! chroot "$tmp" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >> "$tmp.log" 2>&1; then
    tail -n 20 "$tmp.log" >&2
    die "apt-get install ${APT_PACKAGES[*]} in the new root failed (log: $tmp.log)" 3
  fi
  chroot "$tmp" apt-get clean
  local v
  v=$(chroot "$tmp" python3 -c 'import torch, torch.distributed.checkpoint; print(torch.__version__)' \
        2>/dev/null | tail -n 1) || die "torch does not import in the new root" 3
  echo "$v" > "$tmp/.ckptd-ready"
  rm -rf "$CHROOT" && mv "$tmp" "$CHROOT" && rm -f "$tmp.log"
  echo "torch2_chroot: ready, torch $(cat "$CHROOT/.ckptd-ready")"
}

MOUNTS=()
unmount_all() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount -l "${MOUNTS[$i]}" 2>/dev/null || true
  done
  MOUNTS=()
}
bind() {  # $1 = host path, bound at the same path inside the root
  mkdir -p "$CHROOT$1"
  mount --bind "$1" "$CHROOT$1" || die "mount --bind $1 failed (no mount rights here?)" 3
  MOUNTS+=("$CHROOT$1")
}

in_root() {  # runs "$@" inside the root, in this tree
  [[ -f "$CHROOT/.ckptd-ready" ]] || die "no root at $CHROOT: run '$0 setup' first" 3
  [[ $(id -u) -eq 0 ]] || die "needs root (chroot)" 3
  trap unmount_all EXIT
  mkdir -p "$CHROOT/proc"
  mount -t proc proc "$CHROOT/proc" || die "mount -t proc failed (no mount rights here?)" 3
  MOUNTS+=("$CHROOT/proc")
  bind /dev
  bind /dev/shm
  bind /sys
  bind /tmp
  bind "$ROOT"
  cp -f /etc/resolv.conf "$CHROOT/etc/resolv.conf" 2>/dev/null || true
  chroot "$CHROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    LANG=C.UTF-8 TMPDIR=/tmp ${OUT:+OUT=$OUT} ${PYTEST_ARGS:+PYTEST_ARGS="$PYTEST_ARGS"} \
    ${SKIP_FIXTURES:+SKIP_FIXTURES=$SKIP_FIXTURES} ${SKIP_PYTEST:+SKIP_PYTEST=$SKIP_PYTEST} \
    /bin/bash -c 'cd "$1" && shift && exec "$@"' bash "$ROOT" "$@"
  local rc=$?
  unmount_all
  trap - EXIT
  return $rc
}

case "${1:-}" in
  setup) setup ;;
  run)
    shift
    in_root "$@" ;;
  interop)
    build=$(cd "${2:-build}" 2>/dev/null && pwd) || die "no build dir ${2:-build}"
    [[ -x "$build/tools/interop_tool" ]] || die "no $build/tools/interop_tool: build first (scripts/build.sh $build)"
    bundle="$build/torch2-bundle"
    bash tests/interop/run_on_gpu_machine.sh --make-bundle "$build" "$bundle" >/dev/null ||
      die "cannot make the bundle from $build"
    in_root env PYTHON=/usr/bin/python3 CKPTD_BUILD_DIR="$bundle" SKIP_BUILD=1 \
      bash tests/interop/run_on_gpu_machine.sh ;;
  *)
    sed -n '2,24p' "$0" >&2
    exit 2 ;;
esac
