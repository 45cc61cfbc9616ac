"""Settings from SageMaker environment variables and the command line."""

import os

import pytest

from inference_server import BatchStrategy
from inference_server._settings import Settings, env_batch_strategy, env_max_payload_in_mb
from inference_server.errors import ConfigurationError


def test_defaults() -> None:
    """Without variables: 0.0.0.0:8080, one worker per CPU, 60 s, /opt/ml/model."""
    settings = Settings.from_env({})
    assert (settings.host, settings.port, settings.timeout, settings.model_dir) == (
        "0.0.0.0",
        8080,
        60,
        "/opt/ml/model",
    )
    assert settings.workers == (os.cpu_count() or 1)
    assert settings.threads == 1
    assert settings.default_accept is None


def test_environment_variables() -> None:
    """Each SageMaker variable sets its setting."""
    settings = Settings.from_env(
        {
            "SAGEMAKER_BIND_TO_PORT": "9000",
            "SAGEMAKER_MODEL_SERVER_WORKERS": "3",
            "SAGEMAKER_MODEL_SERVER_TIMEOUT": "120",
            "INFERENCE_SERVER_MODEL_DIR": "/models/a",
            "INFERENCE_SERVER_THREADS": "4",
            "INFERENCE_SERVER_LOG_LEVEL": "DEBUG",
            "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "application/x-npy",
        }
    )
    assert (settings.port, settings.workers, settings.timeout, settings.threads) == (9000, 3, 120, 4)
    assert (settings.model_dir, settings.log_level, settings.default_accept) == (
        "/models/a",
        "debug",
        "application/x-npy",
    )


def test_options_win_over_variables() -> None:
    """Command-line values override the environment."""
    settings = Settings.from_env({"SAGEMAKER_BIND_TO_PORT": "9000"}, port="9001", workers=2, model_dir="/m")
    assert (settings.port, settings.workers, settings.model_dir) == (9001, 2, "/m")


def test_a_batch_transform_container_waits_600_s_by_default() -> None:
    """SAGEMAKER_BATCH=true makes the request timeout SageMaker's invocation timeout (600 s) unless it is set."""
    assert Settings.from_env({"SAGEMAKER_BATCH": "true"}).timeout == 600
    assert Settings.from_env({"SAGEMAKER_BATCH": "false"}).timeout == 60
    assert Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "90"}).timeout == 90
    assert Settings.from_env({"SAGEMAKER_BATCH": "true"}, timeout=30).timeout == 30


def test_settings_are_frozen() -> None:
    """Settings cannot change after start-up."""
    settings = Settings.from_env({})
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SAGEMAKER_BIND_TO_PORT", "abc", "SAGEMAKER_BIND_TO_PORT='abc' is invalid: not an integer"),
        ("SAGEMAKER_BIND_TO_PORT", "70000", "SAGEMAKER_BIND_TO_PORT='70000' is invalid: must be between 0 and 65535"),
        ("SAGEMAKER_MODEL_SERVER_WORKERS", "0", "SAGEMAKER_MODEL_SERVER_WORKERS='0' is invalid: must be at least 1"),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "1.5", "SAGEMAKER_MODEL_SERVER_TIMEOUT='1.5' is invalid: not an integer"),
        ("INFERENCE_SERVER_LOG_LEVEL", "loud", "INFERENCE_SERVER_LOG_LEVEL='loud' is invalid: must be one of"),
    ],
)
def test_invalid_variable_names_variable_and_value(variable: str, value: str, message: str) -> None:
    """A bad variable is a ConfigurationError (a ValueError) naming the variable and its value."""
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({variable: value})
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_invalid_option_is_named_as_an_option() -> None:
    """A bad command-line value names the option."""
    with pytest.raises(ConfigurationError, match="--workers='many' is invalid: not an integer"):
        Settings.from_env({}, workers="many")


@pytest.mark.parametrize(
    ("text", "strategy"),
    [
        ("SINGLE_RECORD", BatchStrategy.SINGLE_RECORD),
        ("MULTI_RECORD", BatchStrategy.MULTI_RECORD),
        ("SingleRecord", BatchStrategy.SINGLE_RECORD),
        ("multirecord", BatchStrategy.MULTI_RECORD),
        ("single_record", BatchStrategy.SINGLE_RECORD),
    ],
)
def test_batch_strategy_spellings(text: str, strategy: BatchStrategy) -> None:
    """SageMaker's SINGLE_RECORD spelling and the JSON's SingleRecord both parse, in any case."""
    assert env_batch_strategy({"SAGEMAKER_BATCH_STRATEGY": text}) is strategy
    assert strategy.value in ("SingleRecord", "MultiRecord")


def test_batch_strategy_default_and_error() -> None:
    """MultiRecord by default; nonsense is named."""
    assert env_batch_strategy({}) is BatchStrategy.MULTI_RECORD
    with pytest.raises(ConfigurationError, match="SAGEMAKER_BATCH_STRATEGY='ALL'"):
        env_batch_strategy({"SAGEMAKER_BATCH_STRATEGY": "ALL"})


def test_max_payload_zero_means_no_limit() -> None:
    """0 is allowed (Batch Transform's chunked mode); negative is not."""
    assert env_max_payload_in_mb({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"}) == 0
    assert env_max_payload_in_mb({}) == 6
    with pytest.raises(ConfigurationError):
        env_max_payload_in_mb({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "-1"})
