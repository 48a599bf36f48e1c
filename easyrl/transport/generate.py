"""Generates the protobuf and gRPC modules from easyrl.proto.

Run `python -m easyrl.transport.generate` after editing the .proto; the
generated files are committed and `tests/test_codec.py` fails when they
are stale. `generate(out_dir)` is what that test calls. easyrl_pb2.pyi gives
type checkers (pyright) the message classes, which easyrl_pb2.py builds at
import time from the serialized descriptor.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "easyrl.proto"
GENERATED = ("easyrl_pb2.py", "easyrl_pb2.pyi", "easyrl_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Writes easyrl_pb2.py, easyrl_pb2.pyi and easyrl_pb2_grpc.py for easyrl.proto into `out_dir`.

    Raises:
        RuntimeError: protoc failed.
    """
    from grpc_tools import protoc

    code = protoc.main(
        [
            "protoc",
            f"-I{HERE}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(HERE / PROTO),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    # protoc emits an absolute import of the sibling module; make it package-relative.
    grpc_file = Path(out_dir) / "easyrl_pb2_grpc.py"
    text = grpc_file.read_text()
    grpc_file.write_text(text.replace("import easyrl_pb2 as", "from . import easyrl_pb2 as"))


if __name__ == "__main__":
    generate(HERE)
    sys.stdout.write("generated " + ", ".join(GENERATED) + "\n")
