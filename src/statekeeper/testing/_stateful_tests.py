"""The conformance kit's state machine test: :mod:`statekeeper.testing.stateful`
run in lockstep with its reference model, sized by the kit's knobs."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from ._base import KitBase, StoreFactory
from .stateful import build_state_machine

__all__ = ["StatefulTests"]


class StatefulTests(KitBase):
    def test_state_machine_matches_reference_model(
        self, kit_factory: StoreFactory, request: pytest.FixtureRequest
    ) -> None:
        """Random programs of saves, updates, deletes, prunes, listings with cursors and
        reopens leave the store and the reference model in agreement."""
        run_state_machine_as_test(
            build_state_machine(kit_factory),
            settings=self.state_machine_settings(request.config),
        )
