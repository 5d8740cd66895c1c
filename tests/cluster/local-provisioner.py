#!/usr/bin/env python3
"""Dynamic provisioner of `local` PersistentVolumes for the real node (test infrastructure).

For every claim of the StorageClass (WaitForFirstConsumer) that the scheduler placed on our node, it
creates a directory and a `local` PV bound to that claim; for every PV of ours that is Released, it
removes the directory and the PV. `local` volumes, unlike hostPath, get the pod's fsGroup applied by the
kubelet, so a non-root PostgreSQL can write to them; and since volumes are made on demand and deleted after
use, a long test run never exhausts a pool.

Claims of the --sized-storage-class get a volume of exactly their requested size instead: an ext4 file
system in a sparse file beside the directory, loop-mounted on it, so that a test can fill a volume (the
host's own file system has hundreds of gigabytes free). Reclaiming unmounts it and removes the file.
Claims of the --growable-storage-class get the same in XFS, and are resized as a CSI driver's resizer
and node plugin would: a bound claim asking for more than its volume has gets its file and file
system grown online (losetup -c, xfs_growfs), then the PV's capacity and the claim's status.capacity
say the new size. (ext4's online resize needs CAP_SYS_RESOURCE, which root may lack in a sandbox.)

It polls the API once a second (two LISTs) with the admin certificate; it runs as a host process started
by real-node.sh and stops with SIGTERM.
"""

import argparse
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

PROVISIONER = "dbservice.dev/real-node-local"
MERGE = "application/merge-patch+json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--certificate", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--directory", required=True, help="where volume directories are made")
    parser.add_argument("--node", required=True)
    parser.add_argument("--storage-class", required=True)
    parser.add_argument("--sized-storage-class", help="claims of this class get a loop-mounted file system of their size")
    parser.add_argument("--growable-storage-class", help="the same in XFS, grown online when the claim grows")
    parser.add_argument("--interval", type=float, default=1.0)
    arguments = parser.parse_args()

    context = ssl.create_default_context(cafile=arguments.ca)
    context.load_cert_chain(arguments.certificate, arguments.key)
    api = Api(arguments.server, context)
    directory = os.path.realpath(arguments.directory)
    os.makedirs(directory, exist_ok=True)
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    log(f"serving StorageClass {arguments.storage_class} on node {arguments.node} in {directory}")
    while running[0]:
        try:
            provision(api, arguments, directory)
            reclaim(api, directory)
            if arguments.growable_storage_class:
                expand(api, arguments.growable_storage_class, directory)
        except (urllib.error.URLError, OSError, ValueError, subprocess.SubprocessError) as error:
            log(f"pass failed (retrying): {error}")
        time.sleep(arguments.interval)
    return 0


class Api:
    def __init__(self, server: str, context: ssl.SSLContext):
        self.server = server.rstrip("/")
        self.context = context

    def request(self, method: str, path: str, body=None, content_type: str = "application/json"):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
            return json.loads(response.read() or b"{}")


def provision(api: Api, arguments, directory: str) -> None:
    claims = api.request("GET", "/api/v1/persistentvolumeclaims")["items"]
    for claim in claims:
        spec, metadata = claim["spec"], claim["metadata"]
        annotations = metadata.get("annotations") or {}
        storage_class = spec.get("storageClassName")
        classes = (arguments.storage_class, arguments.sized_storage_class, arguments.growable_storage_class)
        if storage_class not in classes or spec.get("volumeName"):
            continue
        if annotations.get("volume.kubernetes.io/selected-node") != arguments.node:
            continue
        if metadata.get("deletionTimestamp"):
            continue
        name = "pvc-" + metadata["uid"]
        path = os.path.join(directory, name)
        os.makedirs(path, mode=0o755, exist_ok=True)
        size = spec["resources"]["requests"]["storage"]
        if storage_class == arguments.sized_storage_class and not os.path.ismount(path):
            make_sized_file_system(path, quantity_bytes(size), "ext4")
        if storage_class == arguments.growable_storage_class and not os.path.ismount(path):
            make_sized_file_system(path, quantity_bytes(size), "xfs")
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": storage_class,
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "claimRef": {"namespace": metadata["namespace"], "name": metadata["name"], "uid": metadata["uid"]},
                "local": {"path": path},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [arguments.node]}]}]}},
            },
        }
        try:
            api.request("POST", "/api/v1/persistentvolumes", volume)
            log(f"provisioned {name} ({size}) for {metadata['namespace']}/{metadata['name']}")
        except urllib.error.HTTPError as error:
            if error.code != 409:  # already made in an earlier pass: the PV controller binds it
                raise


def reclaim(api: Api, directory: str) -> None:
    volumes = api.request("GET", "/api/v1/persistentvolumes")["items"]
    for volume in volumes:
        metadata = volume["metadata"]
        if (metadata.get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
            continue
        if volume.get("status", {}).get("phase") not in ("Released", "Failed"):
            continue
        path = os.path.realpath(volume["spec"].get("local", {}).get("path", ""))
        # Only ever a volume of this provisioner's node (each real node runs one): another node's
        # directory is that node's provisioner's to remove.
        if os.path.dirname(path) != directory:
            continue
        if re.fullmatch(r"pvc-[0-9a-f-]+", os.path.basename(path)):
            if os.path.ismount(path):
                subprocess.run(["umount", path], check=True, timeout=60)
            shutil.rmtree(path, ignore_errors=True)
            if os.path.exists(path + ".img"):
                os.remove(path + ".img")
        try:
            api.request("DELETE", "/api/v1/persistentvolumes/" + metadata["name"])
            log(f"deleted {metadata['name']}")
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise


def expand(api: Api, storage_class: str, directory: str) -> None:
    """Grows the sized volumes whose bound claims ask for more than they have."""
    volumes = {
        volume["metadata"]["name"]: volume
        for volume in api.request("GET", "/api/v1/persistentvolumes")["items"]
        if volume["spec"].get("storageClassName") == storage_class
    }
    for claim in api.request("GET", "/api/v1/persistentvolumeclaims")["items"]:
        spec, metadata = claim["spec"], claim["metadata"]
        volume = volumes.get(spec.get("volumeName") or "")
        if volume is None or spec.get("storageClassName") != storage_class:
            continue
        wanted = spec["resources"]["requests"]["storage"]
        path = os.path.realpath(volume["spec"].get("local", {}).get("path", ""))
        if os.path.dirname(path) != directory or not os.path.ismount(path):
            continue
        had = quantity_bytes(volume["spec"]["capacity"]["storage"])
        if quantity_bytes(wanted) > had:
            grow_sized_file_system(path, quantity_bytes(wanted))
            patch = {"spec": {"capacity": {"storage": wanted}}}
            api.request("PATCH", "/api/v1/persistentvolumes/" + volume["metadata"]["name"], patch, MERGE)
            log(f"grew {volume['metadata']['name']} to {wanted}")
        capacity = (claim.get("status") or {}).get("capacity", {}).get("storage", "0")
        if quantity_bytes(capacity) < quantity_bytes(wanted):
            claim_path = f"/api/v1/namespaces/{metadata['namespace']}/persistentvolumeclaims/{metadata['name']}/status"
            api.request("PATCH", claim_path, {"status": {"capacity": {"storage": wanted}}}, MERGE)
            log(f"claim {metadata['namespace']}/{metadata['name']} now has {wanted}")


def grow_sized_file_system(path: str, size: int) -> None:
    """Grows PATH.img to `size` bytes and the mounted XFS file system in it, online."""
    with open(path + ".img", "r+b") as file:
        file.truncate(size)
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", path], check=True, timeout=30,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["losetup", "-c", device], check=True, timeout=60)
    subprocess.run(["xfs_growfs", path], check=True, timeout=300, capture_output=True)


def make_sized_file_system(path: str, size: int, kind: str) -> None:
    """A file system of `size` bytes (ext4 with no blocks reserved for root: PostgreSQL is not
    root; or XFS) in the sparse file PATH.img, loop-mounted on PATH."""
    image = path + ".img"
    with open(image, "wb") as file:
        file.truncate(size)
    make = ["mkfs.ext4", "-q", "-F", "-m", "0", image] if kind == "ext4" else ["mkfs.xfs", "-q", "-f", image]
    subprocess.run(make, check=True, timeout=120)
    subprocess.run(["mount", "-o", "loop", image, path], check=True, timeout=60)
    os.chmod(path, 0o755)


def quantity_bytes(quantity: str) -> int:
    """Bytes of a Kubernetes quantity such as 1Gi, 512Mi or 1G."""
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in suffixes.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(float(quantity))


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S ") + message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
