"""The host's configuration: defaults < config file < environment < command line.

Every source is merged into one mapping and validated once by :class:`HostConfig`, so an
unknown key or a wrong type gets the same message wherever it came from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    ValidationError,
    field_serializer,
    field_validator,
)

from devicehost.cdi import DEFAULT_CDI_DIR

DEFAULT_DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
ENV_CONFIG = "DEVICEHOST_CONFIG"

# Environment variable -> config key. Lists are comma-separated.
ENV_KEYS: dict[str, str] = {
    "DEVICEHOST_DEVICE_PLUGINS_DIR": "device_plugins_dir",
    "DEVICEHOST_ALLOW_SYMLINKED_DIRS": "allow_symlinked_dirs",
    "DEVICEHOST_PLUGINS_REGISTRY_DIR": "plugins_registry_dir",
    "DEVICEHOST_REGISTRATION_MODE": "registration_mode",
    "DEVICEHOST_METRICS_ADDRESS": "metrics_address",
    "DEVICEHOST_CDI_DIR": "cdi_dir",
    "DEVICEHOST_BACKENDS": "enabled_backends",
    "DEVICEHOST_DISABLED_BACKENDS": "disabled_backends",
    "DEVICEHOST_REDISCOVER_INTERVAL": "rediscover_interval",
    "DEVICEHOST_HEALTH_INTERVAL": "health_interval",
    "DEVICEHOST_HOOK_TIMEOUT": "hook_timeout",
    "DEVICEHOST_LOG_FORMAT": "log_format",
    "DEVICEHOST_LOG_LEVEL": "log_level",
}
LIST_KEYS = frozenset({"enabled_backends", "disabled_backends"})


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key and what it expects."""


class HostConfig(BaseModel):
    """Everything the host can be told. Field descriptions are the documentation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_plugins_dir: Path = Field(
        DEFAULT_DEVICE_PLUGINS_DIR, description="the kubelet's device-plugins dir (kubelet.sock lives here)"
    )
    allow_symlinked_dirs: bool = Field(
        False, description="accept a device-plugins or plugins_registry dir reached through a symlink"
    )
    plugins_registry_dir: Path = Field(
        DEFAULT_PLUGINS_REGISTRY_DIR,
        description="the kubelet's plugin-watcher dir (registration mode watcher)",
    )
    registration_mode: Literal["auto", "kubelet", "watcher"] = Field(
        "auto",
        description="kubelet: Register on kubelet.sock; watcher: a socket in plugins_registry_dir; "
        "auto: watcher when the kubelet wrote DEPRECATION in the device-plugins dir",
    )
    enabled_backends: tuple[str, ...] = Field(
        (), description="load only these backends, in this order; empty loads every installed one"
    )
    disabled_backends: tuple[str, ...] = Field((), description="never load these backends")
    backends: dict[str, dict[str, Any]] = Field(
        {}, description="per-backend settings, handed to that backend's devicehost_configure"
    )
    rediscover_interval: PositiveFloat = Field(10.0, description="seconds between discoveries")
    health_interval: PositiveFloat = Field(5.0, description="seconds between health polls")
    hook_timeout: PositiveFloat = Field(10.0, description="seconds a hook may run before it counts as hung")
    register_timeout: PositiveFloat = Field(
        5.0, description="seconds a Register call to the kubelet may take"
    )
    socket_mode: int = Field(
        0o600, description="permission bits of the resource sockets (octal in YAML: 0o600)"
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="json off a terminal, console on one, when auto"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="lowest level logged")
    metrics_address: str = Field(
        "", description="HOST:PORT serving /metrics, /healthz, /readyz and /status; empty: off"
    )
    cdi_dir: Path = Field(DEFAULT_CDI_DIR, description="where backends write CDI specs (devicehost.cdi)")

    @field_validator("socket_mode", mode="before")
    @classmethod
    def _octal_text(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return int(value, 8)
            except ValueError:
                raise ValueError("must be octal permission bits such as '0600'") from None
        return value

    @field_serializer("socket_mode")
    def _show_octal(self, value: int) -> str:
        return f"0{value:o}"

    @field_validator("metrics_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        if value:
            _, sep, port = value.rpartition(":")
            if not sep or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("must be HOST:PORT (e.g. 0.0.0.0:9464), or empty to turn it off")
        return value

    @field_validator("socket_mode")
    @classmethod
    def _mode_bits(cls, value: int) -> int:
        if not 0 <= value <= 0o777:
            raise ValueError("must be permission bits between 0o000 and 0o777")
        return value


def _format_errors(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        got = f" (got {item['input']!r})" if item["type"] != "missing" else ""
        lines.append(f"  {path}: {item['msg']}{got}")
    return "\n".join(lines)


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML config file; a missing, unreadable or non-mapping file is an error."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(data).__name__}")
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The config keys set by ``DEVICEHOST_*`` environment variables."""
    values: dict[str, Any] = {}
    for var, key in ENV_KEYS.items():
        if var in environ and environ[var] != "":
            raw = environ[var]
            values[key] = (
                [item.strip() for item in raw.split(",") if item.strip()] if key in LIST_KEYS else raw
            )
    return values


def chosen_config_file(given: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The config file in use: the one given (``--config``), else ``$DEVICEHOST_CONFIG``, else none."""
    environ = os.environ if environ is None else environ
    if given is None and environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG])
    return given


def build_config(
    config_file: Path | None = None,
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> HostConfig:
    """Merge the sources (command line over environment over file over defaults) and validate."""
    environ = os.environ if environ is None else environ
    config_file = chosen_config_file(config_file, environ)
    merged: dict[str, Any] = read_config_file(config_file) if config_file else {}
    from_env = env_overrides(environ)
    merged.update(from_env)
    merged.update({key: value for key, value in (cli or {}).items() if value not in (None, [], ())})
    sources = ", ".join(
        part
        for part, used in (
            (f"file {config_file}", config_file),
            ("environment", from_env),
            ("command line", cli),
        )
        if used
    )
    try:
        return HostConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, sources or "defaults")) from exc
