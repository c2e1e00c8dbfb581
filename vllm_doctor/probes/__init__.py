"""Probes collect facts and return doctor-owned snapshots (plain data)."""
