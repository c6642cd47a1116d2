"""Code shared by the test files (fixtures are in tests/conftest.py)."""
