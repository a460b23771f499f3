"""Interrupted exports leave nothing (issue 32, ship/commit.py): `c2w-export export` killed with
SIGKILL at 20 seeded points over its run (lowering, serialization, the commit) never leaves a
partial artifacts directory, and the next export succeeds and clears what the killed ones left."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from c2w_export.ship import commit as cm
from c2w_export.ship.artifacts import open_artifacts

KILLS = 20


def _complete(root) -> bool:
    """`root` holds a manifest and exactly the files it names, each matching its recorded hash."""
    art = open_artifacts(root)
    named = {"manifest.json", *art.files(), *(p["bundle"]["path"] for p in art.manifest["programs"] if "bundle" in p)}
    return art.check_files() == [] and {p.name for p in root.iterdir()} == named


@pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL and /proc: Linux")
def test_sigkill_at_any_point_leaves_complete_artifacts(model_dir, tmp_path):
    out = tmp_path / "arts"
    args = [sys.executable, "-m", "c2w_export", "export", "--model", model_dir, "--out-dir", str(out), "--backend",
            "torch_export", "--variant", "both", "--ramp", "2", "--max-chunk", "4"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    t0 = time.monotonic()
    subprocess.run(args, check=True, capture_output=True, env=env)
    full = time.monotonic() - t0
    assert _complete(out)
    rng = random.Random(32)
    for delay in sorted(rng.uniform(0.1, 1.0) * full for _ in range(KILLS)):  # bounded: at most 20 runs' time
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            p.wait(timeout=delay)  # it finished first: a complete export, which must hold too
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            p.wait()
        assert _complete(out), f"killed after {delay:.1f} s of {full:.1f}: {sorted(x.name for x in out.iterdir())}"
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _complete(out)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["arts"], "a killed export's staging was left behind"


def test_a_kill_between_the_two_renames_is_repaired(tmp_path):
    """Where renameat2 cannot exchange, the commit moves the old directory aside and the new one in;
    killed between the two, the next export's recover() moves the old one back."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # a process that has exited: its staging directory is stale
    target, new = tmp_path / "arts", tmp_path / f".arts.staging-{gone.pid}-x"
    target.mkdir()
    (target / "manifest.json").write_text('{"programs": []}')
    new.mkdir()
    (new / "manifest.json").write_text('{"programs": [], "new": true}')
    target.rename(tmp_path / ".arts.old-1")  # the first rename, then the kill
    cm.recover(target)
    assert (target / "manifest.json").read_text() == '{"programs": []}'
    assert sorted(x.name for x in tmp_path.iterdir()) == ["arts"]  # the dead process's staging removed too


def test_commit_replaces_in_one_step_and_keeps_foreign_files_safe(tmp_path, monkeypatch):
    target = tmp_path / "arts"
    for exchange in (True, False):  # renameat2 where the filesystem has it; two renames where not
        if not exchange:
            monkeypatch.setattr(cm, "_exchange", lambda a, b: False)
        staging = cm.staging_for(target)
        (staging / "manifest.json").write_text(f'{{"programs": [], "exchange": {str(exchange).lower()}}}')
        cm.commit(staging, target)
        assert (target / "manifest.json").read_text() == f'{{"programs": [], "exchange": {str(exchange).lower()}}}'
        assert sorted(x.name for x in tmp_path.iterdir()) == ["arts"]
    (target / "notes.txt").write_text("mine")
    with pytest.raises(cm.CommitError, match=r"holds 1 file\(s\) that are not artifacts \(notes.txt\)"):
        cm.staging_for(target)
    assert (target / "notes.txt").read_text() == "mine"
