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

    def named_files(self) -> list[str]:
        """Every file the manifest names: the program files, then the bundles."""
        bundles = [p["bundle"]["path"] for p in self.manifest["programs"] if "bundle" in p]
        return [*self.files(), *dict.fromkeys(bundles)]

    def entry(self, method: str) -> dict:
        """The manifest's program entry of `method`."""
        return next(p for p in self.manifest["programs"] if p["method"] == method)

    def file_of(self, method: str) -> str:
        """The program file holding `method`."""
        return self.entry(method)["path"]

    def file_problems(self, rel: str) -> list[str]:
        """File `rel` against the manifest: inside the directory (a symlink may not lead out of it:
        a planted file elsewhere), present, its size (program files) and sha256."""
        path, inside = self.root / rel, self.root.resolve()
        if path.exists() and inside not in path.resolve().parents:
            return [f"{rel} resolves to {path.resolve()}, outside the artifacts directory"]
        entry = self.files().get(rel)
        if not path.is_file():
            return [f"missing {'artifact' if entry else 'bundle'} file {rel} (named in {mf.MANIFEST})"]
        if entry and path.stat().st_size != entry["bytes"]:
            return [f"{rel}: {path.stat().st_size} bytes, manifest says {entry['bytes']} (truncated or replaced)"]
        want = entry["sha256"] if entry else next(p["bundle"]["sha256"] for p in self.manifest["programs"]
                                                  if p.get("bundle", {}).get("path") == rel)
        return [] if sha256_file(path) == want else [f"{rel}: sha256 mismatch (corrupted or modified)"]

    def check_files(self) -> list[str]:
        """Every named file's problems (empty when all match)."""
        return [problem for rel in self.named_files() for problem in self.file_problems(rel)]

    def require_files(self) -> None:
        """check_files, raising ArtifactError with every problem."""
        problems = self.check_files()
        if problems:
            raise ArtifactError("; ".join(problems))

    def open_file(self, rel: str) -> dict[str, Runner]:
        """{method: Runner} of program file `rel`, loaded in its runtime behind a checked runner
        (check its hash first). An ExecuTorch file is first loaded and run in a child process
        (ship/probe.py): one that kills or hangs its runtime is refused naming the file, and never
        runs here."""
        entries = [p for p in self.manifest["programs"] if p["path"] == rel]
        flow = get_flow(entries[0]["backend"])
        specs = {e["method"]: self.specs[e["method"]] for e in entries}
        if rel.endswith(".pte"):
            why = probe_program(self.root / rel, specs)
            if why:
                raise ArtifactError(f"{self.root / rel}: {why} when loaded and run once in a child process; "
                                    f"not run here (damaged behind a manifest that matches it?)")
        loaded = flow.open({m: self.root / rel for m in specs})
        runner = Runner(flow.name, loaded, specs, self.decode["codebook_size"])
        return {m: runner for m in specs}

    def programs(self) -> Dispatch:
        """Every program file opened (open_file), behind one checked Dispatch (dispatch)."""
        return self.dispatch({m: r for rel in self.files() for m, r in self.open_file(rel).items()})

    def dispatch(self, runners: dict[str, Runner]) -> Dispatch:
        """The opened `runners` {method: Runner} of every method behind one Dispatch, once each
        program's own metadata agrees with the manifest (ManifestError naming the first field)."""
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
