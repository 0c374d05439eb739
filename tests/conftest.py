"""Shared test configuration: real-service URLs and the 'skip is a failure in CI' rule."""

from __future__ import annotations
