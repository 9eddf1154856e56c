"""Assembles the load-control image from built binaries: the binaries, the libraries `ldd` says
they need (and the loader), CA certificates, a default config and a non-root user."""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docker_archive  # noqa: E402

DEFAULT_CONFIG = b"""# Default configuration of the load-control image (CONTRACT section 10). The Helm chart mounts its
# own file over this one; without it, DATABASE_URL and LCA_<SECTION>__<KEY> variables configure
# the binaries (e.g. the migration hook needs only DATABASE_URL).
logging:
  format: json
"""

p = argparse.ArgumentParser()
p.add_argument("--tag", required=True)
p.add_argument("--out", required=True)
p.add_argument("--bin", action="append", required=True)
a = p.parse_args()

layer = docker_archive.Layer()
libs = set()
for b in a.bin:
    layer.add_file("usr/local/bin/" + os.path.basename(b), b, 0o755)
    for line in subprocess.run(["ldd", b], capture_output=True, text=True, check=True).stdout.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.add(m.group(1))
for lib in sorted(libs):
    layer.add_file(lib, os.path.realpath(lib), 0o755)
layer.add_file("etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt", 0o644)
layer.add_bytes("etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
layer.add_bytes("etc/group", b"root:x:0:\nnonroot:x:65532:\n")
layer.add_bytes("etc/nsswitch.conf", b"hosts: files dns\n")
layer.add_bytes("etc/load-control/config.yaml", DEFAULT_CONFIG)
layer.add_dir("tmp", 0o1777)
layer.add_dir("home/nonroot", 0o755)
version = a.tag.rsplit(":", 1)[1]
image_id, size = docker_archive.write(
    a.out,
    a.tag,
    layer,
    cmd=["load-control-api", "--help"],
    user="65532:65532",
    env=["PATH=/usr/local/bin:/usr/bin:/bin", "LCA_CONFIG=/etc/load-control/config.yaml",
         "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
    labels={"org.opencontainers.image.title": "load-control",
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": "Apache-2.0"},
)
print(f"image: {a.tag} ({image_id[:12]}), layer {size / 1e6:.1f} MB, archive {a.out}")
