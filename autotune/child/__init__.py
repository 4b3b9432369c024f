"""The benchmark child: what runs inside each measured process (`python -m autotune.child.worker`),
built on `autotune.model` (the model it measures is built by `autotune.model.apply`, as a user's
program builds it).

A boundary, checked by tests/test_boundary.py: nothing in this package imports optuna, click,
rich or any autotune module outside `autotune.child` and `autotune.model`, and torch is imported
inside functions only. The parent side may import from here; never the other way round.
"""
