"""Your implementations. Each module holds stubs that raise NotImplementedError; fill
them in and run the matching test, e.g. ``make test-ex EX=01`` (or
``.venv/bin/python -m pytest tests/exercises/test_ex01_naive_attention.py``)."""
