"""autotune's public API: what a user's program imports to run a model the way a search chose.

    import autotune
    model = autotune.apply(model, example_inputs)   # the knobs of `autotune run` / `source best.env`

`apply` is the very function the measuring child builds its model through, so what was measured
is what runs. It lives in the model layer (`autotune.model.apply`) because the child imports
nothing of the harness; this module is its public face. Importing it loads no torch.
"""

from __future__ import annotations

from autotune.model.apply import Applied, Deployment, apply, load_env_file
from autotune.model.errors import ApplyError, WrongAnswers
from autotune.model.knobs import ModelKnobs

__all__ = ["Applied", "ApplyError", "Deployment", "ModelKnobs", "WrongAnswers", "apply", "load_env_file"]
