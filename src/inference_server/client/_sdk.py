"""Our serializers and deserializers as virtual subclasses of the SageMaker SDK's abstract bases, so that code which
checks ``isinstance`` against them (SDK v3's ``Endpoint`` validates its ``serializer`` and ``deserializer`` fields
so) takes ours. Nothing here imports the SDK: a base is registered with only if the SDK is already imported."""

from __future__ import annotations

import sys

#: The SDK modules defining the abstract bases, by our base's name: v3's, then v2's.
_MODULES = {
    "BaseSerializer": ("sagemaker.core.serializers.base", "sagemaker.base_serializers"),
    "BaseDeserializer": ("sagemaker.core.deserializers.base", "sagemaker.base_deserializers"),
}
_done: set[tuple[type, type]] = set()


def register(cls: type, base_name: str) -> None:
    """Make ``cls`` a virtual subclass of the SDK's ``base_name`` in every SDK module already imported."""
    for module_name in _MODULES[base_name]:
        base = getattr(sys.modules.get(module_name), base_name, None)
        if base is None or (cls, base) in _done:
            continue
        if not issubclass(cls, base):
            base.register(cls)
        _done.add((cls, base))
