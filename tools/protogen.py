"""Regenerate the committed protobuf/gRPC code, or check it for drift.

Run through tox (``tox -e proto`` regenerates, ``tox -e proto-check`` fails on drift) so the
generator is always the pinned grpcio-tools: its version sets the ``protobuf``/``grpcio``
floors in setup.cfg.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PROTO_ROOT = SRC / "devicehost" / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    """Every .proto file under the proto package, relative to ``src``."""
    return sorted(p.relative_to(SRC) for p in PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    """Run protoc with the grpc and mypy plugins, writing into ``out_dir``."""
    scripts = Path(sysconfig.get_path("scripts"))
    for proto in proto_files():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{SRC}",
                f"--python_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                f"--mypy_out={out_dir}",
                f"--mypy_grpc_out={out_dir}",
                f"--plugin=protoc-gen-mypy={scripts / 'protoc-gen-mypy'}",
                f"--plugin=protoc-gen-mypy_grpc={scripts / 'protoc-gen-mypy_grpc'}",
                str(proto),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )


def generated_files(root: Path) -> set[Path]:
    """Generated files under ``root``, relative to it."""
    return {p.relative_to(root) for p in root.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_files(out)
        if args.check:
            committed = generated_files(SRC)
            drift = sorted(str(p) for p in fresh ^ committed) + sorted(
                str(p) for p in fresh & committed if not filecmp.cmp(out / p, SRC / p, shallow=False)
            )
            if drift:
                print("generated code drifted from the .proto files; run `tox -e proto`:", file=sys.stderr)
                for name in drift:
                    print(f"  {name}", file=sys.stderr)
                return 1
            print(f"{len(fresh)} generated files match their .proto sources")
            return 0
        for rel in sorted(fresh):
            shutil.copyfile(out / rel, SRC / rel)
            print(f"wrote src/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
