"""Tests of autotune/study/."""
