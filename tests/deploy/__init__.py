"""Tests of autotune/deploy/."""
