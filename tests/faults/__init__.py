"""Fault-injection suite (issue 14): planted files, hostile inputs, network exposure. Each test is
bounded in time and touches only loopback and its own temp directories."""
