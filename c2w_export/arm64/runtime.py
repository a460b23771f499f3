"""The aarch64 ExecuTorch runtime under QEMU user mode: prepared once into a directory, reused after.

A phone runs ExecuTorch's aarch64 XNNPACK kernels (NEON, and FP16 arithmetic where the core has
FEAT_FP16). This directory lets an x86 Debian host run them:

    qemu-aarch64-static      QEMU user mode (apt: qemu-user-static), called explicitly (no binfmt)
    sysroot/                 arm64 Python 3.11 and its libraries, unpacked from Debian's arm64 .debs
                             (an arm64 python3.11 cannot be installed beside the amd64 one)
    cpu/<model>/             one QEMU_LD_PREFIX per CPU model: links into sysroot/, plus the
                             /proc/cpuinfo and MIDR that model has (QEMU 7.2 shows the guest the
                             host's x86 cpuinfo, which crashes torch's CPU probe; XNNPACK trusts MIDR)
    site/                    the aarch64 wheels at this package's pins (pip --platform, no emulation)
    site_cuda/               the CUDA runtime libraries PyPI's aarch64 torch links (it is the CUDA
                             build; no GPU code runs); the large ones it never loads are pruned
    ready.json               what was prepared, its size and its time: written last

Each step leaves a stamp, so an interrupted preparation resumes and a prepared one does nothing.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..env import fp16_arithmetic
from ..fileio import atomic_write_bytes

TORCH, EXECUTORCH, TORCHAO = "2.13.0", "1.5.1", "0.18.0"  # the pins of pyproject.toml


@dataclass(frozen=True)
class CpuModel:
    """A QEMU `-cpu` model as a phone core: what /proc/cpuinfo and MIDR_EL1 say (they must match what
    QEMU emulates: XNNPACK picks kernels from MIDR, torch probes cpuinfo) and its fp16 arithmetic."""

    name: str
    features: str
    midr: int

    @property
    def arithmetic(self) -> str:
        """The env.FP16_ARITHMETICS name of this model's fp16 kernels (the key of its fp16 tolerances),
        from its cpuinfo features as on a real aarch64 Linux machine."""
        return fp16_arithmetic(set(self.features.split()), "Linux", "aarch64")

    @property
    def fp16(self) -> bool:
        """FEAT_FP16: XNNPACK's fp16 kernels compute in fp16."""
        return self.arithmetic == "native-fp16"

    def cpuinfo(self, cores: int = 2) -> str:
        variant, part, rev = (self.midr >> 20) & 0xF, (self.midr >> 4) & 0xFFF, self.midr & 0xF
        block = (f"BogoMIPS\t: 52.00\nFeatures\t: {self.features}\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
                 f"CPU variant\t: {variant:#x}\nCPU part\t: {part:#05x}\nCPU revision\t: {rev}\n\n")
        return "".join(f"processor\t: {i}\n{block}" for i in range(cores))


# cortex-a76: a current phone's big core (FEAT_FP16, dot product); cortex-a72: an older one, no FP16, so
# XNNPACK's fp16 programs compute in float32 there. `-cpu max` is not phone-like (SVE2, SME): not offered.
CPUS: dict[str, CpuModel] = {c.name: c for c in (
    CpuModel("cortex-a76", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
             "dcpop asimddp", 0x414FD0B1),
    CpuModel("cortex-a72", "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid", 0x410FD083),
)}

# Debian arm64 packages of python3.11 and what it and torch link
DEBS = ("python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11 libc6 libgcc-s1 libstdc++6 zlib1g "
        "libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libcrypt1 libsqlite3-0 libuuid1 libncursesw6 libtinfo6 "
        "libreadline8 libnsl2 libtirpc3 libdb5.3 libgomp1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 "
        "libcom-err2 libkeyutils1").split()
PURE = ("filelock flatbuffers jinja2 markupsafe mpmath==1.3.0 networkx ruamel.yaml sympy tabulate tqdm "
        "typing_extensions fsspec packaging pyyaml setuptools").split()
# torch 2.13.0 aarch64 (cu130) links these; NCCL unpinned: the version torch pins is not served on PyPI
CUDA = ("cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3",
        "nvidia-cudnn-cu13==9.20.0.48", "nvidia-cusparselt-cu13==0.8.1", "nvidia-nccl-cu13",
        "nvidia-nvshmem-cu13==3.4.5")
QEMU = "/usr/bin/qemu-aarch64-static"


class Unavailable(Exception):
    """The runtime cannot be prepared or used here; the message says why in one line."""


def _platform_args() -> list[str]:
    tags = [f"manylinux_2_{v}_aarch64" for v in (17, 24, 25, 26, 27, 28)] + ["manylinux2014_aarch64", "linux_aarch64"]
    return [a for t in tags for a in ("--platform", t)] + [
        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        "--only-binary=:all:"]


def unavailable_reason() -> str | None:
    """Why this host cannot prepare the runtime (None: it can)."""
    if platform.machine() != "x86_64":
        return f"the aarch64 runtime is prepared on an x86_64 host; this one is {platform.machine()}"
    if not Path("/etc/debian_version").exists() or not shutil.which("apt-get"):
        return "not a Debian host with apt-get: QEMU user mode and the arm64 Python come from Debian's packages"
    if os.geteuid() != 0 and not Path(QEMU).exists():
        return f"{QEMU} is missing and installing it (apt-get install qemu-user-static) needs root"
    return None


def _run(cmd: list[str], what: str, progress: Callable[[str], None], cwd: Path | None = None) -> None:
    progress(what)
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        tail = " | ".join(r.stdout.strip().splitlines()[-3:])
        raise Unavailable(f"{what} failed (exit {r.returncode}): {tail[:400]}")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _prune(site: Path) -> int:
    """Remove what is never loaded from installed wheels: headers, static archives and cuDNN's engine
    libraries (dlopened only when a cuDNN op runs). -> bytes freed."""
    freed = 0
    for f in list(site.rglob("*")):
        drop = f.is_file() and (f.suffix in (".a", ".h", ".hpp", ".cuh", ".inl")
                                or (f.name.startswith("libcudnn_") and ".so" in f.name))
        if drop:
            freed += f.stat().st_size
            f.unlink()
    return freed


def prepare(root: Path, progress: Callable[[str], None] = print) -> dict:
    """Prepare the runtime in `root` (idempotent: a step with a stamp is not run again) -> ready.json's
    record. Unavailable names what is missing or what failed."""
    root = Path(root).resolve()
    ready = root / "ready.json"
    if ready.exists():
        return json.loads(ready.read_text())
    why = unavailable_reason()
    if why:
        raise Unavailable(why)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]

    def step(name: str, fn: Callable[[], None]) -> None:
        stamp = root / f".{name}.done"
        if not stamp.exists():
            fn()
            stamp.write_text("")

    def qemu():
        if not Path(QEMU).exists():
            _run(["apt-get", "update", "-q"], "apt-get update", progress)
            _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "qemu-user-static"],
                 "installing qemu-user-static", progress)

    def sysroot():
        debs, sr = root / "debs", root / "sysroot"
        debs.mkdir(exist_ok=True)
        arches = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout.split()
        if "arm64" not in arches:  # only so that apt-get download may fetch arm64 .debs; nothing arm64 is installed
            _run(["dpkg", "--add-architecture", "arm64"], "dpkg --add-architecture arm64", progress)
            _run(["apt-get", "update", "-q"], "apt-get update (arm64 lists)", progress)
        _run(["apt-get", "download", "-q", *[f"{d}:arm64" for d in DEBS]], f"downloading {len(DEBS)} arm64 .debs",
             progress, cwd=debs)
        shutil.rmtree(sr, ignore_errors=True)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(sr)], f"unpacking {deb.name}", lambda s: None)
        shutil.rmtree(debs)

    def site():
        whl = root / "whl"
        _run([*pip, "download", "--no-deps", *_platform_args(), "-d", str(whl), f"torch=={TORCH}", "numpy",
              f"executorch=={EXECUTORCH}", f"torchao=={TORCHAO}"], "downloading the aarch64 torch, executorch, numpy wheels",
             progress)
        shutil.rmtree(root / "site", ignore_errors=True)
        _run([*pip, "install", "--no-deps", "--target", str(root / "site"), *_platform_args(),
              *sorted(str(p) for p in whl.glob("*.whl")), *PURE], "installing them for aarch64", progress)
        shutil.rmtree(whl)
        progress(f"pruned {_prune(root / 'site') / 2**20:.0f} MiB of headers and archives nothing loads")

    def cuda():
        shutil.rmtree(root / "site_cuda", ignore_errors=True)
        # with their dependencies: cuda-toolkit's extras are what name the libraries
        _run([*pip, "install", "--target", str(root / "site_cuda"), *_platform_args(), *CUDA],
             "installing the CUDA runtime libraries aarch64 torch links (never run)", progress)
        progress(f"pruned {_prune(root / 'site_cuda') / 2**20:.0f} MiB of CUDA files torch never loads")

    def cpus():
        sr = root / "sysroot"
        for cpu in CPUS.values():
            d = root / "cpu" / cpu.name
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            for entry in sr.iterdir():  # everything but /proc and /sys from the shared sysroot
                (d / entry.name).symlink_to(entry)
            (d / "proc").mkdir()
            (d / "proc" / "cpuinfo").write_text(cpu.cpuinfo())
            for i in range(2):
                ident = d / "sys" / "devices" / "system" / "cpu" / f"cpu{i}" / "regs" / "identification"
                ident.mkdir(parents=True)
                (ident / "midr_el1").write_text(f"{cpu.midr:#018x}\n")

    for name, fn in (("qemu", qemu), ("sysroot", sysroot), ("site", site), ("cuda", cuda), ("cpus", cpus)):
        step(name, fn)
    record = {"root": str(root), "qemu": subprocess.run([QEMU, "--version"], capture_output=True, text=True)
              .stdout.splitlines()[0], "cpus": sorted(CPUS), "torch": TORCH, "executorch": EXECUTORCH,
              "bytes": _du(root), "seconds": round(time.perf_counter() - t0, 1)}
    atomic_write_bytes(ready, json.dumps(record, indent=1).encode())
    return record


def ready(root: Path) -> dict:
    """ready.json of a prepared runtime; Unavailable naming what to run when it is not prepared."""
    f = Path(root) / "ready.json"
    if not f.exists():
        raise Unavailable(f"no aarch64 runtime in {root}: prepare it with `python -m c2w_export.arm64 prepare "
                            f"--root {root}` (tox -e arm64 does)")
    return json.loads(f.read_text())
