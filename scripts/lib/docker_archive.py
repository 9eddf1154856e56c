"""Writes a docker-archive (the `docker save` format) by hand: no daemon, no registry.

One reproducible layer (sorted, numeric owner, mtime 0), a config whose rootfs.diff_ids holds the
layer's sha256, and a manifest.json naming the tag. `ctr images import` and `docker load` read it.
"""
import hashlib
import io
import json
import os
import tarfile


class Layer:
    """The files of one layer: path inside the image -> (bytes, mode), plus directories."""

    def __init__(self):
        self.files = {}
        self.dirs = {}
        self.links = {}

    def _parents(self, path):
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.dirs.setdefault("/".join(parts[:i]), 0o755)

    def add_bytes(self, path, data, mode=0o644):
        self._parents(path)
        self.files[path.strip("/")] = (data, mode)

    def add_file(self, path, src, mode=None):
        with open(src, "rb") as f:
            data = f.read()
        self.add_bytes(path, data, mode if mode is not None else (os.stat(src).st_mode & 0o777))

    def add_dir(self, path, mode=0o755):
        self._parents(path + "/x")
        self.dirs[path.strip("/")] = mode

    def add_symlink(self, path, target):
        self._parents(path)
        self.links[path.strip("/")] = target

    def tar_bytes(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            entries = [(p, "d") for p in self.dirs] + [(p, "f") for p in self.files] + [
                (p, "l") for p in self.links
            ]
            for path, kind in sorted(entries):
                info = tarfile.TarInfo(path)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if kind == "d":
                    info.type = tarfile.DIRTYPE
                    info.mode = self.dirs[path]
                    tar.addfile(info)
                elif kind == "l":
                    info.type = tarfile.SYMTYPE
                    info.linkname = self.links[path]
                    info.mode = 0o777
                    tar.addfile(info)
                else:
                    data, mode = self.files[path]
                    info.size = len(data)
                    info.mode = mode
                    tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()


def write(out_path, tag, layer, entrypoint=None, cmd=None, user=None, env=None, workdir="/",
          labels=None):
    """Writes the archive; returns (image id, uncompressed layer size in bytes)."""
    layer_tar = layer.tar_bytes()
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": env or ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "WorkingDir": workdir,
            "Labels": labels or {},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/lib/docker_archive.py"}],
    }
    if entrypoint:
        config["config"]["Entrypoint"] = entrypoint
    if cmd:
        config["config"]["Cmd"] = cmd
    if user:
        config["config"]["User"] = user
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        for name, data in (
            (config_name, config_bytes),
            (layer_name, layer_tar),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out_path)
    return config_name[:-5], len(layer_tar)
