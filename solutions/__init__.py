"""Reference answers: the same modules and signatures as exercises/.
Run the tests against them with ``pytest --impl=solutions``."""
