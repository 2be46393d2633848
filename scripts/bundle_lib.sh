# Sourced by tests/interop/run_on_gpu_machine.sh and scripts/gpu_check.sh
# (--make-bundle): a bundle is a folder whose binaries run on a machine
# without Debian 12's libraries (the GPU machine, the Debian 13 root of
# scripts/torch2_chroot.sh).
#
# bundle_add_binaries DST BIN...
#   copies the shared libraries BIN... need into DST/lib (not glibc, not
#   libstdc++ / libgcc_s: the host's, newer, are what its torch needs; not
#   libcuda: the driver's; not those already there), and points each BIN at
#   DST/lib and each newly copied library at its siblings by RPATH
#   (patchelf --force-rpath: DT_RPATH, which the loader also follows for the
#   dependencies of dependencies, unlike DT_RUNPATH). Nothing relies on
#   LD_LIBRARY_PATH, which would push the bundle's libstdc++ into a Python
#   process and break its torch. BIN... must lie one folder below DST.
bundle_add_binaries() {
  local dst=$1 lib name f
  shift
  command -v patchelf >/dev/null 2>&1 || {
    echo "patchelf is missing (scripts/setup.sh installs it)" >&2; return 1; }
  mkdir -p "$dst/lib" || return 1
  while read -r lib; do
    name=$(basename "$lib")
    case $name in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) continue ;;
      libstdc++.so*|libgcc_s.so*|libcuda.so*) continue ;;
    esac
    [[ -f "$dst/lib/$name" ]] && continue
    cp -L "$lib" "$dst/lib/$name" && chmod u+w "$dst/lib/$name" &&
      patchelf --force-rpath --set-rpath '$ORIGIN' "$dst/lib/$name" || return 1
  done < <(ldd "$@" 2>/dev/null | awk '/=> \// {print $3}' | sort -u)
  for f in "$@"; do
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f" || return 1
  done
}
