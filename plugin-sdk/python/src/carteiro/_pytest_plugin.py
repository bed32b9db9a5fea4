"""pytest plugin (registered through the ``pytest11`` entry point): the ``mock_host`` fixture."""

from __future__ import annotations

import pytest

from carteiro.testing import MockHost


@pytest.fixture
def mock_host() -> MockHost:
    """A freshly reset :class:`~carteiro.testing.MockHost` for this test."""
    return MockHost()
