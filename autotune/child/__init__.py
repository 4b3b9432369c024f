"""The benchmark child: what runs inside each measured process.

A boundary, checked by tests/test_boundary.py: nothing in this package imports optuna, click,
rich or any autotune module outside `autotune.child`, and torch is imported inside functions only.
The parent side may import from here (it is the bottom floor); never the other way round.
"""
