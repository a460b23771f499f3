"""python -m c2w_export.arm64 prepare --root DIR: prepare the aarch64 runtime (runtime.py) in DIR, once.
Exit 0 when it is ready, 3 when this host cannot have it (the reason in one line; with --or-record, exit 0
and the reason in DIR/unavailable.txt, which tests/test_arm64.py skips with), 1 when a step failed."""

import argparse
import sys
from pathlib import Path

from .runtime import Unavailable, prepare, unavailable_reason


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m c2w_export.arm64")
    p.add_argument("command", choices=["prepare"])
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--or-record", action="store_true", help="a host that cannot have it: record why in DIR, exit 0")
    a = p.parse_args(argv)
    why = None if (a.root / "ready.json").exists() else unavailable_reason()
    record = a.root / "unavailable.txt"
    record.unlink(missing_ok=True)
    if why:
        print(f"arm64: not prepared: {why}", file=sys.stderr)
        if a.or_record:
            a.root.mkdir(parents=True, exist_ok=True)
            record.write_text(why + "\n")
            return 0
        return 3
    try:
        r = prepare(a.root, lambda s: print(f"arm64: {s}", flush=True))
    except Unavailable as e:
        print(f"arm64: {e}", file=sys.stderr)
        return 1
    print(f"arm64: ready in {r['root']}: {r['qemu']}, CPU models {', '.join(r['cpus'])}, "
          f"{r['bytes'] / 2**30:.2f} GiB, prepared in {r['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
