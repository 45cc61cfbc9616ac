"""Test this plugin alone: another plugin installed in the same environment must not answer in its place."""

import pytest


@pytest.fixture(autouse=True)
def _only_this_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Select this package's entry point, whatever else is installed."""
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "shipping_forecast")
