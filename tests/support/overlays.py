"""A user's own kustomize overlay in a scratch dir: one of deploy/overlays plus components."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def write_own_overlay(scratch: Path, overlay: str, components: Sequence[str], **more: Any) -> None:
    """``scratch/kustomization.yaml`` naming ``overlay`` and ``components`` by relative paths
    (kustomize refuses absolute ones), as a user's overlay with ``components:`` does."""
    (scratch / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, scratch)],
                "components": [os.path.relpath(DEPLOY / "components" / c, scratch) for c in components],
                **more,
            }
        )
    )


CA_PATCH_HEADING = "# in your overlay's kustomization.yaml, instead of kubectl patch"
"""First line of deploy/README.md's block (section 9) that puts the caBundle in an overlay."""


def readme_ca_bundle_patches(ca_bundle: str) -> list[dict[str, Any]]:
    """The ``patches:`` of that README block, as written there, with ``ca_bundle`` where the README
    shows the line ``devicehost webhook-cert`` printed."""
    readme = (DEPLOY / "README.md").read_text()
    start = readme.index(CA_PATCH_HEADING)
    patches: list[dict[str, Any]] = yaml.safe_load(readme[start : readme.index("```", start)])["patches"]
    for patch in patches:
        operations = yaml.safe_load(patch["patch"])
        for operation in operations:
            if operation["path"].endswith("/caBundle"):
                operation["value"] = ca_bundle
        patch["patch"] = yaml.safe_dump(operations)
    return patches
