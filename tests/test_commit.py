"""Interrupted exports leave nothing (issue 32, ship/commit.py): `c2w-export export` killed with
SIGKILL at each named point of its run (ship/commit.KILL_POINTS: staging made, programs built,
manifest written, and every step of both commit paths) leaves the previous complete artifacts or the
new complete ones, never a mix, and the next export succeeds and clears what the killed ones left.
The same kills on the move-one-by-one commit that came before ship/commit.py leave a mix: the test
fails on it. Each export runs in a fork of one clean process (helpers.CleanRunner): the kill ends the
fork, and the test reads the directory it left."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from c2w_export.ship import commit as cm
from c2w_export.ship.artifacts import open_artifacts
from helpers import CleanRunner, cases


def _complete(root) -> bool:
    """`root` holds a manifest and exactly the files it names, each matching its recorded hash."""
    art = open_artifacts(root)
    named = {"manifest.json", *art.files(), *(p["bundle"]["path"] for p in art.manifest["programs"] if "bundle" in p)}
    return art.check_files() == [] and {p.name for p in root.iterdir()} == named


def _ramp(root) -> list[int]:
    return json.loads((root / "manifest.json").read_text())["decode"]["ramp"]


def _no_exchange():
    """In the fork: the commit as on a filesystem without renameat2 (two renames)."""
    cm._exchange = lambda a, b: False


def _one_by_one():
    """In the fork: the commit before ship/commit.py, each file moved over the old ones in turn (a
    deliberate bug: killed between two files, the directory holds a new manifest beside old programs)."""
    def commit(staging, target):
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted(staging.iterdir(), key=lambda p: p.name != cm.MANIFEST):  # the manifest first
            os.replace(f, target / f.name)
            cm.kill_point("moved")
        shutil.rmtree(staging, ignore_errors=True)
    from c2w_export.ship import export
    export.commit = commit


KILLS = [  # (id, kill point, set-up in the fork, which artifacts the directory then holds)
    ("staging-made", "staged", None, "old"),
    ("programs-built", "built", None, "old"),
    ("manifest-written", "manifest", None, "old"),
    ("after-the-exchange", "exchanged", None, "new"),
    ("between-the-two-renames", "aside", _no_exchange, "old"),  # repaired by the next export's recover()
    ("after-the-two-renames", "replaced", _no_exchange, "new"),
]


@pytest.fixture(scope="module")
def exporter(model_dir, tmp_path_factory):
    """(run, out): run(ramp, kill point, set-up) exports torch_export artifacts over `out` in a fork of
    one clean process -> rc (-9: killed at the point). Ramp 2 holds chunks 1..3 and ramp 1 chunks 1..4
    (1..2 would specialize the chunk dim, issue 43), so the two exports differ in their program bytes and
    each kill starts from the complete artifacts the case before it left, either of them."""
    runner = CleanRunner()
    out = tmp_path_factory.mktemp("commit") / "arts"

    def run(ramp, point=None, before=None):
        argv = ["export", "--model", model_dir, "--out-dir", out, "--backend", "torch_export", "--variant", "stateful",
                "--ramp", ramp, "--max-chunk", 5 - ramp]
        rc, _, err = runner(argv, {cm.KILL_ENV: point} if point else {}, before)
        assert rc in (0, -9), err[-2000:]
        return rc
    assert run(2) == 0 and _complete(out)
    yield run, out
    runner.close()


@pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL, fork and renameat2: Linux")
@pytest.mark.parametrize("point,before,holds", cases(KILLS))
def test_sigkill_at_each_point_leaves_complete_artifacts(exporter, point, before, holds):
    run, out = exporter
    old = _ramp(out)
    new = [3 - old[0]]
    assert run(new[0], point, before) == -9, f"the export never reached kill point {point!r}"
    cm.recover(out)  # what the next export does first: the old directory moved back, dead stagings removed
    assert sorted(x.name for x in out.parent.iterdir()) == ["arts"], "a killed export left something behind"
    assert _complete(out) and _ramp(out) == (old if holds == "old" else new)


def test_the_kills_catch_a_commit_that_moves_files_one_by_one(exporter):
    """The deliberate bug: killed after its first move, the commit before ship/commit.py leaves the
    new manifest over the old program, whose hash it does not record. Then a whole export repairs it."""
    run, out = exporter
    assert run(3 - _ramp(out)[0], "moved", _one_by_one) == -9
    assert not _complete(out)
    assert run(2) == 0 and _complete(out) and _ramp(out) == [2]


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
