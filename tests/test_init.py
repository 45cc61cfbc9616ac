"""The public face of the package."""

import inference_server


def test_all_lists_exactly_the_public_names() -> None:
    """``__all__`` is the documented public API, nothing more, nothing less."""
    assert sorted(inference_server.__all__) == sorted(
        ["BatchStrategy", "MIMEAccept", "__version__", "create_app", "plugin_hook", "warmup"]
    )
    public = {name for name in dir(inference_server) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(inference_server, name)).__name__ == "module"}
    assert public - modules == set(inference_server.__all__) - {"__version__"}
    assert all(getattr(inference_server, name) is not None for name in inference_server.__all__)


def test_version_comes_from_installed_metadata() -> None:
    """``__version__`` is the installed distribution's version."""
    import importlib.metadata

    assert inference_server.__version__ == importlib.metadata.version("inference-server")


def test_mime_accept_is_werkzeugs() -> None:
    """``MIMEAccept`` is werkzeug's class, as in inference-server 1.x."""
    import werkzeug.datastructures

    assert inference_server.MIMEAccept is werkzeug.datastructures.MIMEAccept


def test_warmup_loads_the_model_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``warmup()`` returns the model, and calling it again reuses the same object."""
    model = inference_server.warmup(model_dir=str(tmp_path))
    assert model is inference_server.warmup(model_dir=str(tmp_path))
    assert model({"location": "Fair Isle"})["wind"].startswith("Southwesterly")
