"""Tests of autotune/child/."""
