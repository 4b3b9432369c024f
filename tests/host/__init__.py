"""Tests of autotune/host/."""
