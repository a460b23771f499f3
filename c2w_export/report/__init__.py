"""What the runs measured: parity and numerics reports, benchmark reports, the golden set, FLOPs."""
