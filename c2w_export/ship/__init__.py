"""What ships and how it is checked: manifest v1, the artifacts directory, export, bundled test
vectors, verify, decode, and the codes/WAV files at the boundary."""
