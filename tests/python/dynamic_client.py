"""The Python Kubernetes client (PyPI `kubernetes`) against a kubeconfig: its DynamicClient,
which resolves a kind through legacy discovery (/api, /apis, /apis/<group>/<version>), creates
the object of a manifest, lists its kind (in its namespace, if it has one) and gets it.

    python dynamic_client.py KUBECONFIG DISCOVERY_CACHE_FILE MANIFEST.json

Prints one JSON object: the client's version, the names listed, and the object got (name, kind,
and the simulated apiserver's `skewgate.test/served-by` annotation, null on a real one). Exits 3
when discovery does not know the kind (what an apiserver that does not serve it answers alone),
1 on any other error.
"""

import json
import sys

import kubernetes
from kubernetes import config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError


def main(kubeconfig: str, cache_file: str, manifest_file: str) -> int:
    with open(manifest_file, encoding="utf-8") as f:
        manifest = json.load(f)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace")
    api = config.new_client_from_config(config_file=kubeconfig)
    client = DynamicClient(api, cache_file=cache_file)
    try:
        kind = client.resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
    except ResourceNotFoundError as e:
        print(f"ResourceNotFoundError: {e}", file=sys.stderr)
        return 3
    kind.create(namespace=namespace, body=manifest)
    listed = kind.get(namespace=namespace)
    got = kind.get(namespace=namespace, name=name).to_dict()
    annotations = got["metadata"].get("annotations") or {}
    print(
        json.dumps(
            {
                "client_version": kubernetes.__version__,
                "listed": [item.metadata.name for item in listed.items],
                "got": {
                    "name": got["metadata"]["name"],
                    "kind": got["kind"],
                    "served_by": annotations.get("skewgate.test/served-by"),
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
