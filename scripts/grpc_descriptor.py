"""Compile src/inference_server/grpc/inference.proto into src/inference_server/grpc/_descriptor.py (its
FileDescriptorProto, serialised), which the server loads into a descriptor pool of its own.

Run after changing the .proto: ``.venv/bin/python scripts/grpc_descriptor.py`` (needs ``grpcio-tools``, in the test
extra); ``tests/test_grpc.py`` checks the committed file is current.
"""

from __future__ import annotations

import base64
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "src" / "inference_server" / "grpc" / "inference.proto"
TARGET = PROTO.parent / "_descriptor.py"


def descriptor() -> bytes:
    """The current .proto's FileDescriptorProto, serialised."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "set.pb"
        status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--descriptor_set_out={out}", PROTO.name])
        if status != 0:
            raise SystemExit(f"protoc failed on {PROTO} ({status})")
        (file,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return file.SerializeToString(deterministic=True)  # type: ignore[no-any-return]


def compiled() -> str:
    """The text of ``_descriptor.py`` for the current .proto (as ``ruff format`` leaves it)."""
    text = base64.b64encode(descriptor()).decode()
    lines = "\n".join(f'    "{text[start : start + 100]}"' for start in range(0, len(text), 100))
    return (
        f'"""{PROTO.name} compiled: its FileDescriptorProto, serialised (made by scripts/grpc_descriptor.py; do not '
        'edit)."""\n\n'
        "import base64\n\n"
        f"FILE = base64.b64decode(\n{lines}\n)\n"
    )


def main() -> int:
    TARGET.write_text(compiled())
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
