"""Open a shipped artifacts directory: manifest, file hashes, programs in their runtimes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..fileio import sha256_file
from ..program.flows import get_flow
from ..program.runner import Dispatch, Runner
from ..program.variants import MethodSpec
from . import manifest as mf
from .contract import manifest_problems, program_problems
from .probe import probe_program


class ArtifactError(RuntimeError):
    """A file named by the manifest is missing or does not match its recorded sha256."""


@dataclass
class Artifacts:
    root: Path
    manifest: dict
    specs: dict[str, MethodSpec]  # method -> its I/O contract, from the manifest

    @property
    def decode(self) -> dict:
        return self.manifest["decode"]

    def files(self) -> dict[str, dict]:
        """{relative path: program entry} (one entry per file)."""
        return {p["path"]: p for p in self.manifest["programs"]}

    def check_files(self) -> list[str]:
        """Re-hash every file -> list of problems (empty when all match)."""
        problems = []
        inside = self.root.resolve()
        named = [*self.files(), *(p["bundle"]["path"] for p in self.manifest["programs"] if "bundle" in p)]
        for rel in named:  # a symlink may not lead out of the directory (a planted file elsewhere)
            if (self.root / rel).exists() and inside not in (self.root / rel).resolve().parents:
                problems.append(f"{rel} resolves to {(self.root / rel).resolve()}, outside the artifacts directory")
        if problems:
            return problems
        for rel, entry in self.files().items():
            path = self.root / rel
            if not path.is_file():
                problems.append(f"missing artifact file {rel} (named in {mf.MANIFEST})")
                continue
            size = path.stat().st_size
            if size != entry["bytes"]:
                problems.append(f"{rel}: {size} bytes, manifest says {entry['bytes']} (truncated or replaced)")
            elif sha256_file(path) != entry["sha256"]:
                problems.append(f"{rel}: sha256 mismatch (corrupted or modified)")
        for p in self.manifest["programs"]:
            if "bundle" in p:
                b = self.root / p["bundle"]["path"]
                if not b.is_file():
                    problems.append(f"missing bundle file {p['bundle']['path']} (named in {mf.MANIFEST})")
                elif sha256_file(b) != p["bundle"]["sha256"]:
                    problems.append(f"{p['bundle']['path']}: sha256 mismatch (corrupted or modified)")
        return problems

    def require_files(self) -> None:
        """check_files, raising ArtifactError with every problem."""
        problems = self.check_files()
        if problems:
            raise ArtifactError("; ".join(problems))

    def programs(self, probe: bool = True) -> Dispatch:
        """Load every program file in its own runtime, behind checked runners (call check_files first).
        With `probe`, each ExecuTorch file is first loaded and run in a child process (ship/probe.py):
        one that kills or hangs its runtime is refused naming the file, and never runs here."""
        by_file: dict[str, list[dict]] = {}
        for p in self.manifest["programs"]:
            by_file.setdefault(p["path"], []).append(p)
        runners = {}
        for rel, entries in by_file.items():
            flow = get_flow(entries[0]["backend"])
            methods = [e["method"] for e in entries]
            if probe and rel.endswith(".pte"):
                why = probe_program(self.root / rel, {m: self.specs[m] for m in methods})
                if why:
                    raise ArtifactError(f"{self.root / rel}: {why} when loaded and run once in a child process; "
                                        f"not run here (damaged behind a manifest that matches it?)")
            loaded = flow.open({m: self.root / rel for m in methods})
            r = Runner(flow.name, loaded, {m: self.specs[m] for m in methods}, self.decode["codebook_size"])
            runners.update({m: r for m in methods})
        refuse(self.root, program_problems(self.manifest, self.specs, {m: r.loaded for m, r in runners.items()}))
        return Dispatch(runners)

    def initial_state(self) -> tuple[torch.Tensor, ...]:
        """The stateful methods' start state, from the manifest's state spec (zeros)."""
        return tuple(torch.zeros(s["shape"], dtype=getattr(torch, s["dtype"])) for s in self.manifest["state"])


def open_artifacts(root: str | Path) -> Artifacts:
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"artifacts directory not found: {root}")
    m = mf.load(root)
    refuse(root, manifest_problems(m))
    specs = {p["method"]: MethodSpec.from_json(p) for p in m["programs"]}
    return Artifacts(root, m, specs)


def refuse(root: Path, problems: list[str]) -> None:
    """ManifestError with the first contract problem (and how many more), when there is any."""
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise mf.ManifestError(f"{Path(root) / mf.MANIFEST}: {problems[0]}{more}")
