"""Runnable examples; each directory has a README, the code, and a smoke test (``pytest examples``).

The ``__init__.py`` files only let pytest tell the examples' ``test_smoke.py`` modules apart.
"""
