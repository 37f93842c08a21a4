"""``devicehost check-claim``: the webhook's check of claim configuration, offline, on files."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from devicehost.host.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE

ROOT = Path(__file__).resolve().parent.parent
GPU = "gpu.example.com"
VALID = {"apiVersion": "gpu.resource.example.com/v1alpha1", "kind": "GpuConfig"}
FOREVER = {**VALID, "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}}


def claim(
    name: str, parameters: dict[str, object], driver: str = GPU, template: bool = False
) -> dict[str, object]:
    """A ResourceClaim (or a template of one) asking one gpu, with ``parameters`` for ``driver``."""
    spec = {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}],
        }
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate" if template else "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"spec": spec} if template else spec,
    }


def check(*args: str, cwd: Path = ROOT) -> tuple[int, list[str], str]:
    """``devicehost check-claim ARGS`` in a child, the dra-example backend alone enabled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEHOST_")}
    result = subprocess.run(
        [sys.executable, "-m", "devicehost", "check-claim", "--backend", "dra-example", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout.splitlines(), result.stderr


def test_each_refused_configuration_is_one_line_and_the_exit_status_is_1(tmp_path: Path) -> None:
    manifests = tmp_path / "claims.yaml"
    documents = [
        claim("good", VALID),
        claim("forever", FOREVER),
        claim("tpl", {"kind": "Nope"}, template=True),
    ]
    listed = {"apiVersion": "v1", "kind": "List", "items": [claim("listed", FOREVER)]}
    manifests.write_text(yaml.safe_dump_all([*documents, {"apiVersion": "v1", "kind": "Pod"}, listed]))
    code, lines, _ = check(str(manifests))
    assert code == EXIT_FAILED
    assert len(lines) == 3, lines
    assert lines[2].startswith(f"{manifests}: ResourceClaim team-a/listed: driver {GPU}")
    assert lines[0].startswith(
        f"{manifests}: ResourceClaim team-a/forever: driver {GPU} (devicehost backend dra-example):"
        " spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval: Input should be"
    )
    assert lines[1].startswith(f"{manifests}: ResourceClaimTemplate team-a/tpl: driver {GPU}")
    assert "spec.spec.devices.config[0].opaque.parameters." in lines[1]


def test_a_driver_named_for_a_backend_is_checked_and_others_pass_untouched(tmp_path: Path) -> None:
    manifests = tmp_path / "claims.yaml"
    other = "gpu.other.example"
    manifests.write_text(
        yaml.safe_dump_all([claim("a", FOREVER, other), claim("b", FOREVER, "nobody.example")])
    )
    code, lines, _ = check(str(manifests))
    assert (code, lines[-1]) == (
        EXIT_OK,
        f"{manifests}: 2 claims checked, valid (drivers checked: {GPU} (dra-example))",
    )
    code, lines, _ = check("--driver", f"dra-example={other}", str(manifests))
    assert code == EXIT_FAILED
    assert [line.split(":")[1] for line in lines] == [" ResourceClaim team-a/a"]


def test_a_file_that_cannot_be_read_is_one_line_and_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    code, lines, err = check(str(broken))
    assert (code, lines) == (EXIT_USAGE, [])
    assert err.startswith(f"devicehost: {broken}: cannot read: ")
    assert len(err.splitlines()) == 1


def test_the_command_docs_dra_gives_runs_as_written() -> None:
    said = re.search(
        r"^devicehost check-claim ([^#\n]+?)\s+# (.*)$", (ROOT / "docs" / "dra.md").read_text(), re.MULTILINE
    )
    assert said is not None
    code, lines, err = check(*shlex.split(said[1]))
    assert code == EXIT_OK, err
    assert lines[-1].startswith(said[2].removesuffix("(...)")), lines
