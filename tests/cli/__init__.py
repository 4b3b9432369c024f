"""Tests of autotune/cli/."""
