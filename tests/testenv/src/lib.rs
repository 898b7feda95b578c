//! Test environment (see tests/testenv/README.md).
