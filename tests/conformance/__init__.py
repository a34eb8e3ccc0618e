"""The producer conformance kit: one suite every shared-stream producer passes against its
real broker (docs/conformance.md). ``broker.py`` is what a broker gives the kit; each
broker's adapter is ``broker_<kind>.py``; the cases are ``test_*.py``."""
