"""Hook specs, the order in which implementations run, and plugin loading errors."""

from typing import Any

import pytest

from inference_server import _plugins, plugin_hook
from inference_server.errors import PluginError


class First:
    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return None if data == "pass" else "first"


class Second:
    @plugin_hook
    def predict_fn(self, data: Any, model: Any) -> Any:
        return "second"


def test_eight_hooks_with_the_seed_signatures() -> None:
    """The specs are the 1.x hooks, with 1.x argument names."""
    pm = _plugins.build_manager([])
    signatures = {name: getattr(pm.hook, name).spec.argnames for name in _plugins.HOOK_NAMES}
    assert signatures == {
        "model_fn": ("model_dir",),
        "input_fn": ("input_data", "content_type"),
        "predict_fn": ("data", "model"),
        "output_fn": ("prediction", "accept"),
        "ping_fn": ("model",),
        "batch_strategy": (),
        "max_concurrent_transforms": (),
        "max_payload_in_mb": (),
    }


def test_first_non_none_result_wins_and_defaults_run_last() -> None:
    """The last registered plugin runs first; ``None`` falls through; the default runs last."""
    pm = _plugins.build_manager([], [Second(), First()])
    assert pm.hook.predict_fn(data="x", model=None) == "first"
    assert pm.hook.predict_fn(data="pass", model=None) == "second"
    assert _plugins.build_manager([]).hook.predict_fn(data=2, model=lambda x: x * 3) == 6


def test_hook_implementations_may_take_fewer_arguments() -> None:
    """An implementation may omit arguments it does not use (pluggy's rule)."""

    class Lean:
        @plugin_hook
        def predict_fn(self, data: Any) -> Any:
            return data + 1

    assert _plugins.build_manager([], [Lean()]).hook.predict_fn(data=1, model=None) == 2


def test_unknown_hook_is_refused_with_the_list_of_hooks() -> None:
    """A misspelt hook is an error that names the plugin, the hook and the real hooks."""

    class Typo:
        @plugin_hook
        def ping(self, model: Any) -> bool:
            return True

    with pytest.raises(PluginError, match=r"hook 'ping' is not an inference-server hook \(the hooks are model_fn"):
        _plugins.build_manager([], [Typo()])


def test_selecting_a_plugin_that_is_not_installed() -> None:
    """INFERENCE_SERVER_PLUGINS naming a missing plugin lists what is installed."""
    with pytest.raises(PluginError, match=r"names nothing_here, .*installed plugins: .*shipping_forecast"):
        _plugins.build_manager(["nothing_here"])


def test_selecting_installed_plugins_by_name() -> None:
    """Only the named entry points load; ``None`` loads all."""
    import shipping_forecast

    assert not _plugins.build_manager([]).is_registered(shipping_forecast)
    assert _plugins.build_manager(["shipping_forecast"]).is_registered(shipping_forecast)
    assert _plugins.build_manager(None).is_registered(shipping_forecast)


def test_first_result_caller_matches_pluggy() -> None:
    """The request path's resolved caller gives pluggy's answers: order, None fall-through, fewer arguments."""

    class Lean:
        @plugin_hook
        def predict_fn(self, data: Any) -> Any:
            return None if data == "skip" else f"lean {data}"

    pm = _plugins.build_manager([], [Second(), First(), Lean()])
    fast = _plugins.first_result_caller(pm, "predict_fn")
    for data in ("x", "skip", "pass"):
        assert fast(data=data, model=None) == pm.hook.predict_fn(data=data, model=None)


def test_first_result_caller_leaves_wrappers_to_pluggy() -> None:
    """With a wrapper registered, the caller is pluggy's own, so the wrapper runs."""
    seen = []

    class Wrapper:
        @plugin_hook(wrapper=True)
        def predict_fn(self, data: Any, model: Any) -> Any:
            seen.append(data)
            return (yield).upper()

    pm = _plugins.build_manager([], [Second(), Wrapper()])
    assert _plugins.first_result_caller(pm, "predict_fn")(data="w", model=None) == "SECOND"
    assert seen == ["w"]
