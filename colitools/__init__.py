"""colitools: convert huge MoE checkpoints into byte-addressable quantized containers."""

__version__ = "0.1.0"
