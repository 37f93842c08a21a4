"""The pure part of ``devicehost webhook``: an AdmissionReview in, the decision and the answer out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict

from devicehost.host.backends.backend import ClaimConfigRefused, validated
from devicehost.host.webhook.review import (
    Malformed,
    Request,
    config_problems,
    decide,
    parse_review,
    response,
)


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval: Literal["Short", "Long"] = "Short"


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["GpuConfig"]
    sharing: Sharing = Sharing()


class Checker:
    """What a loaded Backend does in claim_config, with a model of its own."""

    def __init__(self, name: str, model: type[BaseModel] | None = Config) -> None:
        self.name = name
        self.model = model
        self.seen: list[tuple[Mapping[str, Any], str]] = []

    def claim_config(self, parameters: Mapping[str, Any], where: str) -> object:
        self.seen.append((parameters, where))
        if self.model is None:
            return parameters
        value, problems = validated(self.model, parameters, (where,))
        if problems or value is None:
            raise ClaimConfigRefused(self.name, problems)
        return value


class Exploding(Checker):
    def claim_config(self, parameters: Mapping[str, Any], where: str) -> object:
        raise RuntimeError("boom")


GPU = "gpu.example.com"
BAD = {"kind": "GpuConfig", "sharing": {"interval": "Forever"}}


def checkers(**more: Checker) -> dict[str, Checker]:
    return {GPU: Checker("dra-example"), **more}


def spec(*configs: dict[str, Any]) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}],
            "config": list(configs),
        }
    }


def opaque(parameters: Any, driver: str = GPU) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}


def request(
    obj: dict[str, Any] | None,
    kind: str = "ResourceClaim",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    group: str = "resource.k8s.io",
) -> Request:
    return Request("u", group, "v1", kind, operation, "c", "default", obj, old)


# --- parse_review ----------------------------------------------------------------------------


def review(**request_fields: Any) -> bytes:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc",
            "kind": {"group": "resource.k8s.io", "version": "v1beta1", "kind": "ResourceClaimTemplate"},
            "operation": "UPDATE",
            "name": "t",
            "namespace": "ns",
            "object": {"spec": {}},
            "oldObject": None,
            **request_fields,
        },
    }
    return json.dumps(body).encode()


def test_a_review_is_read_into_a_request() -> None:
    parsed = parse_review(review())
    assert parsed == Request(
        "abc", "resource.k8s.io", "v1beta1", "ResourceClaimTemplate", "UPDATE", "t", "ns", {"spec": {}}, None
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{", "not JSON"),
        (b"\xff", "not JSON"),
        (b"[1]", "JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected apiVersion"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "no request"),
        (review(uid=""), "request.uid"),
        (review(uid=7), "request.uid"),
        (review(kind="ResourceClaim"), "request.kind"),
        (review(object=[]), "request.object"),
        (review(oldObject="x"), "request.oldObject"),
    ],
)
def test_malformed_reviews_are_refused_in_one_line(body: bytes, words: str) -> None:
    with pytest.raises(Malformed) as refused:
        parse_review(body)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


# --- decide ----------------------------------------------------------------------------------


def test_a_bad_claim_is_refused_with_the_key_path_the_driver_and_the_backend() -> None:
    decision = decide(request({"spec": spec(opaque(BAD))}), checkers())
    assert not decision.allowed
    assert decision.problems == (
        "spec.devices.config[0].opaque.parameters.sharing.interval: Input should be 'Short' or 'Long' (got 'Forever')",
    )
    assert decision.message.startswith(
        "driver gpu.example.com (devicehost backend dra-example): spec.devices"
    )


def test_a_template_is_checked_at_spec_spec() -> None:
    decision = decide(
        request({"spec": {"spec": spec(opaque({"kind": "TpuConfig"}))}}, "ResourceClaimTemplate"), checkers()
    )
    assert [p.split(":")[0] for p in decision.problems] == [
        "spec.spec.devices.config[0].opaque.parameters.kind"
    ]


def test_good_configuration_is_allowed_and_counted_as_checked() -> None:
    decision = decide(request({"spec": spec(opaque({"kind": "GpuConfig"}))}), checkers())
    assert decision.allowed
    assert decision.checked == (GPU,)


def test_other_drivers_pass_untouched_and_indices_stay_those_of_the_claim() -> None:
    other = Checker("nvidia")
    decision = decide(
        request(
            {
                "spec": spec(
                    opaque({"any": "thing"}, "gpu.nvidia.com"), opaque({"x": 1}, "other.io"), opaque(BAD)
                )
            }
        ),
        checkers(),
    )
    assert [p.split(":")[0] for p in decision.problems] == [
        "spec.devices.config[2].opaque.parameters.sharing.interval"
    ]
    assert other.seen == []


def test_every_refused_entry_is_reported() -> None:
    decision = decide(
        request({"spec": spec(opaque(BAD), opaque({"kind": "GpuConfig", "extra": 1}))}), checkers()
    )
    assert [p.split(":")[0] for p in decision.problems] == [
        "spec.devices.config[0].opaque.parameters.sharing.interval",
        "spec.devices.config[1].opaque.parameters.extra",
    ]
    assert len(decision.refusals) == 2


def test_a_backend_without_a_model_allows_any_parameters() -> None:
    decision = decide(request({"spec": spec(opaque({"any": ["thing"]}))}), {GPU: Checker("free", None)})
    assert decision.allowed


@pytest.mark.parametrize("parameters", [[1, 2], "text", 3])
def test_parameters_that_are_not_an_object_are_refused(parameters: Any) -> None:
    decision = decide(request({"spec": spec(opaque(parameters))}), checkers())
    assert decision.problems == ("spec.devices.config[0].opaque.parameters: must be an object",)


def test_missing_parameters_are_checked_as_an_empty_object() -> None:
    config = {"requests": ["gpu"], "opaque": {"driver": GPU}}
    decision = decide(request({"spec": spec(config)}), checkers())
    assert decision.problems == ("spec.devices.config[0].opaque.parameters.kind: Field required",)


def test_a_model_that_raises_refuses_with_the_exception() -> None:
    decision = decide(request({"spec": spec(opaque({}))}), {GPU: Exploding("odd")})
    assert decision.problems == (
        "spec.devices.config[0].opaque.parameters: the model raised RuntimeError: boom",
    )


@pytest.mark.parametrize(
    "obj",
    [None, {}, {"spec": None}, {"spec": {"devices": None}}, {"spec": {"devices": {"config": None}}},
     {"spec": spec({"requests": ["gpu"]}, {"opaque": None}, "junk")}],
)  # fmt: skip
def test_claims_without_opaque_configuration_are_allowed(obj: dict[str, Any] | None) -> None:
    assert decide(request(obj), checkers()).allowed


def test_an_update_that_keeps_the_spec_is_not_checked_and_one_that_changes_it_is() -> None:
    bad = {"metadata": {"finalizers": []}, "spec": spec(opaque(BAD))}
    assert decide(request(bad, operation="UPDATE", old={"spec": spec(opaque(BAD))}), checkers()).allowed
    changed = request(bad, operation="UPDATE", old={"spec": spec(opaque({"kind": "GpuConfig"}))})
    assert not decide(changed, checkers()).allowed
    assert not decide(request(bad, operation="UPDATE", old=None), checkers()).allowed


@pytest.mark.parametrize(
    "req",
    [
        request({"spec": spec(opaque(BAD))}, operation="DELETE"),
        request({"spec": spec(opaque(BAD))}, kind="DeviceClass"),
        request({"spec": spec(opaque(BAD))}, group="example.com"),
    ],
)
def test_what_the_webhook_does_not_check_is_allowed(req: Request) -> None:
    assert decide(req, checkers()).allowed


def test_config_problems_of_a_bare_spec() -> None:
    refusals, checked = config_problems(spec(opaque(BAD)), "x", checkers())
    assert checked == [GPU]
    assert refusals[0].problems[0].startswith("x.devices.config[0].opaque.parameters.sharing.interval: ")


# --- response --------------------------------------------------------------------------------


def test_an_allowed_answer_echoes_the_uid_and_nothing_else() -> None:
    decision = decide(request({"spec": spec()}), checkers())
    assert response("u-1", decision) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u-1", "allowed": True},
    }


def test_a_refusal_carries_the_message_the_user_sees() -> None:
    decision = decide(request({"spec": spec(opaque(BAD))}), checkers())
    answer = response("u-2", decision)["response"]
    assert answer["uid"] == "u-2"
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert answer["status"]["reason"] == "Invalid"
    assert answer["status"]["message"] == f"claim configuration refused: {decision.message}"
