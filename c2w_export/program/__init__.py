"""From the decoder to checked programs: the variants' I/O contracts, flows (backends as stages),
the build pipeline, loaded-program runners, stream drivers, and the one compare helper and
tolerance table every check uses."""
