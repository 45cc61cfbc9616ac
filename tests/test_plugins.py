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


def test_the_seed_hooks_keep_their_signatures_and_four_are_new() -> None:
    """The specs are the 1.x hooks, with 1.x argument names, the micro-batching hooks of 2.0, model_unload_fn for
    multi-model endpoints and model_metadata for the Open Inference Protocol."""
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
        "batching": (),
        "predict_batch_fn": ("data", "model"),
        "model_unload_fn": ("model",),
        "model_metadata": ("model",),
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
    """The request path's resolved caller, given the spec's arguments by position, gives pluggy's answers: order,
    None fall-through, fewer arguments."""

    class Lean:
        @plugin_hook
        def predict_fn(self, data: Any) -> Any:
            return None if data == "skip" else f"lean {data}"

    pm = _plugins.build_manager([], [Second(), First(), Lean()])
    fast = _plugins.first_result_caller(pm, "predict_fn")
    for data in ("x", "skip", "pass"):
        assert fast(data, None) == pm.hook.predict_fn(data=data, model=None)


def test_first_result_caller_of_one_plugin_falls_through_to_the_defaults() -> None:
    """With one plugin beside the built-in hooks (the usual case), its None falls through to the defaults' answer, as
    pluggy's would."""

    class Picky:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            return None if data == "skip" else f"picky {data}"

    pm = _plugins.build_manager([], [Picky()])
    assert len(pm.hook.predict_fn.get_hookimpls()) == 2
    fast = _plugins.first_result_caller(pm, "predict_fn")
    for data in ("x", "skip"):
        assert fast(data, str.upper) == pm.hook.predict_fn(data=data, model=str.upper)
    assert fast("skip", str.upper) == "SKIP"


def test_first_result_caller_leaves_wrappers_to_pluggy() -> None:
    """With a wrapper registered, the caller is pluggy's own, so the wrapper runs."""
    seen = []

    class Wrapper:
        @plugin_hook(wrapper=True)
        def predict_fn(self, data: Any, model: Any) -> Any:
            seen.append(data)
            return (yield).upper()

    pm = _plugins.build_manager([], [Second(), Wrapper()])
    assert _plugins.first_result_caller(pm, "predict_fn")("w", None) == "SECOND"
    assert seen == ["w"]


def test_describe_names_each_plugin_and_who_provides_each_hook() -> None:
    """The summary lists the plugins and, for each hook, its providers in the order they run."""
    pm = _plugins.build_manager(["shipping_forecast"])
    lines = _plugins.describe(pm)
    assert lines[0] == "plugin shipping_forecast (shipping-forecast 1.0.0, module shipping_forecast)"
    assert "hook predict_fn: shipping_forecast, then built-in" in lines
    assert "hook ping_fn: built-in" in lines
    assert _plugins.describe(_plugins.build_manager([]))[0] == "plugins: none (the built-in hooks only)"


def test_no_model_fn_is_a_warning_about_the_echo_model() -> None:
    """Without a plugin implementing model_fn, the warning says the echo model is served."""
    assert _plugins.problems(_plugins.build_manager([])) == [
        "serving the built-in echo model: no installed plugin implements model_fn"
    ]
    assert _plugins.problems(_plugins.build_manager(["shipping_forecast"])) == []


def test_a_plugin_without_hooks_names_its_unmarked_functions() -> None:
    """A plugin whose hooks lack the decorator implements nothing; the warning names the look-alikes."""

    class Forgetful:
        def model_fn(self, model_dir: str) -> Any:
            return len

        def predict_fn(self, data: Any, model: Any) -> Any:
            return model(data)

    pm = _plugins.build_manager([], [Forgetful()])
    [name] = [name for name, plugin in pm.list_name_plugin() if isinstance(plugin, Forgetful)]
    assert f"plugin {name!r} implements no hook; model_fn, predict_fn look like hooks but lack the " in "\n".join(
        _plugins.problems(pm)
    )


def test_two_plugins_with_one_request_hook_name_winner_and_loser() -> None:
    """Two plugins implementing predict_fn: the warning says which runs first and which after."""
    pm = _plugins.build_manager([], [First(), Second()])
    names = {type(plugin).__name__: name for name, plugin in pm.list_name_plugin()}
    [warning] = [problem for problem in _plugins.problems(pm) if problem.startswith("predict_fn")]
    assert warning == (
        f"predict_fn is implemented by 2 plugins: {names['Second']!r} runs first and wins whenever it returns "
        f"something other than None; then {names['First']!r}"
    )


def test_model_fn_returning_none_is_an_error_not_the_echo_model() -> None:
    """A plugin's model_fn returning None does not fall through to the built-in echo model."""

    class Lazy:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return None

    class Picky:
        @plugin_hook
        def model_fn(self, model_dir: str) -> Any:
            return None if model_dir == "/theirs" else "mine"

    with pytest.raises(TypeError, match=r"model_fn of '.*' returned None: return the model"):
        _plugins.call_model_fn(_plugins.build_manager([], [Lazy()]), "/m")
    assert _plugins.call_model_fn(_plugins.build_manager([], [Lazy(), Picky()]), "/m") == "mine"
    assert _plugins.call_model_fn(_plugins.build_manager([]), "/m")(3) == 3  # no plugin: the echo model


def test_the_process_manager_follows_the_selected_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """``manager()`` gives the plugins INFERENCE_SERVER_PLUGINS selects now, not those of its first call."""
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "")
    assert _plugins.describe(_plugins.manager())[0] == "plugins: none (the built-in hooks only)"
    monkeypatch.setenv("INFERENCE_SERVER_PLUGINS", "shipping_forecast")
    assert _plugins.describe(_plugins.manager())[0].startswith("plugin shipping_forecast")


def test_a_scripts_view_leaves_out_the_installed_plugins_unless_named() -> None:
    """``view`` (a script's plugins): of the installed plugins only those named, and plugins registered in code kept,
    with the script's hooks first."""

    class InCode:
        @plugin_hook
        def ping_fn(self, model: Any) -> bool:
            return True

    class Script:
        @plugin_hook
        def predict_fn(self, data: Any, model: Any) -> Any:
            return "scripted"

    discovered = _plugins.build_manager(None, [InCode()])
    assert "shipping_forecast" in discovered.sources  # installed in this environment
    alone = _plugins.view(discovered, Script(), "script:x")
    assert next(name for name, _ in alone.list_name_plugin()) == _plugins.DEFAULTS_NAME
    assert not set(discovered.sources) & {name for name, _ in alone.list_name_plugin()}
    assert (alone.sources, _plugins.providers(alone, "predict_fn")) == ({}, ["script:x", _plugins.DEFAULTS_NAME])
    assert len(_plugins.providers(alone, "ping_fn")) == 2  # InCode's, then the built-in
    named = _plugins.view(_plugins.build_manager(["shipping_forecast"]), Script(), "script:x")
    assert _plugins.providers(named, "predict_fn") == ["script:x", "shipping_forecast", _plugins.DEFAULTS_NAME]
    assert set(named.sources) == {"shipping_forecast"}


#: Every hook as ``async def``: each awaits, and leaves a mark in the answer or a file so that the test sees it ran.
ASYNC_HOOKS = """
    import asyncio
    import os

    import inference_server

    @inference_server.plugin_hook
    async def model_fn(model_dir):
        await asyncio.sleep(0)
        return {"dir": model_dir, "name": os.path.basename(model_dir.rstrip("/"))}

    @inference_server.plugin_hook
    async def input_fn(input_data, content_type):
        await asyncio.sleep(0)
        return {"input": bytes(input_data).decode()}

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        await asyncio.sleep(0.01)
        return {**data, "model": model["name"], "pid": os.getpid()}

    @inference_server.plugin_hook
    async def output_fn(prediction, accept):
        await asyncio.sleep(0)
        return inference_server.codecs.dumps(prediction, "application/json"), "application/json"

    @inference_server.plugin_hook
    async def ping_fn(model):
        await asyncio.sleep(0)
        return not os.path.exists(os.path.join(model["dir"], "sick"))

    @inference_server.plugin_hook
    async def batch_strategy():
        await asyncio.sleep(0)
        return "SingleRecord"

    @inference_server.plugin_hook
    async def max_concurrent_transforms():
        await asyncio.sleep(0)
        return 3

    @inference_server.plugin_hook
    async def max_payload_in_mb():
        await asyncio.sleep(0)
        return 7

    @inference_server.plugin_hook
    async def model_metadata(model):
        await asyncio.sleep(0)
        return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}], "outputs": []}

    @inference_server.plugin_hook
    async def batching():
        await asyncio.sleep(0)
        return {"max_batch_size": 8} if os.environ.get("ASYNC_BATCHING") else None

    @inference_server.plugin_hook
    async def predict_batch_fn(data, model):
        await asyncio.sleep(0.05)
        return [{**item, "batch": len(data)} for item in data]

    @inference_server.plugin_hook
    async def model_unload_fn(model):
        await asyncio.sleep(0)
        open(os.path.join(model["dir"], "unloaded"), "w").close()
"""


def test_every_hook_may_be_async_def_and_both_workers_run_them(servers: Any, plugin_site: Any, tmp_path: Any) -> None:
    """A plugin whose hooks are all async def is served by a real server with two workers (each its own loop after
    the fork): the answer, /ping (503 when ping_fn says so), /execution-parameters and the v2 metadata are theirs."""
    import orjson

    from tests.conftest import wait_until

    plugin_site.add("async_hooks", ASYNC_HOOKS)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    server = servers.start("--workers", "2", "--model-dir", str(model_dir))
    pids: set[int] = set()

    def both_workers_answered() -> bool:
        reply = server.request("POST", "/invocations", b"hello", {"Content-Type": "text/plain"})
        assert reply.status == 200, reply.body
        answer = reply.json()
        assert (answer["input"], answer["model"]) == ("hello", "model")
        pids.add(answer["pid"])
        return len(pids) == 2

    wait_until(both_workers_answered, 30, "the two workers did not both answer")
    assert server.request("GET", "/execution-parameters").json() == {
        "BatchStrategy": "SingleRecord",
        "MaxConcurrentTransforms": 3,
        "MaxPayloadInMB": 7,
    }
    metadata = server.request("GET", "/v2/models/async_hooks")
    assert orjson.loads(metadata.body)["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    assert server.request("GET", "/ping").status == 200
    (model_dir / "sick").touch()
    assert server.request("GET", "/ping").status == 503


def test_async_batching_and_predict_batch_fn_group_requests(servers: Any, plugin_site: Any) -> None:
    """An async batching hook turns micro-batching on, and an async predict_batch_fn answers concurrent requests
    in shared calls."""
    import concurrent.futures

    plugin_site.add("async_hooks", ASYNC_HOOKS)
    server = servers.start("--workers", "1", env={"ASYNC_BATCHING": "1"})

    def send(body: bytes) -> Any:
        reply = server.request("POST", "/invocations", body, {"Content-Type": "text/plain"})
        assert reply.status == 200, reply.body
        return reply.json()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, [str(i).encode() for i in range(16)]))
    assert sorted(int(answer["input"]) for answer in answers) == list(range(16))
    assert max(answer.get("batch", 1) for answer in answers) > 1


def test_an_async_model_unload_fn_runs_when_a_model_is_unloaded(servers: Any, plugin_site: Any, tmp_path: Any) -> None:
    """On a multi-model endpoint an async model_fn loads, the async request hooks answer /models/NAME/invoke, and
    DELETE /models/NAME runs the async model_unload_fn."""
    import orjson

    plugin_site.add("async_hooks", ASYNC_HOOKS)
    (tmp_path / "m").mkdir()
    server = servers.start("--multi-model", "--allow-model-dir", str(tmp_path))
    body = orjson.dumps({"model_name": "m", "url": str(tmp_path / "m")})
    assert server.request("POST", "/models", body, {"Content-Type": "application/json"}).status == 200
    reply = server.request("POST", "/models/m/invoke", b"hi", {"Content-Type": "text/plain"})
    assert (reply.json()["input"], reply.json()["model"]) == ("hi", "m")
    assert server.request("DELETE", "/models/m").status == 200
    assert (tmp_path / "m" / "unloaded").exists()


class _None:
    @plugin_hook
    async def predict_fn(self, data: Any, model: Any) -> Any:
        return None if data == "pass" else f"async {data}"


class _Wrapper:
    @plugin_hook(hookwrapper=True)
    def predict_fn(self, data: Any, model: Any) -> Any:
        outcome = yield
        outcome.force_result(f"wrapped {outcome.get_result()}")


def test_an_async_hook_returning_none_falls_through() -> None:
    """An async implementation returning None leaves the call to the next one (the defaults here), with the fast
    caller, pluggy's own, and pluggy's with a hookwrapper around it, which gets the result, not a coroutine."""
    pm = _plugins.build_manager([], [_None()])
    fast = _plugins.first_result_caller(pm, "predict_fn")
    assert (fast("x", None), fast("pass", str.upper)) == ("async x", "PASS")
    assert pm.hook.predict_fn(data="pass", model=str.upper) == "PASS"
    wrapped = _plugins.build_manager([], [_None(), _Wrapper()])
    assert _plugins.first_result_caller(wrapped, "predict_fn")("x", None) == "wrapped async x"
    assert _plugins.first_result_caller(wrapped, "predict_fn")("pass", str.upper) == "wrapped PASS"


def test_sync_hooks_are_left_as_they_are() -> None:
    """Registration wraps async implementations only: a sync one is pluggy's as written (nothing added to it)."""
    first, lazy = First(), _None()
    pm = _plugins.build_manager([], [first, lazy])
    functions = {impl.plugin: impl.function for impl in pm.hook.predict_fn.get_hookimpls()}
    assert functions[first] == first.predict_fn
    assert functions[lazy] != lazy.predict_fn
    assert functions[lazy].__wrapped__ == lazy.predict_fn  # type: ignore[attr-defined]


#: An async predict_fn that blocks the loop (time.sleep), the mistake the warning names.
BLOCKING = """
    import time

    import inference_server

    @inference_server.plugin_hook
    async def predict_fn(data, model):
        time.sleep(0.3)
        return b"slept"
"""


def test_an_async_hook_that_blocks_the_loop_is_named_once_per_worker(servers: Any, plugin_site: Any) -> None:
    """A server whose async predict_fn calls time.sleep logs one WARNING naming the hook and how long it held
    the loop, however many requests it answers."""
    plugin_site.add("blocking", BLOCKING)
    server = servers.start("--workers", "1")
    for _ in range(3):
        assert server.request("POST", "/invocations", b"x", {"Content-Type": "text/plain"}).body == b"slept"
    warnings = [line for line in server.output().splitlines() if "held the event loop" in line]
    assert len(warnings) == 1, warnings
    assert "hook predict_fn (blocking.predict_fn) held the event loop for 0." in warnings[0]
