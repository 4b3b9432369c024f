"""autotune: find the fastest way to run a PyTorch model for inference on a CPU, and prove it.

In your own program, `autotune.apply(model, example_inputs)` runs the model as the exported
configuration says (`autotune.api`); importing this package loads no torch.
"""

__version__ = "0.1.0"  # the wheel's version too (pyproject.toml reads it); recorded on every study

from autotune.api import Applied, ApplyError, Deployment, ModelKnobs, WrongAnswers, apply, load_env_file

__all__ = ["Applied", "ApplyError", "Deployment", "ModelKnobs", "WrongAnswers", "apply", "load_env_file"]
