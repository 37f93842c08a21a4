"""The host's configuration: defaults < config file < environment < command line.

:class:`HostConfig` is the one definition of every setting. Its fields make the config-file
keys; :func:`settings` derives each key's environment variable (``DEVICEHOST_<KEY>``) and
command-line flag (``--<key>``) from them, so the three cannot drift. Every source is merged into
one mapping and validated once, so an unknown key or a wrong type gets the same message wherever
it came from, with the nearest valid key suggested.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PositiveFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from devicehost.cdi import DEFAULT_CDI_DIR

DEFAULT_DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_PLUGINS_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_DRA_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
_DRIVER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ENV_CONFIG = "DEVICEHOST_CONFIG"
ENV_PREFIX = "DEVICEHOST_"


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key and what it expects."""


def _driver_name(driver: str) -> str:
    if not _DRIVER_NAME.fullmatch(driver) or len(driver) > 63:
        raise ValueError(
            f"DRA driver name {driver!r} must be a DNS subdomain of at most 63 characters "
            "(lower case letters, digits, '-' and '.')"
        )
    return driver


DriverName = Annotated[str, AfterValidator(_driver_name)]


@dataclass(frozen=True)
class OnReload:
    """What a reload does with a setting: marks each field of :class:`HostConfig`.

    ``in place``: the running host applies the new value: a reload puts it in the host context
    (``devicehost.host.context.HostContext``), where every part that uses the setting reads it
    at its next use (the backends' own settings: their reload). ``next start``: it
    names a socket, a server, a dir or a renderer already in use; a reload keeps the old value
    and says so.
    """

    when: Literal["in place", "next start"]


IN_PLACE = OnReload("in place")
NEXT_START = OnReload("next start")


def _octal_text(value: object) -> object:
    if isinstance(value, str):
        try:
            return int(value, 8)
        except ValueError:
            raise ValueError("must be octal permission bits such as '0600'") from None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0o777:
        raise ValueError(
            f"YAML read {value} as a decimal number, more than the permission bits 0o777 allow; "
            f"write octal as a string ('0{value}') or with a 0o prefix (0o{value})"
        )
    return value


def _mode_bits(value: int) -> int:
    if not 0 <= value <= 0o777:
        raise ValueError("must be permission bits between 0o000 and 0o777")
    return value


def _host_port(value: str) -> str:
    if value:
        check_address(value)
    return value


OctalMode = Annotated[
    int, BeforeValidator(_octal_text), AfterValidator(_mode_bits), PlainSerializer(lambda v: f"0{v:o}")
]
"""Permission bits, written and shown as octal text."""
Address = Annotated[str, AfterValidator(_host_port)]
"""``HOST:PORT``, or empty."""


class HostConfig(BaseModel):
    """Everything the host can be told. Field descriptions are the documentation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_plugins_dir: Annotated[Path, NEXT_START] = Field(
        DEFAULT_DEVICE_PLUGINS_DIR, description="the kubelet's device-plugins dir (kubelet.sock lives here)"
    )
    allow_symlinked_dirs: Annotated[bool, NEXT_START] = Field(
        False, description="accept a device-plugins or plugins_registry dir reached through a symlink"
    )
    plugins_registry_dir: Annotated[Path, NEXT_START] = Field(
        DEFAULT_PLUGINS_REGISTRY_DIR,
        description="the kubelet's plugin-watcher dir (registration mode watcher)",
    )
    registration_mode: Annotated[Literal["auto", "kubelet", "watcher"], NEXT_START] = Field(
        "auto",
        description="kubelet: Register on kubelet.sock; watcher: a socket in plugins_registry_dir; "
        "auto: watcher when the kubelet wrote DEPRECATION in the device-plugins dir",
    )
    enabled_backends: Annotated[tuple[str, ...], IN_PLACE] = Field(
        (),
        description="load only these backends, in this order; empty loads every installed one",
        json_schema_extra={"flag": "--backend", "env": "DEVICEHOST_BACKENDS"},
    )
    disabled_backends: Annotated[tuple[str, ...], IN_PLACE] = Field(
        (), description="never load these backends", json_schema_extra={"flag": "--disable"}
    )
    backends: Annotated[dict[str, dict[str, Any]], IN_PLACE] = Field(
        {},
        description="per-backend settings (backend name -> mapping), checked by that backend's "
        "settings model and handed to its devicehost_configure",
        json_schema_extra={"flag": "--backend-settings", "env": "DEVICEHOST_BACKEND_SETTINGS"},
    )
    rediscover_interval: Annotated[PositiveFloat, IN_PLACE] = Field(
        10.0, description="seconds between discoveries"
    )
    health_interval: Annotated[PositiveFloat, IN_PLACE] = Field(
        5.0, description="seconds between health polls"
    )
    hook_timeout: Annotated[PositiveFloat, IN_PLACE] = Field(
        10.0,
        description="seconds a hook may run before it counts as hung (a resource's own HookTimeouts win)",
    )
    register_timeout: Annotated[PositiveFloat, IN_PLACE] = Field(
        5.0, description="seconds a Register call to the kubelet may take"
    )
    socket_mode: Annotated[OctalMode, NEXT_START] = Field(
        0o600,
        description="permission bits of the resource sockets; a string is octal ('0660', '660', "
        "'0o660'), a bare YAML number over 0o777 such as 660 is refused",
        json_schema_extra={"metavar": "OCTAL"},
    )
    log_format: Annotated[Literal["auto", "json", "console"], NEXT_START] = Field(
        "auto", description="json off a terminal, console on one, when auto"
    )
    log_level: Annotated[Literal["debug", "info", "warning", "error"], NEXT_START] = Field(
        "info", description="lowest level logged"
    )
    metrics_address: Annotated[Address, NEXT_START] = Field(
        "",
        description="HOST:PORT serving /metrics, /healthz, /readyz and /status; empty: off",
        json_schema_extra={"metavar": "HOST:PORT"},
    )
    cdi_dir: Annotated[Path, IN_PLACE] = Field(
        DEFAULT_CDI_DIR, description="where backends write CDI specs (devicehost.cdi)"
    )
    device_release: Annotated[bool, NEXT_START] = Field(
        True,
        description="follow the kubelet's pod-resources API and call devicehost_release for devices "
        "no running container holds any more; off when false or while the socket is missing",
    )
    pod_resources_socket: Annotated[Path, NEXT_START] = Field(
        DEFAULT_POD_RESOURCES_SOCKET,
        description="the kubelet's pod-resources socket (k0s, microk8s and custom kubelet roots differ)",
        json_schema_extra={"metavar": "PATH"},
    )
    pod_resources_interval: Annotated[PositiveFloat, NEXT_START] = Field(
        30.0,
        description="seconds between pod-resources looks when the kubelet's checkpoint file did not change",
    )
    preferred_allocation: Annotated[
        dict[str, Literal["numa-pack", "spread", "replica-spread", "none"]], NEXT_START
    ] = Field(
        {},
        description="per resource name, the devicehost.policies policy that answers "
        "GetPreferredAllocation when its backend has no devicehost_preferred_allocation; none: no answer",
    )

    serve_through: Annotated[dict[str, Literal["device-plugin", "dra", "both"]], NEXT_START] = Field(
        {},
        description="per backend or resource name (a resource's own entry wins), the kubelet API "
        "its resources are served through: device-plugin (extended resources), dra (Dynamic "
        "Resource Allocation: ResourceSlices and a DRA kubelet plugin) or both; unnamed: device-plugin",
    )
    dra_drivers: Annotated[dict[str, DriverName], NEXT_START] = Field(
        {},
        description="per resource name served through DRA, its DRA driver name; unnamed: the "
        "resource's domain (example.com/widget -> example.com)",
    )
    dra_plugins_dir: Annotated[Path, NEXT_START] = Field(
        DEFAULT_DRA_PLUGINS_DIR,
        description="the kubelet's plugins dir: each DRA driver's socket goes in <dir>/<driver>/",
    )
    dra_unhealthy_taint: Annotated[Literal["NoSchedule", "NoExecute", "none"] | None, NEXT_START] = Field(
        None,
        description="the effect of the taint (devicehost.io/unhealthy) an unhealthy device keeps "
        "in its ResourceSlice where the API server has device taints (DRADeviceTaints); none, or "
        "an API server without them: the device is withdrawn from the slice instead; unset: what "
        "the resource's backend chose (Resource.unhealthy_taint), else NoSchedule",
    )
    node_name: Annotated[str, NEXT_START] = Field(
        "",
        description="this node's name, for the ResourceSlices DRA publishes (the DaemonSet sets it "
        "from spec.nodeName); needed when anything is served through dra",
    )
    kubeconfig: Annotated[Path | None, NEXT_START] = Field(
        None,
        description="kubeconfig for the API server (DRA only); unset: in-cluster credentials in a "
        "pod, else $KUBECONFIG or ~/.kube/config",
        json_schema_extra={"metavar": "PATH"},
    )

    @field_validator("enabled_backends", "disabled_backends", mode="before")
    @classmethod
    def _one_name(cls, value: object) -> object:
        """``enabled_backends: example`` (or ``a, b``) means the list people meant."""
        return split_names(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _dra_needs_node(self) -> HostConfig:
        if not self.node_name and any(api != "device-plugin" for api in self.serve_through.values()):
            raise ValueError(
                "node_name is needed when serve_through names dra or both (ResourceSlices belong "
                "to a node): set it, or DEVICEHOST_NODE_NAME from the pod's spec.nodeName"
            )
        return self


def on_reload(key: str) -> OnReload:
    """How ``key`` of :class:`HostConfig` takes a reload; every field is marked (tests hold it)."""
    marks = [m for m in HostConfig.model_fields[key].metadata if isinstance(m, OnReload)]
    if len(marks) != 1:
        raise LookupError(f"HostConfig.{key} must be marked IN_PLACE or NEXT_START, once")
    return marks[0]


def restart_only_keys() -> tuple[str, ...]:
    """The settings a reload cannot change (marked :data:`NEXT_START`), in the model's order."""
    return tuple(key for key in HostConfig.model_fields if on_reload(key) == NEXT_START)


def check_address(value: str) -> None:
    """``HOST:PORT`` with a port in 1..65535; :raises ValueError: saying what is expected."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or " " in host:
        raise ValueError("must be HOST:PORT (e.g. 0.0.0.0:9464), or empty to turn it off")


def split_names(text: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``: how a list is written in a flag or an environment variable."""
    return [item.strip() for item in text.split(",") if item.strip()]


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The valid spelling closest to ``word``, if one is close enough to be a typo."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return found[0] if found else None


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for part in (annotation, *typing.get_args(annotation)):
        if isinstance(part, type) and issubclass(part, BaseModel):
            return part
    return None


def model_keys(model: type[BaseModel], path: Sequence[str | int] = ()) -> set[str]:
    """The keys ``model`` accepts at ``path`` (a path into a nested model), its own ones if unsure."""
    current = model
    for part in path:
        field = current.model_fields.get(str(part))
        nested = _nested_model(field.annotation) if field is not None else None
        if nested is None:
            current = model
            break
        current = nested
    return {field.alias or name for name, field in current.model_fields.items()}


def describe_errors(error: ValidationError, model: type[BaseModel], prefix: Sequence[str] = ()) -> list[str]:
    """One ``key.path: what is wrong, what is expected`` line per error; unknown keys get a suggestion."""
    lines = []
    for item in error.errors():
        path = ".".join([*prefix, *(str(part) for part in item["loc"])]) or "(top level)"
        if item["type"] == "extra_forbidden":
            key, where = str(item["loc"][-1]), item["loc"][:-1]
            lines.append(f"{path}: {unknown_key(key, model_keys(model, where))}")
            continue
        got = f" (got {item['input']!r})" if item["type"] != "missing" else ""
        lines.append(f"{path}: {item['msg']}{got}")
    return lines


def unknown_key(key: str, valid: Iterable[str]) -> str:
    """``unknown key, did you mean 'x'?`` or, with nothing close, the keys there are."""
    guess = nearest(key, valid)
    if guess is not None:
        return f"unknown key, did you mean {guess!r}?"
    return f"unknown key (valid keys: {', '.join(sorted(valid))})"


@dataclass(frozen=True)
class Setting:
    """One config key as it is reached three ways: file key, environment variable, flag."""

    key: str
    env: str
    flag: str
    shape: Literal["text", "switch", "list", "mapping"]
    """How a flag or variable spells it: plain text, true/false, ``a,b``, or a YAML mapping."""
    choices: tuple[str, ...]
    metavar: str
    description: str
    default: object
    on_reload: Literal["in place", "next start"] = "in place"
    """What a reload does with it (the field's :class:`OnReload` mark)."""

    def parse(self, raw: str) -> Any:
        """The value of an environment variable or flag, in the form the model validates."""
        if self.shape == "list":
            return split_names(raw)
        if self.shape == "mapping":
            import yaml  # only a mapping given as a flag or variable needs it

            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{self.key}: not valid YAML ({exc})") from exc
            if not isinstance(value, dict):
                raise ConfigError(f"{self.key}: must be a YAML mapping such as '{{name: {{key: value}}}}'")
            return value
        return raw


def _shape(annotation: Any) -> tuple[Literal["text", "switch", "list", "mapping"], tuple[str, ...]]:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return "switch", ()
    if origin in (tuple, list):
        return "list", ()
    if origin is dict:
        return "mapping", ()
    if origin is Literal:
        return "text", tuple(str(choice) for choice in typing.get_args(annotation))
    return "text", ()


def _metavar(key: str, annotation: Any, shape: str) -> str:
    if shape == "list":
        return "NAME"
    if shape == "mapping":
        return "YAML"
    if annotation is Path:
        return "DIR"
    if key.endswith(("_interval", "_timeout")):
        return "SECONDS"
    return "VALUE"


def settings(model: type[BaseModel] | None = None) -> tuple[Setting, ...]:
    """Every field of the config model as a :class:`Setting`, in the model's order.

    A field's ``json_schema_extra`` may name its ``flag``, ``env`` or ``metavar``; otherwise they
    are ``--<key-with-dashes>``, ``DEVICEHOST_<KEY>`` and a placeholder from the field's type.
    """
    found = []
    for key, field in (model or HostConfig).model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        shape, choices = _shape(field.annotation)
        found.append(
            Setting(
                key=key,
                env=str(extra.get("env", ENV_PREFIX + key.upper())),
                flag=str(extra.get("flag", "--" + key.replace("_", "-"))),
                shape=shape,
                choices=choices,
                metavar=str(extra.get("metavar", _metavar(key, field.annotation, shape))),
                description=field.description or "",
                default=field.default,
                on_reload=on_reload(key).when if model is None or model is HostConfig else "in place",
            )
        )
    return tuple(found)


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML config file; a missing, unreadable or non-mapping file is an error."""
    import yaml  # only a host given a config file needs it

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
    """The config keys set by ``DEVICEHOST_*`` environment variables (an empty one sets nothing)."""
    return {s.key: s.parse(environ[s.env]) for s in settings() if environ.get(s.env, "") != ""}


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
        lines = describe_errors(exc, HostConfig)
        raise ConfigError("\n  ".join([f"invalid configuration ({sources or 'defaults'}):", *lines])) from exc
