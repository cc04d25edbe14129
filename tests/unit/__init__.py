"""Unit tests of the pure cores and codecs."""
