"""The one exception tree: what each class is, so that users can catch one base class."""

from __future__ import annotations

import werkzeug.exceptions

from inference_server import errors

#: Every public exception: (its parent in our tree, its HTTP status or None, whether it is also a ValueError).
TREE = {
    "InferenceServerError": (Exception, None, False),
    "ConfigurationError": (errors.InferenceServerError, None, True),
    "PluginError": (errors.InferenceServerError, None, False),
    "PredictionError": (errors.InferenceServerError, None, False),
    "HookError": (errors.InferenceServerError, None, False),
    "TransformError": (errors.InferenceServerError, None, False),
    "HTTPError": (errors.InferenceServerError, None, False),
    "BadRequest": (errors.HTTPError, 400, False),
    "DecodeError": (errors.BadRequest, 400, True),
    "Forbidden": (errors.HTTPError, 403, False),
    "NotFound": (errors.HTTPError, 404, False),
    "RequestTimeout": (errors.HTTPError, 408, False),
    "Conflict": (errors.HTTPError, 409, False),
    "LengthRequired": (errors.HTTPError, 411, False),
    "PayloadTooLarge": (errors.HTTPError, 413, False),
    "URITooLong": (errors.HTTPError, 414, False),
    "UnsupportedMediaType": (errors.HTTPError, 415, False),
    "NotAcceptable": (errors.HTTPError, 406, False),
    "EncodeError": (errors.HTTPError, 500, False),
    "ServiceUnavailable": (errors.HTTPError, 503, False),
    "ModelLoadError": (errors.ServiceUnavailable, 503, False),
    "GatewayTimeout": (errors.HTTPError, 504, False),
    "InsufficientStorage": (errors.HTTPError, 507, False),
}


def test_all_lists_exactly_the_tree() -> None:
    """``errors.__all__`` names every class of the tree and nothing else."""
    assert sorted(errors.__all__) == sorted(TREE)


def test_every_class_is_an_inference_server_error_in_its_place() -> None:
    """Each class subclasses its parent, and so InferenceServerError; ValueError where decoding or settings fail."""
    for name, (parent, _, value_error) in TREE.items():
        cls = getattr(errors, name)
        assert issubclass(cls, parent), name
        assert issubclass(cls, errors.InferenceServerError), name
        assert issubclass(cls, ValueError) == value_error, name


def test_http_errors_carry_their_status_and_message() -> None:
    """HTTP errors have a class-level ``code``, a default message and the given one as ``description`` and ``str``."""
    for name, (_, code, _) in TREE.items():
        cls = getattr(errors, name)
        assert not issubclass(cls, werkzeug.exceptions.HTTPException), name
        if code is not None:
            assert cls.code == code, name
            assert cls("why").description == str(cls("why")) == "why"
            assert cls().description, name


def test_the_docstring_draws_every_class() -> None:
    """The module docstring's tree names every class, so it cannot drift from the code."""
    assert errors.__doc__ is not None
    for name in TREE:
        assert name in errors.__doc__, name
