"""reconcile.plan: one discovery round against what is served, as a pure plan."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devicehost import Device, Resource
from devicehost.hookspecs import rules
from devicehost.host.reconcile import Plan, Refusal, plan

A, B = "alpha", "beta"
WIDGET = "example.com/widget"
GADGET = "example.com/gadget"
GIZMO = "example.com/gizmo"

Discovered = Sequence[tuple[str, Sequence[Resource] | None]]


def res(name: object, *ids: object) -> Resource:
    return Resource(name, tuple(Device(i) for i in ids))  # type: ignore[arg-type]


def devices(*ids: str) -> tuple[Device, ...]:
    return tuple(Device(i) for i in ids)


def domain(length: int) -> str:
    """A valid DNS-1123 subdomain of exactly ``length`` characters, in labels of at most 61."""
    groups, rest = divmod(length, 61)
    if rest == 0:
        groups, rest = groups - 1, 61
    return ("x" * 60 + ".") * groups + "y" * rest


@pytest.mark.parametrize(
    ("discovered", "served", "expected"),
    [
        pytest.param([], {}, Plan(), id="nothing-discovered-nothing-served"),
        pytest.param(
            [(A, [res(WIDGET, "w0", "w1")])],
            {},
            Plan(add=((A, res(WIDGET, "w0", "w1")),)),
            id="new-resource-added",
        ),
        pytest.param([(A, [])], {WIDGET: A}, Plan(withdraw=(WIDGET,)), id="vanished-resource-withdrawn"),
        pytest.param(
            [(A, [res(WIDGET, "w0", "w2")])],
            {WIDGET: A},
            Plan(update=(res(WIDGET, "w0", "w2"),)),
            id="rediscovered-resource-updated-with-new-devices",
        ),
        pytest.param(
            [(A, [res(WIDGET)])],
            {WIDGET: A},
            Plan(update=(res(WIDGET),)),
            id="rediscovered-with-no-devices-is-updated-not-withdrawn",
        ),
        pytest.param(
            [(A, None), (B, [])],
            {WIDGET: A, GADGET: B},
            Plan(withdraw=(GADGET,)),
            id="failed-discovery-keeps-its-resources-other-backend-withdraws",
        ),
        pytest.param(
            [(A, [])],
            {WIDGET: "gone"},
            Plan(withdraw=(WIDGET,)),
            id="resource-of-a-backend-no-longer-discovered-withdrawn",
        ),
        pytest.param(
            [(A, [res(GIZMO, "z0"), res(WIDGET, "w0")]), (B, [res(GADGET, "g0")])],
            {},
            Plan(
                add=(
                    (A, res(GIZMO, "z0")),
                    (A, res(WIDGET, "w0")),
                    (B, res(GADGET, "g0")),
                )
            ),
            id="add-follows-discovery-order",
        ),
        pytest.param(
            [(A, [res(WIDGET, "w0"), res(GADGET, "g0")]), (B, [res(GIZMO, "z0")])],
            {WIDGET: A, GIZMO: B, "example.com/old": B},
            Plan(
                add=((A, res(GADGET, "g0")),),
                withdraw=("example.com/old",),
                update=(res(WIDGET, "w0"), res(GIZMO, "z0")),
            ),
            id="mixed-add-update-withdraw",
        ),
    ],
)
def test_plan(discovered: Discovered, served: Mapping[str, str], expected: Plan) -> None:
    assert plan(discovered, served) == expected


INVALID_NAMES = [
    pytest.param("widget", "exactly one '/'", id="no-slash"),
    pytest.param("example.com/a/b", "exactly one '/'", id="two-slashes"),
    pytest.param("kubernetes.io/widget", "kubernetes.io domain", id="kubernetes-io-domain"),
    pytest.param("gpu.kubernetes.io/widget", "kubernetes.io domain", id="kubernetes-io-subdomain"),
    pytest.param("requests.example.com/widget", "must not start with 'requests.'", id="requests-prefix"),
    pytest.param("Example.com/widget", "not a DNS-1123 subdomain", id="domain-uppercase"),
    pytest.param("/widget", "not a DNS-1123 subdomain", id="domain-empty"),
    pytest.param("-example.com/widget", "not a DNS-1123 subdomain", id="domain-leading-dash"),
    pytest.param("example..com/widget", "not a DNS-1123 subdomain", id="domain-empty-label"),
    pytest.param("example_com/widget", "not a DNS-1123 subdomain", id="domain-underscore"),
    pytest.param(f"{domain(254)}/widget", "the domain is 254 characters", id="domain-254-chars"),
    # The kubelet checks IsQualifiedName("requests." + name): the domain gets 253 - 9 = 244 characters.
    pytest.param(f"{domain(245)}/widget", "the domain is 245 characters", id="domain-245-chars"),
    pytest.param("example.com/", "at most 63 characters", id="name-empty"),
    pytest.param("example.com/" + "w" * 64, "at most 63 characters", id="name-64-chars"),
    pytest.param("example.com/wid get", "at most 63 characters", id="name-space"),
    pytest.param("example.com/-widget", "at most 63 characters", id="name-leading-dash"),
    pytest.param("example.com/widget.", "at most 63 characters", id="name-trailing-dot"),
    pytest.param("example.com/wid@get", "at most 63 characters", id="name-at-sign"),
]


@pytest.mark.parametrize(("name", "rule"), INVALID_NAMES)
def test_an_invalid_resource_name_is_refused_with_the_rule(name: str, rule: str) -> None:
    result = plan([(A, [res(name, "d0"), res(GADGET, "g0")])], {})
    assert result.add == ((A, res(GADGET, "g0")),), "only the valid resource is added"
    assert result.refused == (Refusal(A, name, rules.resource_name_problem(name) or ""),)
    assert rule in result.refused[0].problem
    assert repr(name) in result.refused[0].problem
    assert result.withdraw == result.update == ()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(WIDGET, id="plain"),
        pytest.param("example.com/" + "w" * 63, id="name-63-chars"),
        pytest.param("example.com/Widget_1.a-b", id="name-every-allowed-character"),
        pytest.param("a.b-c.example.com/w", id="dotted-domain"),
        pytest.param("x/y", id="one-letter-parts"),
        pytest.param(f"{domain(244)}/widget", id="domain-244-chars"),
    ],
)
def test_a_valid_resource_name_is_added(name: str) -> None:
    assert plan([(A, [res(name, "d0")])], {}) == Plan(add=((A, res(name, "d0")),))


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        pytest.param(42, "42", id="int"),
        pytest.param(None, "None", id="none"),
        pytest.param(b"example.com/widget", "b'example.com/widget'", id="bytes"),
        pytest.param(["example.com/widget"], "['example.com/widget']", id="list"),
    ],
)
def test_a_name_that_is_not_a_string_is_refused(name: object, shown: str) -> None:
    result = plan([(A, [res(name, "d0"), res(GADGET, "g0")])], {})
    assert result == Plan(add=((A, res(GADGET, "g0")),), refused=(Refusal(A, shown, "name is not a string"),))


@pytest.mark.parametrize(
    ("ids", "rule"),
    [
        pytest.param(("",), "must be a non-empty string", id="empty-id"),
        pytest.param((7,), "must be a non-empty string", id="int-id"),
        pytest.param((None,), "must be a non-empty string", id="none-id"),
        pytest.param(("d0", "d1", "d0"), "appears more than once", id="duplicate-id"),
        pytest.param(("d0", "x" * 64), "is 64 characters, more than 63", id="64-char-id"),
    ],
)
def test_invalid_device_ids_are_refused_with_the_rule(ids: tuple[object, ...], rule: str) -> None:
    result = plan([(A, [res(WIDGET, *ids)])], {})
    expected = rules.device_ids_problem(ids)  # type: ignore[arg-type]
    assert result == Plan(refused=(Refusal(A, WIDGET, expected or ""),))
    assert rule in result.refused[0].problem


def test_a_63_character_device_id_is_accepted() -> None:
    assert plan([(A, [res(WIDGET, "x" * 63)])], {}) == Plan(add=((A, res(WIDGET, "x" * 63)),))


def test_a_long_invalid_name_is_cut_in_the_refusal() -> None:
    name = "n" * 1000
    (refusal,) = plan([(A, [res(name)])], {}).refused
    assert refusal.resource == name[:300]


@pytest.mark.parametrize(
    ("discovered", "served", "expected"),
    [
        pytest.param(
            [(A, [res(WIDGET, "a0")]), (B, [res(WIDGET, "b0")])],
            {},
            Plan(
                add=((A, res(WIDGET, "a0")),),
                refused=(Refusal(B, WIDGET, f"resource {WIDGET!r} is already offered by backend {A!r}"),),
            ),
            id="offered-by-two-backends-first-wins",
        ),
        pytest.param(
            [(A, [res(WIDGET, "a0"), res(WIDGET, "a1")])],
            {},
            Plan(
                add=((A, res(WIDGET, "a0")),),
                refused=(Refusal(A, WIDGET, f"resource {WIDGET!r} is already offered by backend {A!r}"),),
            ),
            id="offered-twice-by-one-backend-first-wins",
        ),
        pytest.param(
            [(A, None), (B, [res(WIDGET, "b0")])],
            {WIDGET: A},
            Plan(refused=(Refusal(B, WIDGET, f"resource {WIDGET!r} is already served for backend {A!r}"),)),
            id="served-for-a-failed-backend-offered-by-another",
        ),
        pytest.param(
            [(B, [res(WIDGET, "b0")]), (A, [res(WIDGET, "a0")])],
            {WIDGET: A},
            Plan(
                update=(res(WIDGET, "a0"),),
                refused=(Refusal(B, WIDGET, f"resource {WIDGET!r} is already served for backend {A!r}"),),
            ),
            id="served-for-a-offered-first-by-b-a-keeps-it",
        ),
        pytest.param(
            [(A, [res(WIDGET, "a0")]), (B, [res(WIDGET, "b0")])],
            {WIDGET: A},
            Plan(
                update=(res(WIDGET, "a0"),),
                refused=(Refusal(B, WIDGET, f"resource {WIDGET!r} is already offered by backend {A!r}"),),
            ),
            id="served-for-a-offered-by-both",
        ),
        pytest.param(
            [(A, []), (B, [res(WIDGET, "b0")])],
            {WIDGET: A},
            Plan(
                withdraw=(WIDGET,),
                refused=(Refusal(B, WIDGET, f"resource {WIDGET!r} is already served for backend {A!r}"),),
            ),
            id="handover-withdraws-first-then-adds-next-round",
        ),
        pytest.param(
            [(A, [res(WIDGET, "w0", "w0")])],
            {WIDGET: A},
            Plan(refused=(Refusal(A, WIDGET, "device ID 'w0' appears more than once"),)),
            id="refused-but-served-by-its-own-backend-is-kept",
        ),
        pytest.param(
            [(A, [res(WIDGET, "w0", "w0")])],
            {WIDGET: B},
            Plan(
                withdraw=(WIDGET,),
                refused=(Refusal(A, WIDGET, "device ID 'w0' appears more than once"),),
            ),
            id="refused-and-served-for-another-backend-is-withdrawn",
        ),
        pytest.param(
            [(A, [res(WIDGET, "w0"), res(WIDGET, "w1")])],
            {WIDGET: A},
            Plan(
                update=(res(WIDGET, "w0"),),
                refused=(Refusal(A, WIDGET, f"resource {WIDGET!r} is already offered by backend {A!r}"),),
            ),
            id="served-and-offered-twice-by-its-backend-updates-with-the-first",
        ),
    ],
)
def test_conflicts(discovered: Discovered, served: Mapping[str, str], expected: Plan) -> None:
    assert plan(discovered, served) == expected


BACKENDS = ["a", "b", "c"]
NAMES = [WIDGET, GADGET, GIZMO]
resources = st.builds(
    Resource,
    st.sampled_from([*NAMES, "bad", "kubernetes.io/x", 42]),
    st.lists(st.builds(Device, st.sampled_from(["d0", "d1", "", "x" * 64])), max_size=3).map(tuple),
)
discoveries = st.lists(
    st.tuples(st.sampled_from(BACKENDS), st.none() | st.lists(resources, max_size=4)),
    unique_by=lambda pair: pair[0],
    max_size=3,
)
served_maps = st.dictionaries(st.sampled_from(NAMES), st.sampled_from([*BACKENDS, "gone"]))


@settings(max_examples=300, deadline=None)
@given(discovered=discoveries, served=served_maps)
def test_plan_properties(discovered: Discovered, served: dict[str, str]) -> None:
    result = plan(discovered, served)
    added = [r.name for _, r in result.add]
    withdrawn = list(result.withdraw)
    updated = [r.name for r in result.update]
    for names in (added, withdrawn, updated):
        assert len(set(names)) == len(names)
    assert not set(added) & set(withdrawn)
    assert not set(added) & set(updated)
    assert not set(withdrawn) & set(updated)
    assert not set(added) & set(served)
    assert set(withdrawn) <= set(served)
    assert set(updated) <= set(served)
    failed = {backend for backend, answer in discovered if answer is None}
    assert not {n for n in withdrawn if served[n] in failed}
    # Every offer is either accepted (added or updated) or refused, never both: a name is both
    # added and refused only when it was offered again after the accepted offer.
    offers = Counter(str(r.name) for _, answer in discovered for r in answer or ())
    refusals = Counter(refusal.resource for refusal in result.refused)
    accepted = Counter(map(str, [*added, *updated]))
    assert offers == refusals + accepted
