"""Tests for tff_hetero.data."""
