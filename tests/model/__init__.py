"""Tests of autotune/model/: what a model becomes and how it runs."""
