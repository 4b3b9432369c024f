"""What a model becomes and how it runs: the knobs (`knobs`), the backends that run it
(`backends`: PyTorch's, OpenVINO, ONNX Runtime), the conversions and their guard (`convert`,
`quantize`, `linear_int8`), the artifacts they save, the env file a user keeps (`envfile`), and
`apply` (`autotune.apply`), which a user's program and the measuring child (`autotune.child`) both
build their model through, so that what was measured is what runs.

The bottom floor: nothing here imports optuna, click, rich or any
other autotune package (tests/test_boundary.py, and the layers in pyproject.toml), and torch and
the runtimes are imported inside functions only.
"""
