"""Eviction policies: one small class per file, all behind ``base.Policy``."""

from .base import POLICIES, Policy, make_policy, register  # noqa: F401

POLICY_MODULES = ("lru", "slru", "twohit", "ds4", "static", "s3fifo", "lfu", "fifo")


def load_all():
    """Import every policy module so each registers itself in ``POLICIES``."""
    import importlib

    for mod in POLICY_MODULES:
        importlib.import_module(f"{__name__}.{mod}")
