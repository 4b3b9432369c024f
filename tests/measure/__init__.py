"""Tests of autotune/measure/."""
