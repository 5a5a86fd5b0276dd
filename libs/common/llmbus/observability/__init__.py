"""Logs, traces, metrics and profiles of a service process."""
