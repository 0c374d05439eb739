"""The conformance kit's state machine test: :mod:`statekeeper.testing.stateful`
run in lockstep with its reference model, sized by the kit's knobs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from ._base import KitBase, StoreFactory
from .stateful import build_state_machine

__all__ = ["StatefulTests"]


class StatefulTests(KitBase):
    def test_state_machine_matches_reference_model(
        self,
        kit_factory: StoreFactory,
        kit_options: dict[str, Any],
        request: pytest.FixtureRequest,
    ) -> None:
        """Random programs of saves, updates, deletes, prunes, listings with cursors and
        reopens leave the store and the reference model in agreement."""
        base = self.state_machine_settings(request.config)
        run_state_machine_as_test(
            build_state_machine(kit_factory),
            settings=self.option_set_settings(base, kit_options),
        )
