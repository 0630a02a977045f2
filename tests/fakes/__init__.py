"""Fake upstream servers for tests (real sockets on 127.0.0.1)."""
