"""The clusters external providers work in (a KubeVirt cluster, a Metal3 management cluster): reached with the
kubeconfig held in the ProviderSecret their clusterRef names, through the official client."""
import contextlib
import json
from collections.abc import Iterator

from django.conf import settings
from kubernetes import client

from claims.tenant_api import TenantAPI, TenantAPIError

from .errors import KindError
from .models import ProviderSecret

CLUSTER_SECRET_NAMESPACE = "vcluster-platform"  # where a clusterRef's kubeconfig Secret lives
KUBECONFIG_KEY = "kubeconfig"


def secret_data(secret: ProviderSecret) -> dict:
    try:
        data = json.loads(str(secret.contents) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def cluster_kubeconfig(provider) -> str:
    """The kubeconfig of the cluster `provider.config.clusterRef.cluster` names; KindError when there is none."""
    ref = (provider.config or {}).get("clusterRef") or {}
    name = ref.get("cluster") if isinstance(ref, dict) else None
    if not name:
        raise KindError(f"provider {provider.name} has no clusterRef.cluster", retry=False)
    secret = ProviderSecret.objects.filter(namespace=CLUSTER_SECRET_NAMESPACE, name=name).first()
    kubeconfig = secret_data(secret).get(KUBECONFIG_KEY) if secret else None
    if not kubeconfig:
        raise KindError(f"provider {provider.name}: no kubeconfig for cluster {name} (a Secret {name} in "
                        f"{CLUSTER_SECRET_NAMESPACE} with key {KUBECONFIG_KEY})", retry=False)
    return kubeconfig


@contextlib.contextmanager
def cluster_client(provider) -> Iterator[client.ApiClient]:
    """An ApiClient for the provider's cluster (use client.CustomObjectsApi(api) / CoreV1Api(api) on it)."""
    try:
        with TenantAPI(cluster_kubeconfig(provider), timeout=settings.TENANT_API_TIMEOUT_S)._client() as api:
            yield api
    except TenantAPIError as exc:
        raise KindError(f"cluster of provider {provider.name}: {exc}") from None
