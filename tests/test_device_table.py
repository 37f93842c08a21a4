"""The device table's wire message stays exactly what a full rebuild gives, however it was reached."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from devicehost import Device, Health
from devicehost.host.serving import wire
from devicehost.host.serving.table import DeviceTable

ids = st.lists(st.text("abcdef0123", min_size=1, max_size=4), min_size=1, max_size=30, unique=True)
healths = st.sampled_from(list(Health))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), device_ids=ids)
def test_patched_messages_equal_a_full_rebuild(data: st.DataObject, device_ids: list[str]) -> None:
    table = DeviceTable([Device(i, numa_nodes=(n % 2,)) for n, i in enumerate(device_ids)])
    for _ in range(data.draw(st.integers(1, 8))):
        table.message()  # built (as after a send), so the next health change patches it
        if data.draw(st.booleans()):
            update = data.draw(
                st.dictionaries(st.sampled_from([*device_ids, "unknown"]), healths, max_size=5)
            )
            version = table.version
            changed = table.set_health(update)
            assert changed == (table.version == version + 1)
        else:
            table.replace([d for d in table.devices if data.draw(st.booleans())] or list(table.devices))
        assert table.message() == wire.device_list(table.devices)


def test_set_held_replaces_a_holders_devices_in_one_change() -> None:
    table = DeviceTable([Device(f"w{n}") for n in range(3)])
    table.set_held("allocation default/a", "dra", ["w0", "w1"])
    version = table.version
    table.set_held("allocation default/a", "dra", ["w1", "w2"])  # w0 let go, w2 taken: one signal
    assert (table.version, table.inventory.of("allocation default/a")) == (version + 1, {"w1", "w2"})
    table.set_held("allocation default/a", "dra", [])
    assert table.inventory.held("dra") == frozenset()
    assert {d.id for d in table.advertised() if d.health is Health.UNHEALTHY} == set()
