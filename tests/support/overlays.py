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
