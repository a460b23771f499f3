"""The shipped programs on the phone's instruction set: ExecuTorch's aarch64 runtime under QEMU user mode.

runtime.py prepares it (once), guest.py runs inside it, qemu.py drives it from the host in batches
(tests/test_arm64.py) and session.py call by call (the conformance plugin's --c2w-arch aarch64)."""
