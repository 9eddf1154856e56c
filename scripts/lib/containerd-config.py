"""Rewrites `containerd config default` (stdin) for the node: only the keys NODE.md names change.

Our own root, state and socket; restrict_oom_score_adj (root lacks CAP_SYS_RESOURCE, so runc
cannot set the sandbox's -998 and every sandbox would fail); the pause image we import; the CNI
plugin and config directories; runc's state root; the `opt` plugin's path (kept off the host).
"""
import argparse
import re
import sys

p = argparse.ArgumentParser()
for flag in ("root", "state", "socket", "opt", "cni-conf", "runc-root", "sandbox-image"):
    p.add_argument("--" + flag, required=True)
a = p.parse_args()

section = ""
out = []
for line in sys.stdin.read().splitlines():
    m = re.match(r"\s*\[(.+)\]\s*$", line)
    if m:
        section = m.group(1)
    key = line.split("=", 1)[0].strip() if "=" in line else None
    indent = line[: len(line) - len(line.lstrip())]

    def put(value):
        out.append(f'{indent}{key} = {value}')

    if section == "" and key == "root":
        put(f'"{a.root}"')
    elif section == "" and key == "state":
        put(f'"{a.state}"')
    elif section == "grpc" and key == "address":
        put(f'"{a.socket}"')
    elif section == 'plugins."io.containerd.grpc.v1.cri"' and key == "restrict_oom_score_adj":
        put("true")
    elif section == 'plugins."io.containerd.grpc.v1.cri"' and key == "sandbox_image":
        put(f'"{a.sandbox_image}"')
    elif section == 'plugins."io.containerd.grpc.v1.cri".cni' and key == "bin_dir":
        put('"/usr/lib/cni"')
    elif section == 'plugins."io.containerd.grpc.v1.cri".cni' and key == "conf_dir":
        put(f'"{a.cni_conf}"')
    elif section.endswith("runtimes.runc.options") and key == "Root":
        put(f'"{a.runc_root}"')
    elif section == 'plugins."io.containerd.internal.v1.opt"' and key == "path":
        put(f'"{a.opt}"')
    else:
        out.append(line)
print("\n".join(out))
