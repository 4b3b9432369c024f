"""Tests of autotune/child/: the measuring child."""
