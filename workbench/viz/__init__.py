"""Altair charts (charts.py) and the offline renderer / export helpers (render.py)."""
