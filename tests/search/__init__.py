"""Tests of autotune/search/."""
