"""Eviction policies: one small class per file, all behind ``base.Policy``."""

from .base import POLICIES, POLICY_MODULES, Policy, load_all, make_policy, register  # noqa: F401
