"""Tests of autotune/report/."""
