"""The decoder: config -> layers -> Code2Wav, strict checkpoint loading and synthetic checkpoints.
Pure PyTorch; nothing here imports ExecuTorch or any other layer of c2w_export."""
