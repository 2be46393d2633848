"""A self-contained PEP 517 / PEP 660 build backend for the ckptd package.

It needs nothing but the standard library, so `pip install ./client/python`
works offline (pip's isolated build environment has nothing to download).
The wheel holds the `ckptd` package and, if found, the native client library
as ckptd/libckptd_client.so:

  1. $CKPTD_CLIENT_LIB (a path to libckptd_client.so), else
  2. <repo>/build/client/libckptd_client.so (a source checkout built with
     scripts/build.sh).

A wheel with the library is tagged for this platform; one without is pure
Python and finds the library at run time (see ckptd/_native.py).
"""
import base64
import hashlib
import io
import os
import pathlib
import re
import sysconfig
import zipfile

HERE = pathlib.Path(__file__).resolve().parent.parent  # client/python
PACKAGE = "ckptd"
LIBNAME = "libckptd_client.so"


def _project():
    text = (HERE / "pyproject.toml").read_text()
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    summary = re.search(r'^description\s*=\s*"([^"]+)"', text, re.M).group(1)
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M).group(1)
    return name, version, summary, requires


def _native_library():
    env = os.environ.get("CKPTD_CLIENT_LIB")
    if env:
        p = pathlib.Path(env)
        if not p.is_file():
            raise RuntimeError(f"CKPTD_CLIENT_LIB={env} is not a file")
        return p
    p = HERE.parent.parent / "build" / "client" / LIBNAME
    return p if p.is_file() else None


def _platform_tag():
    return re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def _tag(lib):
    return f"py3-none-{_platform_tag()}" if lib else "py3-none-any"


def _metadata(name, version, summary, requires):
    return (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: {summary}\nRequires-Python: {requires}\n")


def _wheel_file(tag, pure):
    return (f"Wheel-Version: 1.0\nGenerator: ckptd-backend\n"
            f"Root-Is-Purelib: {'true' if pure else 'false'}\nTag: {tag}\n")


class _Wheel:
    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data, mode=0o644):
        info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        self.records.append(f"{arcname},sha256={digest.decode()},{len(data)}")

    def close(self, record_name):
        self.records.append(f"{record_name},,")
        self.zip.writestr(zipfile.ZipInfo(record_name, date_time=(2026, 1, 1, 0, 0, 0)),
                          "\n".join(self.records) + "\n")
        self.zip.close()


def _dist_info(wheel, name, version, tag, pure):
    di = f"{name}-{version}.dist-info"
    wheel.add(f"{di}/METADATA", _metadata(*_project()).encode())
    wheel.add(f"{di}/WHEEL", _wheel_file(tag, pure).encode())
    wheel.add(f"{di}/top_level.txt", f"{PACKAGE}\n".encode())
    return f"{di}/RECORD"


def _build(wheel_directory, editable):
    name, version, _, _ = _project()
    lib = None if editable else _native_library()
    tag = "py3-none-any" if editable else _tag(lib)
    filename = f"{name}-{version}-{tag}.whl"
    wheel = _Wheel(os.path.join(wheel_directory, filename))
    if editable:
        wheel.add(f"__editable__.{name}.pth", (str(HERE) + "\n").encode())
    else:
        for path in sorted((HERE / PACKAGE).rglob("*.py")):
            wheel.add(path.relative_to(HERE).as_posix(), path.read_bytes())
        if lib is not None:
            wheel.add(f"{PACKAGE}/{LIBNAME}", lib.read_bytes(), mode=0o755)
    record = _dist_info(wheel, name, version, tag, pure=lib is None)
    wheel.close(record)
    return filename


# -- PEP 517 hooks ----------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    name, version, _, _ = _project()
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as tar:
        for rel in ["pyproject.toml", "_build/backend.py"] + [
                p.relative_to(HERE).as_posix() for p in sorted((HERE / PACKAGE).rglob("*.py"))]:
            tar.add(HERE / rel, arcname=f"{base}/{rel}")
        pkg_info = _metadata(*_project()).encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return filename
