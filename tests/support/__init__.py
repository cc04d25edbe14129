"""Test helpers shared by the integration tests."""
