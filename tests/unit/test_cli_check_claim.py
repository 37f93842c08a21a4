"""``devicehost check-claim``'s file check (``host/cli/cmd_check_claim.py``) in process: the
claims and templates of a manifest file, each ``opaque`` configuration for a loaded backend's
driver checked by its model, one line per refusal; an unreadable file is a usage error."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import yaml
from drafakes import ModelRecorder
from pydantic import BaseModel, ConfigDict

from devicehost.host.backends.backend import Backend
from devicehost.host.cli import EXIT_USAGE
from devicehost.host.cli.cmd_check_claim import check_file, claims
from devicehost.host.cli.common import CommandFailed

DRIVER = "widget.example.com"


class WidgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["fast", "slow"]


def claim(name: str, parameters: dict[str, object], template: bool = False) -> dict[str, object]:
    spec = {"devices": {"config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}]}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate" if template else "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"spec": spec} if template else spec,
    }


def test_each_refused_configuration_of_a_file_is_one_line(tmp_path: Path) -> None:
    manifests = tmp_path / "claims.yaml"
    listed = {"apiVersion": "v1", "kind": "List", "items": [claim("listed", {"mode": "slow"})]}
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    documents = [
        claim("good", {"mode": "fast"}),
        claim("bad", {"mode": "warp"}, template=True),
        {"apiVersion": "v1", "kind": "Pod"},
        slice_,
        listed,
    ]
    manifests.write_text(yaml.safe_dump_all(documents))
    assert [what for what, _ in claims(manifests)] == [
        "ResourceClaim default/good",
        "ResourceClaimTemplate default/bad",
        "ResourceSlice default/s",  # of the API group, but no claim spec: not counted below
        "ResourceClaim default/listed",
    ]
    backend = Backend("widgets", ModelRecorder(config_model=WidgetConfig), hook_timeout=5.0)
    try:
        lines, count = check_file(manifests, {DRIVER: backend})
    finally:
        backend.close()
    assert count == 3
    (line,) = lines
    assert line.startswith(f"{manifests}: ResourceClaimTemplate default/bad: driver {DRIVER}")
    assert "spec.spec.devices.config[0].opaque.parameters.mode" in line


def test_a_file_that_cannot_be_parsed_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    with pytest.raises(CommandFailed, match=f"^{broken}: cannot read: ") as raised:
        list(claims(broken))
    assert raised.value.exit_code == EXIT_USAGE
