"""A real file system for the daemon's tests (test_real_fs.py): a small ext4
image attached to a loop device and mounted, with the tools the tests need
to make it misbehave the way real disks do:

  * fill_to(n): a filler file (fallocate) leaves exactly n bytes that an
    unprivileged write can still get (statvfs f_bavail; mkfs -m 0, so root
    has no extra reserve) — ENOSPC at a chosen point;
  * power_cut(): EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_NOLOGFLUSH, the
    xfstests way to simulate a power failure: from that instant nothing more
    reaches the image (dirty pages and the uncommitted ext4 journal are
    lost); remount() then replays the journal as after a reboot;
  * remount(): unmount + mount (every later read comes from the image, not
    the page cache);
  * freeze() / thaw(): `fsfreeze -f` / `-u`, hung storage: every write,
    create, unlink and rename on the file system blocks in the kernel
    (uninterruptibly, like a dead disk or an NFS server gone) until thaw().
    close() thaws first.

Needs root (losetup, mount). LoopFs.create() raises pytest's Skipped with
the precise reason when it cannot make the file system. close() always
unmounts and detaches the loop device.
"""
import ctypes
import fcntl
import os
import pathlib
import shutil
import subprocess
import time

BLOCK = 4096
# _IOR('X', 125, __u32): include/uapi/linux/ext4.h (also XFS_IOC_GOINGDOWN).
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 0x2


def _run(argv, check=True, timeout=60):
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {p.returncode}: "
                           f"{p.stdout.strip()} {p.stderr.strip()}")
    return p


def skip_reason():
    """Why a loop-mounted ext4 cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (losetup, mkfs.ext4, mount -o loop); running as uid %d" % os.geteuid()
    for tool in ("losetup", "mkfs.ext4", "mount", "umount", "fsfreeze"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}") \
                and not os.path.exists(f"/sbin/{tool}"):
            return f"{tool} is not installed"
    return None


def _tool(name):
    for p in (shutil.which(name), f"/usr/sbin/{name}", f"/sbin/{name}"):
        if p and os.path.exists(p):
            return p
    return name


class LoopFs:
    """An ext4 image of `size_mib` MiB in `workdir`, mounted at workdir/mnt."""

    def __init__(self, workdir, size_mib):
        self.workdir = pathlib.Path(workdir)
        self.image = self.workdir / "ext4.img"
        self.mnt = self.workdir / "mnt"
        self.size_mib = size_mib
        self.dev = None
        self.mounted = False
        self.frozen = False

    @classmethod
    def create(cls, workdir, size_mib=64):
        """Makes, attaches and mounts the image; pytest.skip (with the tool's
        message) where that is impossible here."""
        import pytest
        reason = skip_reason()
        if reason:
            pytest.skip(reason)
        fs = cls(workdir, size_mib)
        fs.workdir.mkdir(parents=True, exist_ok=True)
        fs.mnt.mkdir(exist_ok=True)
        try:
            with open(fs.image, "wb") as f:
                f.truncate(size_mib << 20)
            # -m 0: no blocks reserved for root (the tests run as root, which
            # would otherwise write into them); 4 KiB blocks; no lazy init, so
            # no background writes after mount.
            _run([_tool("mkfs.ext4"), "-q", "-F", "-m", "0", "-b", str(BLOCK),
                  "-E", "lazy_itable_init=0,lazy_journal_init=0", fs.image])
            fs.dev = _run([_tool("losetup"), "--find", "--show", fs.image]).stdout.strip()
            fs._mount()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            fs.close()
            pytest.skip(f"cannot make a loop-mounted ext4 here: {e}")
        return fs

    def _mount(self):
        _run([_tool("mount"), "-t", "ext4", self.dev, self.mnt])
        self.mounted = True

    def _umount(self):
        deadline = time.monotonic() + 30
        while True:
            p = _run([_tool("umount"), self.mnt], check=False)
            if p.returncode == 0:
                self.mounted = False
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"umount {self.mnt}: {p.stderr.strip()}")
            time.sleep(0.1)  # EBUSY: a process still exiting holds a file

    def remount(self, fsck=False):
        """Unmounts and mounts again (the mount replays the ext4 journal
        after power_cut()). fsck: then unmount once more and `e2fsck -fn`
        the replayed image before the final mount; returns e2fsck's report
        if it found a problem, else None."""
        self._umount()
        self._mount()
        problem = None
        if fsck:
            self._umount()
            p = _run([_tool("e2fsck"), "-fn", self.dev], check=False)
            if p.returncode != 0:
                problem = f"e2fsck -fn exited {p.returncode}: {p.stdout}{p.stderr}"
            self._mount()
        return problem

    def freeze(self):
        """fsfreeze -f: writes to the file system block until thaw()."""
        _run([_tool("fsfreeze"), "-f", self.mnt])
        self.frozen = True

    def thaw(self):
        """fsfreeze -u (a file system that is not frozen is fine)."""
        p = _run([_tool("fsfreeze"), "-u", self.mnt], check=False)
        if p.returncode != 0 and "Invalid argument" not in p.stderr:
            raise RuntimeError(f"fsfreeze -u {self.mnt}: {p.stderr.strip()}")
        self.frozen = False

    def power_cut(self):
        """EXT4_IOC_SHUTDOWN(NOLOGFLUSH): nothing more reaches the image."""
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, ctypes.c_uint32(EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def sync(self):
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.syncfs(fd) if hasattr(os, "syncfs") else _libc_syncfs(fd)
        finally:
            os.close(fd)

    def free_bytes(self):
        """Bytes an ordinary write may still allocate (f_bavail), after a
        syncfs so that delayed allocations and freed blocks are settled."""
        self.sync()
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize

    def fill_to(self, free, tries=40):
        """Fills the file system with filler files (fallocate) so that
        exactly `free` bytes (a multiple of 4 KiB) stay available; returns
        them. Fragmented free space costs a filler extent-tree blocks, so it
        fills to a margin first, then tops up (or trims) until exact."""
        assert free % BLOCK == 0, free
        self.drop_filler()
        have = self.free_bytes()
        assert have >= free, (have, free)
        files = []
        margin = 16 * BLOCK
        for _ in range(tries):
            if have == free:
                return have
            if have > free:
                want = have - free
                if not files and want > 2 * margin:
                    want -= margin
                path = self.mnt / f"filler.{len(files)}.bin"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    while want > 0:
                        try:
                            os.posix_fallocate(fd, 0, want)
                            break
                        except OSError as e:
                            if e.errno != 28:  # ENOSPC: it needs a block more
                                raise
                            want -= BLOCK
                    os.fsync(fd)
                finally:
                    os.close(fd)
                files.append(path)
            else:  # a filler took a metadata block too many: give some back
                last = files[-1]
                os.truncate(last, max(0, last.stat().st_size - (free - have)))
            have = self.free_bytes()
        raise AssertionError(f"could not leave exactly {free} bytes free on {self.mnt} "
                             f"(have {have})")

    def drop_filler(self):
        for p in self.mnt.glob("filler*.bin"):
            p.unlink()

    def close(self):
        """Unmounts, detaches and deletes the image; safe to call twice and
        after a failed create()."""
        errors = []
        if self.mounted and self.frozen:
            try:
                self.thaw()
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
        if self.mounted:
            try:
                self._umount()
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
                # Last resort: lazy unmount, so the loop device can still go.
                _run([_tool("umount"), "-l", self.mnt], check=False)
                self.mounted = False
        if self.dev:
            p = _run([_tool("losetup"), "-d", self.dev], check=False)
            if p.returncode != 0 and "No such device" not in p.stderr:
                errors.append(f"losetup -d {self.dev}: {p.stderr.strip()}")
            self.dev = None
        try:
            self.image.unlink()
        except FileNotFoundError:
            pass
        if errors:
            raise RuntimeError("; ".join(errors))


def _libc_syncfs(fd):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def blocks(nbytes):
    """4 KiB blocks that a file of nbytes occupies."""
    return (nbytes + BLOCK - 1) // BLOCK
