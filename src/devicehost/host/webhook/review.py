"""An AdmissionReview (``admission.k8s.io/v1``) in, the answer out: no I/O, no backend loading.

The objects checked are ResourceClaims (``spec.devices.config[]``) and ResourceClaimTemplates
(``spec.spec.devices.config[]``). Their configuration has the same shape in ``resource.k8s.io``
v1, v1beta2 and v1beta1 (requests differ: ``exactly``/``firstAvailable`` against a flat
request; the config list does not): ``{requests: [...], opaque: {driver, parameters}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from devicehost.host.backends.backend import ClaimConfigRefused

API_VERSION = "admission.k8s.io/v1"
GROUP = "resource.k8s.io"
SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec",),
    "ResourceClaimTemplate": ("spec", "spec"),
}
"""Where each kind keeps its ResourceClaimSpec."""
DENIED_CODE = 422
"""The HTTP code a refusal carries in ``response.status`` (the API server answers the client with it)."""


class Malformed(ValueError):
    """The body is not an AdmissionReview request this webhook can answer (HTTP 400, one line)."""


class ConfigChecker(Protocol):
    """What answers for one driver: a loaded backend (:class:`~devicehost.host.backends.backend.Backend`)."""

    name: str

    def claim_config(self, parameters: Mapping[str, Any], where: str) -> object:
        """Return, or raise :class:`ClaimConfigRefused` naming each bad key as ``<where>.<key path>``."""
        ...


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionReview's ``request`` the decision needs."""

    uid: str
    group: str
    version: str
    kind: str
    operation: str
    name: str
    namespace: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None


@dataclass(frozen=True)
class Refusal:
    """One config entry a backend refused: its ``key.path: why`` lines."""

    driver: str
    backend: str
    problems: tuple[str, ...]

    def __str__(self) -> str:
        return f"driver {self.driver} (devicehost backend {self.backend}): {'; '.join(self.problems)}"


@dataclass(frozen=True)
class Decision:
    """Allowed, or refused with what each backend refused."""

    allowed: bool
    refusals: tuple[Refusal, ...] = ()
    checked: tuple[str, ...] = ()
    """The drivers whose configuration was checked (for the log)."""

    @property
    def problems(self) -> tuple[str, ...]:
        """Every ``key.path: why`` line."""
        return tuple(line for refusal in self.refusals for line in refusal.problems)

    @property
    def message(self) -> str:
        return "; ".join(str(refusal) for refusal in self.refusals)


def parse_review(body: bytes) -> Request:
    """The request of an AdmissionReview ``admission.k8s.io/v1``.

    :raises Malformed: with one line saying what is wrong.
    """
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(f"the body is not JSON: {exc}") from None
    if not isinstance(review, dict):
        raise Malformed("the body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise Malformed(
            f"expected apiVersion {API_VERSION} and kind AdmissionReview, got "
            f"{review.get('apiVersion')!r} and {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise Malformed("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise Malformed("request.uid must be a non-empty string")
    kind = request.get("kind")
    if not isinstance(kind, dict):
        raise Malformed("request.kind must be an object {group, version, kind}")
    objects = {}
    for key in ("object", "oldObject"):
        value = request.get(key)
        if value is not None and not isinstance(value, dict):
            raise Malformed(f"request.{key} must be an object or null")
        objects[key] = value
    return Request(
        uid=uid,
        group=str(kind.get("group", "")),
        version=str(kind.get("version", "")),
        kind=str(kind.get("kind", "")),
        operation=str(request.get("operation", "")),
        name=str(request.get("name") or ""),
        namespace=str(request.get("namespace") or ""),
        object=objects["object"],
        old_object=objects["oldObject"],
    )


def _claim_spec(obj: Mapping[str, Any] | None, kind: str) -> tuple[Any, str]:
    """The ResourceClaimSpec inside ``obj`` and its path (``spec`` or ``spec.spec``)."""
    path = SPEC_PATHS[kind]
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value, ".".join(path)


def config_problems(
    spec: Any, where: str, checkers: Mapping[str, ConfigChecker]
) -> tuple[list[Refusal], list[str]]:
    """Each ``opaque`` config of a ResourceClaimSpec checked by the backend of its driver.

    Configuration for a driver no loaded backend answers for passes untouched. Returns the
    refusals (lines ``<where>.devices.config[i].opaque.parameters.<key path>: why``) and the
    drivers checked.
    """
    devices = spec.get("devices") if isinstance(spec, dict) else None
    configs = devices.get("config") if isinstance(devices, dict) else None
    if not isinstance(configs, list):
        return [], []
    problems: list[Refusal] = []
    checked: list[str] = []
    for index, config in enumerate(configs):
        opaque = config.get("opaque") if isinstance(config, dict) else None
        if not isinstance(opaque, dict):
            continue
        driver = opaque.get("driver")
        checker = checkers.get(driver) if isinstance(driver, str) else None
        if checker is None:
            continue
        checked.append(str(driver))
        at = f"{where}.devices.config[{index}].opaque.parameters"
        parameters = opaque.get("parameters", {})
        if not isinstance(parameters, dict):
            problems.append(Refusal(str(driver), checker.name, (f"{at}: must be an object",)))
            continue
        try:
            checker.claim_config(parameters, at)
        except ClaimConfigRefused as exc:
            problems.append(Refusal(str(driver), checker.name, exc.problems))
        except Exception as exc:  # a model validator that raises something pydantic does not wrap
            problems.append(
                Refusal(str(driver), checker.name, (f"{at}: the model raised {type(exc).__name__}: {exc}",))
            )
    return problems, checked


def decide(request: Request, checkers: Mapping[str, ConfigChecker]) -> Decision:
    """Allow or refuse one request; anything but a ResourceClaim(Template) of resource.k8s.io passes.

    An UPDATE that leaves the spec as it was is allowed without a check: a claim made before the
    webhook ran, or before a backend's model changed, can still lose its finalizers and go.
    """
    if (
        request.group != GROUP
        or request.kind not in SPEC_PATHS
        or request.operation not in ("CREATE", "UPDATE")
    ):
        return Decision(allowed=True)
    spec, where = _claim_spec(request.object, request.kind)
    if request.operation == "UPDATE" and request.old_object is not None:
        old_spec, _ = _claim_spec(request.old_object, request.kind)
        if old_spec == spec:
            return Decision(allowed=True)
    refusals, checked = config_problems(spec, where, checkers)
    return Decision(allowed=not refusals, refusals=tuple(refusals), checked=tuple(checked))


def response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answering request ``uid``."""
    answer: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        answer["status"] = {
            "code": DENIED_CODE,
            "reason": "Invalid",
            "message": f"claim configuration refused: {decision.message}",
        }
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}
