"""autotune: find the fastest way to run a PyTorch model for inference on a CPU, and prove it."""

__version__ = "0.1.0"
