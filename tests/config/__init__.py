"""Tests of autotune/config/."""
