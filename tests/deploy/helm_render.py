"""What ``helm template`` adds to an object that the plain manifests do not have, taken off again, so a
chart's default rendering can be compared with ``deploy/kubernetes`` object by object."""

from __future__ import annotations

import copy
from typing import Any

# Labels only a Helm release adds (release name, chart version); not in deploy/kubernetes.
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def strip_release(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without what only a Helm release adds (labels, the config checksum)."""
    doc = copy.deepcopy(doc)

    def clean(labels: dict[str, Any] | None) -> None:
        for key in HELM_LABELS:
            (labels or {}).pop(key, None)

    clean(doc["metadata"].get("labels"))
    spec = doc.get("spec", {})
    clean(spec.get("selector", {}).get("matchLabels") if isinstance(spec.get("selector"), dict) else None)
    if doc["kind"] == "Service":
        clean(spec.get("selector"))
    if doc["kind"] == "NetworkPolicy":
        clean(spec["podSelector"].get("matchLabels"))
        for rule in [*spec.get("ingress", []), *spec.get("egress", [])]:
            for peer in [*rule.get("from", []), *rule.get("to", [])]:
                clean(peer.get("podSelector", {}).get("matchLabels"))
    template = spec.get("template")
    if template:
        clean(template["metadata"].get("labels"))
        annotations = template["metadata"].get("annotations", {})
        annotations.pop("checksum/config", None)
        if not annotations:
            template["metadata"].pop("annotations", None)
        for constraint in template["spec"].get("topologySpreadConstraints", []):
            clean(constraint["labelSelector"]["matchLabels"])
    return doc
