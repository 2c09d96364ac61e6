"""The Python Kubernetes client (PyPI `kubernetes`) against a kubeconfig: its DynamicClient,
which resolves a kind through legacy discovery (/api, /apis, /apis/<group>/<version>), creates,
lists and gets a resource.k8s.io/v1beta2 ResourceClaim in `default`.

    python dynamic_client.py KUBECONFIG DISCOVERY_CACHE_FILE NAME

Prints one JSON object: the client's version, the names listed, and the object got (name and
the simulated apiserver's `skewgate.test/served-by` annotation). Exits 3 when discovery does not
know the kind (what a 1.30 apiserver alone answers), 1 on any other error.
"""

import json
import sys

import kubernetes
from kubernetes import config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

API_VERSION = "resource.k8s.io/v1beta2"
KIND = "ResourceClaim"


def main(kubeconfig: str, cache_file: str, name: str) -> int:
    api = config.new_client_from_config(config_file=kubeconfig)
    client = DynamicClient(api, cache_file=cache_file)
    try:
        claims = client.resources.get(api_version=API_VERSION, kind=KIND)
    except ResourceNotFoundError as e:
        print(f"ResourceNotFoundError: {e}", file=sys.stderr)
        return 3
    claims.create(
        namespace="default",
        body={
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
                    ]
                }
            },
        },
    )
    listed = claims.get(namespace="default")
    got = claims.get(namespace="default", name=name).to_dict()
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
