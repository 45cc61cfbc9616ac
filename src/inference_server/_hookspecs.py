"""The hook specifications and the markers: what a plugin may implement. Imports nothing of ours.

Names and signatures are those of inference-server 1.x and never change; a new hook is added here (``batching`` and
``predict_batch_fn`` are new in 2.0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from werkzeug.datastructures import MIMEAccept

    from inference_server._settings import BatchStrategy

PROJECT = "inference_server"
ENTRY_POINT_GROUP = "inference_server"

#: Decorator for hook implementations in a plugin.
plugin_hook = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)


class HookSpecs:
    """The hooks a plugin may implement. Names and signatures are those of inference-server 1.x."""

    @hookspec(firstresult=True)
    def model_fn(self, model_dir: str) -> Any:
        """Load the model from ``model_dir`` (a directory that may not exist; the hook decides)."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def input_fn(self, input_data: bytes, content_type: str) -> Any:
        """Turn the request body (bytes-like) of media type ``content_type`` into the model's input."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def predict_fn(self, data: Any, model: Any) -> Any:
        """Run the model on the output of ``input_fn``."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def output_fn(self, prediction: Any, accept: MIMEAccept) -> tuple[Any, str]:
        """Serialize the prediction for a client accepting ``accept``; return ``(body, content_type)``.

        A third item, a mapping of extra response headers, may follow the content type.
        """
        raise NotImplementedError

    @hookspec(firstresult=True)
    def ping_fn(self, model: Any) -> bool:
        """Return whether the model is healthy; ``False`` makes ``/ping`` answer 503."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def batch_strategy(self) -> BatchStrategy | str:
        """The Batch Transform strategy this model prefers (``SingleRecord`` or ``MultiRecord``)."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def max_concurrent_transforms(self) -> int:
        """How many Batch Transform requests this model can serve at once."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def max_payload_in_mb(self) -> int:
        """The largest request body this model accepts, in MB (0: no limit)."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def batching(self) -> dict[str, int] | None:
        """Micro-batching this model wants: ``max_batch_size`` (1: off) and ``max_batch_delay_ms``, either may be
        left out; ``None``: no preference. ``serve``'s options win over it; it wins over the variables."""
        raise NotImplementedError

    @hookspec(firstresult=True)
    def predict_batch_fn(self, data: list[Any], model: Any) -> list[Any] | None:
        """Run the model once on the inputs of several requests (``input_fn``'s outputs, in order) and return one
        prediction per input, in the same order; ``None`` leaves the group to the built-in batching (arrays
        concatenated, anything else one by one)."""
        raise NotImplementedError

    @hookspec
    def model_unload_fn(self, model: Any) -> None:
        """Release what ``model`` holds beyond Python's memory (GPU memory, files, threads) when a multi-model endpoint
        unloads it; every implementation runs. New in 2.0."""

    @hookspec(firstresult=True)
    def model_metadata(self, model: Any) -> dict[str, Any] | None:
        """The model's signature for the Open Inference Protocol: ``{"inputs": [...], "outputs": [...]}``, each
        tensor ``{"name", "datatype", "shape"}`` (``-1`` for a dimension of any size), as ``GET /v2/models/NAME``
        shows it; requests whose inputs do not match are refused (400). ``None``: no signature, nothing checked.
        New in 2.0."""
        raise NotImplementedError


HOOK_NAMES = tuple(name for name in vars(HookSpecs) if not name.startswith("_"))
