"""autotune: find the fastest way to run a PyTorch model for inference on a CPU, and prove it.

In your own program, `autotune.apply(model, example_inputs)` runs the model as the exported
configuration says (see `autotune.child.deploy`); importing this package loads no torch.
"""

__version__ = "0.1.0"

from autotune.child.convert import ModelKnobs
from autotune.child.deploy import Applied, Deployment, apply, load_env_file
from autotune.child.errors import ApplyError, WrongAnswers

__all__ = ["Applied", "ApplyError", "Deployment", "ModelKnobs", "WrongAnswers", "apply", "load_env_file"]
