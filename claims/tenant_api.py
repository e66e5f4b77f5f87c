"""The console's side of a tenant's Kubernetes API: join tokens, node readiness, labels and taints, drain."""
# Everything goes through the official `kubernetes` client, built from the tenant's stored kubeconfig
# text: one ApiClient per call, closed after it, a timeout on every request. No Django imports:
# Celery tasks call this with plain arguments, outside any transaction. Nothing here logs the
# kubeconfig or a token; error messages name the API server and the object, never a credential.
from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import load_kube_config_from_dict

log = logging.getLogger(__name__)

TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_ID_RE = re.compile(r"^[a-z0-9]{6}$")
TOKEN_RE = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
BOOTSTRAP_NAMESPACE = "kube-system"
BOOTSTRAP_SECRET_TYPE = "bootstrap.kubernetes.io/token"
BOOTSTRAP_GROUPS = "system:bootstrappers:kubeadm:default-node-token"
BOOTSTRAP_USER_PREFIX = "system:bootstrap:"  # a bootstrap token's identity: this and its id
# What this console set on a node last time, so the next call replaces only its own labels and taints.
MANAGED_LABELS = "vmetal.dev/managed-labels"
MANAGED_TAINTS = "vmetal.dev/managed-taints"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
JOIN_MODES = ("vcluster", "kubeadm")
ENDPOINT_RE = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")  # host[:port], goes into a shell line
MERGE_PATCH = "application/merge-patch+json"


class TenantAPIError(Exception):
    """A tenant API call failed; the message says why in words an operator can act on."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the API answered, None when it could not be reached


@dataclass(frozen=True)
class BootstrapToken:
    id: str
    secret: str = field(repr=False)  # repr() and str() of a token never show the secret
    expires_at: datetime.datetime

    @property
    def token(self) -> str:
        return f"{self.id}.{self.secret}"


def _random(length: int) -> str:
    return "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(length))


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


B64_RE = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
KUBEADM_NEEDS_CA = ("a kubeadm join pins the tenant API's CA (--discovery-token-ca-cert-hash), and the tenant's "
                    "kubeconfig has none: add its certificate-authority-data, or use join mode vcluster")


def join_command(mode: str, endpoint: str, token: str, ca_cert_hash: str | None = None, *,
                 ca_data: str | None = None, scheme: str = "https") -> str:
    """The shell line a new node runs to join the tenant (it goes into cloud-init and onto the tenant's page, so
    every part is checked). It never turns certificate checking off: a vCluster join gives curl the tenant API's
    CA (`ca_data`, base64 PEM as in a kubeconfig) when there is one, else curl checks the machine's trusted CAs
    (or `scheme` is http: the API has no TLS); a kubeadm join pins the CA's hash, and without one is refused."""
    endpoint = re.sub(r"^https?://", "", endpoint.strip()).rstrip("/")
    if not ENDPOINT_RE.match(endpoint):
        raise ValueError(f"not a host[:port] endpoint: {endpoint!r}")
    if not TOKEN_RE.match(token):
        raise ValueError("not a bootstrap token: want <6 chars [a-z0-9]>.<16 chars [a-z0-9]>")
    if scheme not in ("https", "http"):
        raise ValueError(f"scheme must be https or http, not {scheme!r}")
    if mode == "vcluster":
        fetch = f'curl -fsSL "{scheme}://{endpoint}/node/join?token={token}" | sh -'
        if not ca_data:
            return fetch
        if not B64_RE.match(ca_data):
            raise ValueError("ca_data must be base64 (certificate-authority-data)")
        return f"echo {ca_data} | base64 -d | " + fetch.replace("curl -fsSL ", "curl -fsSL --cacert /dev/stdin ", 1)
    if mode == "kubeadm":
        if not ca_cert_hash:
            raise ValueError(KUBEADM_NEEDS_CA)
        digest = ca_cert_hash.removeprefix("sha256:").lower()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError("ca_cert_hash must be a sha256 hex digest")
        return f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash sha256:{digest}"
    raise ValueError(f"join mode must be one of {', '.join(JOIN_MODES)}, not {mode!r}")


def _is_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _skipped_by_drain(pod: dict) -> bool:
    """DaemonSet pods would come straight back; mirror pods belong to the kubelet's static manifests."""
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return True
    return any(ref.get("kind") == "DaemonSet" and ref.get("controller") for ref in meta.get("ownerReferences") or [])


def _split(value: str | None) -> set[str]:
    return {item for item in (value or "").split(",") if item}


def _message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


class PodWatch:
    """One watch request on a tenant's pods, through the official client's watch.Watch: iterate it for the
    events after `resource_version` as {"type", "object"} dicts (ADDED, MODIFIED, DELETED; BOOKMARKs only move
    `resource_version`). Iteration ends when the server ends the watch (its timeoutSeconds), when the stream
    drops, or on stop(): resume from `resource_version`, which follows every event. An expired
    resourceVersion (410 Gone, or an ERROR event) raises TenantAPIError with status 410: list again. A server
    that cannot be reached raises TenantAPIError (status None)."""

    def __init__(self, tenant_api: TenantAPI, resource_version: str, timeout_s: int) -> None:
        self.tenant_api = tenant_api
        self.resource_version = resource_version
        self.timeout_s = max(1, int(timeout_s))
        self.events_seen = 0
        self._watch = watch.Watch(return_type="object")  # "object": the events' objects stay plain dicts
        self._stopped = threading.Event()

    def stop(self) -> None:
        """End the iteration soon, from any thread (the blocked read is woken by shutting its socket)."""
        self._stopped.set()
        self._watch.stop()

    def __iter__(self) -> Iterator[dict]:
        server = self.tenant_api.server
        with self.tenant_api._client() as api:
            if self._stopped.is_set():
                return
            v1 = client.CoreV1Api(api)
            try:
                for event in self._watch.stream(
                        v1.list_pod_for_all_namespaces, resource_version=self.resource_version,
                        allow_watch_bookmarks=True, timeout_seconds=self.timeout_s,
                        _request_timeout=(self.tenant_api.timeout, self.timeout_s + self.tenant_api.timeout)):
                    self.resource_version = str(self._watch.resource_version or self.resource_version)
                    if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                        continue  # BOOKMARK
                    self.events_seen += 1
                    yield {"type": event["type"], "object": event["raw_object"]}
                    if self._stopped.is_set():
                        return
            except ApiException as exc:
                if self._stopped.is_set():
                    return
                if exc.status == 410:
                    raise TenantAPIError("watch pods: resourceVersion expired (410 Gone)", status=410) from exc
                if exc.http_resp is None:  # an ERROR event in the stream, not an HTTP answer
                    raise TenantAPIError(f"watch pods: the stream reported {exc.status}: {exc.reason}",
                                         status=exc.status) from exc
                raise self.tenant_api._error("watch pods", exc) from exc
            except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError):
                return  # the stream dropped: resume from resource_version (a dead server fails the next request)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if self._stopped.is_set():
                    return
                reason = getattr(exc, "reason", None) or exc
                raise TenantAPIError(f"tenant API unreachable: {server}: {reason}") from exc
            finally:
                self._watch._api_client.close()  # the deserializer's own client, unused for requests


class TenantAPI:
    """One tenant's Kubernetes API, reached with the kubeconfig the console stores for it."""

    def __init__(self, kubeconfig: str, timeout: float = 10) -> None:
        try:
            config = yaml.safe_load(kubeconfig) if kubeconfig else None
        except yaml.YAMLError:
            raise TenantAPIError("tenant kubeconfig is not valid YAML") from None  # the text may hold a token
        if not isinstance(config, dict) or not config.get("clusters"):
            raise TenantAPIError("tenant kubeconfig has no clusters")
        self._config = config
        self.timeout = timeout
        self.server = self._cluster().get("server", "?")

    def __repr__(self) -> str:
        return f"<TenantAPI {self.server}>"

    join_command = staticmethod(join_command)

    # -- plumbing

    def _cluster(self) -> dict:
        config = self._config
        context_name = config.get("current-context")
        contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
        clusters = {c.get("name"): c.get("cluster") or {} for c in config.get("clusters") or []}
        cluster_name = contexts.get(context_name, {}).get("cluster") if contexts else None
        if cluster_name in clusters:
            return clusters[cluster_name]
        return next(iter(clusters.values()), {})

    @contextlib.contextmanager
    def _client(self) -> Iterator[client.ApiClient]:
        configuration = client.Configuration()
        try:
            load_kube_config_from_dict(self._config, client_configuration=configuration, persist_config=False)
        except (ConfigException, KeyError, TypeError, ValueError) as exc:
            raise TenantAPIError(f"tenant kubeconfig is unusable: {type(exc).__name__}") from None
        # Retry only what never reached the server; a timed-out POST must not be sent twice.
        configuration.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, redirect=0, backoff_factor=0.2)
        api = client.ApiClient(configuration)
        try:
            yield api
        finally:
            api.close()
            api.rest_client.pool_manager.clear()

    def _call(self, what: str, fn, *args, tolerate: tuple[int, ...] = (), **kwargs) -> Any:
        """fn(*args) with a timeout; None for a tolerated HTTP status; TenantAPIError for any failure."""
        kwargs.setdefault("_request_timeout", (self.timeout, self.timeout))
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status in tolerate:
                return None
            raise self._error(what, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise TenantAPIError(f"tenant API unreachable: {self.server}: {reason}") from exc

    def _error(self, what: str, exc: ApiException) -> TenantAPIError:
        if exc.status == 401:
            return TenantAPIError("tenant API rejected credentials (401)", status=401)
        if exc.status == 403:
            return TenantAPIError(f"tenant API forbade {what} (403): {_message(exc)}", status=403)
        if exc.status == 404:
            return TenantAPIError(f"{what}: not found (404)", status=404)
        return TenantAPIError(f"{what}: tenant API answered {exc.status}: {_message(exc)}", status=exc.status)

    # -- join

    def create_bootstrap_token(self, ttl_s: int = 3600, description: str = "vmetal join") -> BootstrapToken:
        """A bootstrap token Secret in kube-system, as `kubeadm token create` / `vcluster token create` make."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        expires_at = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=ttl_s)).replace(microsecond=0)
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            for _ in range(3):  # a 6-character id can collide with a live token
                token = BootstrapToken(id=_random(6), secret=_random(16), expires_at=expires_at)
                data = {
                    "token-id": token.id,
                    "token-secret": token.secret,
                    "expiration": _rfc3339(expires_at),
                    "usage-bootstrap-authentication": "true",
                    "usage-bootstrap-signing": "true",
                    "auth-extra-groups": BOOTSTRAP_GROUPS,
                    "description": description,
                }
                body = client.V1Secret(
                    metadata=client.V1ObjectMeta(name=f"bootstrap-token-{token.id}", namespace=BOOTSTRAP_NAMESPACE),
                    type=BOOTSTRAP_SECRET_TYPE,
                    data={k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
                )
                if self._call(f"create bootstrap token {token.id}", v1.create_namespaced_secret,
                              BOOTSTRAP_NAMESPACE, body, tolerate=(409,)) is not None:
                    log.info("bootstrap token %s created on %s, expires %s", token.id, self.server, data["expiration"])
                    return token
        raise TenantAPIError("create bootstrap token: three token ids in a row were taken")

    def delete_bootstrap_token(self, token_id: str) -> bool:
        """Delete the token's Secret; False when it was already gone. Accepts the id or the whole token."""
        token_id = token_id.split(".", 1)[0]
        if not TOKEN_ID_RE.match(token_id):
            raise ValueError("not a bootstrap token id")
        with self._client() as api:
            deleted = self._call(f"delete bootstrap token {token_id}", client.CoreV1Api(api).delete_namespaced_secret,
                                 f"bootstrap-token-{token_id}", BOOTSTRAP_NAMESPACE, tolerate=(404,))
        return deleted is not None

    def bootstrap_tokens_used(self) -> set[str]:
        """The ids of the bootstrap tokens a kubelet has joined with: the CertificateSigningRequests of its TLS
        bootstrap name the token's identity (spec.username system:bootstrap:<id>), as long as the API keeps them
        (kube-controller-manager cleans up CSRs after a day or so)."""
        with self._client() as api:
            found = self._call("list certificate signing requests",
                               client.CertificatesV1Api(api).list_certificate_signing_request)
        used = set()
        for csr in getattr(found, "items", None) or []:
            username = (csr.spec.username or "") if csr.spec else ""
            if username.startswith(BOOTSTRAP_USER_PREFIX):
                used.add(username.removeprefix(BOOTSTRAP_USER_PREFIX))
        return used

    def ca_data(self) -> str | None:
        """The cluster CA as the kubeconfig holds it (base64 PEM, whitespace removed), checked to be a certificate;
        None when the kubeconfig has none."""
        data = "".join((self._cluster().get("certificate-authority-data") or "").split())
        if not data:
            return None
        self.ca_cert_hash()  # raises TenantAPIError unless it is a PEM certificate
        return data

    def join_refusal(self, mode: str) -> str:
        """Why no join command can be made for this tenant ("" when one can): asked before a token is made."""
        if mode == "kubeadm" and (self.server.lower().startswith("http://") or not self.ca_data()):
            return KUBEADM_NEEDS_CA
        return ""

    def join(self, mode: str, endpoint: str, token: str) -> tuple[str, str]:
        """(the join command for this tenant, a note for whoever runs it by hand on what it verifies)."""
        plain = self.server.lower().startswith("http://")
        ca = None if plain else self.ca_data()
        command = join_command(mode, endpoint, token, self.ca_cert_hash() if ca else None, ca_data=ca,
                               scheme="http" if plain else "https")
        if plain:
            note = ("The tenant API is plain HTTP (no TLS): nothing can verify who answers. Run this only on a "
                    "network you trust.")
        elif ca and mode == "kubeadm":
            note = "kubeadm checks the tenant API against the hash of its CA (from the tenant's kubeconfig)."
        elif ca:
            note = "curl checks the tenant API's certificate against its CA (from the tenant's kubeconfig)."
        else:
            note = ("The tenant's kubeconfig has no CA: curl checks the tenant API's certificate against the "
                    "machine's trusted CAs.")
        return command, note

    def ca_cert_hash(self) -> str | None:
        """sha256 (hex) of the cluster CA's SubjectPublicKeyInfo, as kubeadm's --discovery-token-ca-cert-hash."""
        data = self._cluster().get("certificate-authority-data")
        if not data:
            return None
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        try:
            pem = base64.b64decode(data)
            cert = x509.load_pem_x509_certificates(pem)[0]
        except (ValueError, TypeError, IndexError):
            raise TenantAPIError("tenant kubeconfig: certificate-authority-data is not a PEM certificate") from None
        spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return hashlib.sha256(spki).hexdigest()

    # -- nodes

    def wait_node_ready(self, node_name: str, deadline_s: float) -> dict:
        """Block until the node exists with Ready=True (a watch, re-listed when it expires); the node as a dict."""
        deadline = time.monotonic() + deadline_s
        selector = f"metadata.name={node_name}"
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            while True:
                listed = self._call(f"list node {node_name}", v1.list_node, field_selector=selector)
                for node in listed.items:
                    if node.metadata.name == node_name and _is_ready(raw := api.sanitize_for_serialization(node)):
                        return raw
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                watch_s = max(1, min(int(remaining + 0.999), 300))  # server-side timeout, whole seconds
                stream = watch.Watch()
                try:
                    for event in stream.stream(v1.list_node, field_selector=selector,
                                               resource_version=listed.metadata.resource_version,
                                               timeout_seconds=watch_s,
                                               _request_timeout=(self.timeout, watch_s + self.timeout)):
                        raw = event["raw_object"]
                        if (event["type"] in ("ADDED", "MODIFIED") and raw.get("metadata", {}).get("name") == node_name
                                and _is_ready(raw)):
                            stream.stop()
                            return raw
                        if time.monotonic() >= deadline:
                            stream.stop()
                except ApiException as exc:
                    if exc.status != 410:  # 410 Gone: the resourceVersion is too old, list again
                        raise self._error(f"watch node {node_name}", exc) from exc
                except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError):
                    pass  # the watch connection dropped: list again (a dead server fails the list)
                except (urllib3.exceptions.HTTPError, OSError) as exc:
                    raise TenantAPIError(f"tenant API unreachable: {self.server}: {exc}") from exc
                if time.monotonic() >= deadline:
                    break
        raise TenantAPIError(f"node {node_name} not Ready within {deadline_s:g}s")

    def node_exists(self, node_name: str) -> bool:
        with self._client() as api:
            return self._call(f"read node {node_name}", client.CoreV1Api(api).read_node, node_name,
                              tolerate=(404,)) is not None

    def get_node(self, node_name: str) -> dict | None:
        with self._client() as api:
            node = self._call(f"read node {node_name}", client.CoreV1Api(api).read_node, node_name, tolerate=(404,))
            return None if node is None else api.sanitize_for_serialization(node)

    def set_node_labels_and_taints(self, node_name: str, labels: dict, taints: list[dict]) -> dict:
        """Set the pool's labels and taints on the node, replacing the ones this console set before.

        Labels and taints someone else put on the node stay. What the console owns is remembered in
        two annotations, and the patch carries the resourceVersion it was computed from (409: retry).
        """
        wanted = []
        for taint in taints:
            if not taint.get("key") or taint.get("effect") not in TAINT_EFFECTS:
                raise ValueError(f"a taint needs a key and an effect in {TAINT_EFFECTS}: {taint!r}")
            wanted.append({"key": taint["key"], "effect": taint["effect"],
                           **({"value": str(taint["value"])} if taint.get("value") not in (None, "") else {})})
        wanted_ids = {(t["key"], t["effect"]) for t in wanted}
        labels = {str(k): str(v) for k, v in labels.items()}
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            for _ in range(5):
                node = self._call(f"read node {node_name}", v1.read_node, node_name)
                meta = node.metadata
                annotations = meta.annotations or {}
                owned_labels = _split(annotations.get(MANAGED_LABELS))
                owned_taints = _split(annotations.get(MANAGED_TAINTS))
                kept = [api.sanitize_for_serialization(t) for t in (node.spec.taints or [])
                        if (t.key, t.effect) not in wanted_ids and f"{t.key}:{t.effect}" not in owned_taints]
                patch = {
                    "metadata": {
                        "resourceVersion": meta.resource_version,
                        "labels": {**{k: None for k in owned_labels - labels.keys()}, **labels},
                        "annotations": {MANAGED_LABELS: ",".join(sorted(labels)) or None,
                                        MANAGED_TAINTS: ",".join(sorted(f"{k}:{e}" for k, e in wanted_ids)) or None},
                    },
                    "spec": {"taints": (kept + wanted) or None},
                }
                patched = self._call(f"label node {node_name}", v1.patch_node, node_name, patch,
                                     _content_type=MERGE_PATCH, tolerate=(409,))
                if patched is not None:
                    return api.sanitize_for_serialization(patched)
        raise TenantAPIError(f"label node {node_name}: the node kept changing (409 five times)", status=409)

    def cordon(self, node_name: str) -> None:
        self._set_unschedulable(node_name, True)

    def uncordon(self, node_name: str) -> None:
        self._set_unschedulable(node_name, False)

    def _set_unschedulable(self, node_name: str, value: bool) -> None:
        with self._client() as api:
            self._call(f"{'cordon' if value else 'uncordon'} node {node_name}", client.CoreV1Api(api).patch_node,
                       node_name, {"spec": {"unschedulable": value or None}}, _content_type=MERGE_PATCH)

    def drain(self, node_name: str, grace_period_s: int | None = 30) -> dict:
        """One pass of a drain, which never waits: list the node's pods (not DaemonSet or mirror pods), ask for
        the eviction of each that is not terminating yet, and say what is left. The caller passes again later
        (claims.flows.step_drain_node: one pass per drive) until nothing is left, so no worker is held while
        pods terminate or a PodDisruptionBudget refuses (429: noted, asked again on the next pass).

        Evictions go through the Eviction API, so PodDisruptionBudgets hold. `grace_period_s` None: each pod's
        own grace period. Cordon first, or the scheduler may place new pods here. Returns {"left": the pods
        still on the node, "evicting": evictions accepted in this pass, "refused": {pod: why}}, pods as
        "namespace/name"."""
        left, evicting, refused = [], [], {}
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            options = client.V1DeleteOptions(grace_period_seconds=grace_period_s) if grace_period_s is not None else None
            for pod in map(api.sanitize_for_serialization, self._pods_on(v1, node_name)):
                if _skipped_by_drain(pod):
                    continue
                namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                key = f"{namespace}/{name}"
                left.append(key)
                if pod["metadata"].get("deletionTimestamp"):
                    continue  # already terminating
                eviction = client.V1Eviction(api_version="policy/v1", kind="Eviction", delete_options=options,
                                             metadata=client.V1ObjectMeta(name=name, namespace=namespace))
                try:
                    if self._call(f"evict pod {key}", v1.create_namespaced_pod_eviction, name, namespace, eviction,
                                  tolerate=(404,)) is None:
                        left.remove(key)  # gone meanwhile
                    else:
                        evicting.append(key)
                except TenantAPIError as exc:
                    if exc.status != 429:
                        raise
                    refused[key] = str(exc)
        if not left:
            log.info("node %s on %s drained", node_name, self.server)
        return {"left": sorted(left), "evicting": sorted(evicting), "refused": refused}

    def _pods_on(self, v1: client.CoreV1Api, node_name: str) -> list:
        return self._call(f"list pods on node {node_name}", v1.list_pod_for_all_namespaces,
                          field_selector=f"spec.nodeName={node_name}").items

    def delete_node(self, node_name: str) -> bool:
        """Remove the node from the tenant API; False when it was not there (deleting twice is fine)."""
        with self._client() as api:
            return self._call(f"delete node {node_name}", client.CoreV1Api(api).delete_node, node_name,
                              tolerate=(404,)) is not None

    def list_nodes(self) -> dict[str, dict]:
        """Every node of the tenant: its name → its labels (what the world reconcile after a restore reads)."""
        import json

        with self._client() as api:
            response = self._call("list nodes", client.CoreV1Api(api).list_node, _preload_content=False)
            try:
                items = json.loads(response.data).get("items") or []
                return {item["metadata"]["name"]: dict(item["metadata"].get("labels") or {}) for item in items}
            except (ValueError, AttributeError, KeyError, TypeError) as exc:
                raise TenantAPIError(f"list nodes: tenant API answered something that is not a node list: "
                                     f"{type(exc).__name__}") from None

    def list_node_annotations(self) -> dict[str, dict]:
        """Every node of the tenant: its name → its annotations (karpenter.sh/do-not-disrupt on a Node)."""
        import json

        with self._client() as api:
            response = self._call("list nodes", client.CoreV1Api(api).list_node, _preload_content=False)
            try:
                items = json.loads(response.data).get("items") or []
                return {item["metadata"]["name"]: dict(item["metadata"].get("annotations") or {}) for item in items}
            except (ValueError, AttributeError, KeyError, TypeError) as exc:
                raise TenantAPIError(f"list nodes: tenant API answered something that is not a node list: "
                                     f"{type(exc).__name__}") from None

    def list_node_pods(self) -> list[dict]:
        """Every pod bound to a node and not finished (Succeeded or Failed), as dicts: one list call for the whole
        tenant, which autonodes.disruption reads to see what runs on each node. Parsed straight from the JSON:
        the client's models cost more than the call with thousands of pods."""
        import json

        with self._client() as api:
            response = self._call("list pods", client.CoreV1Api(api).list_pod_for_all_namespaces,
                                  field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                                  _preload_content=False)
            try:
                return list(json.loads(response.data).get("items") or [])
            except (ValueError, AttributeError) as exc:
                raise TenantAPIError(f"list pods: tenant API answered something that is not a pod list: "
                                     f"{type(exc).__name__}") from None

    # -- pods

    def list_pods_for_watch(self, page_size: int = 500) -> tuple[list[dict], str]:
        """Every pod of the tenant as dicts (read in pages, parsed straight from the JSON) and the list's
        resourceVersion, where a watch of them starts (autonodes.watcher)."""
        pods: list[dict] = []
        resource_version, token = "", None
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            while True:
                kwargs = {"limit": page_size, "_preload_content": False, **({"_continue": token} if token else {})}
                response = self._call("list pods", v1.list_pod_for_all_namespaces, **kwargs)
                try:
                    page = json.loads(response.data)
                except ValueError:
                    raise TenantAPIError("list pods: the tenant API answered something that is not JSON") from None
                meta = page.get("metadata") or {}
                resource_version = resource_version or str(meta.get("resourceVersion") or "")
                pods += page.get("items") or []
                if not (token := meta.get("continue")):
                    return pods, resource_version

    def pod_watch(self, resource_version: str, timeout_s: int) -> PodWatch:
        """A watch of the tenant's pods after `resource_version` (iterate it; stop() from any thread)."""
        return PodWatch(self, resource_version, timeout_s)

    def list_unschedulable_pods(self) -> list[dict]:
        """Pending pods the scheduler could not place (PodScheduled=False, reason Unschedulable), as dicts."""
        with self._client() as api:
            pods = self._call("list pending pods", client.CoreV1Api(api).list_pod_for_all_namespaces,
                              field_selector="status.phase=Pending").items
            return [raw for raw in map(api.sanitize_for_serialization, pods)
                    if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                           and c.get("reason") == "Unschedulable"
                           for c in (raw.get("status") or {}).get("conditions") or [])]

    # -- workloads (manage.py workload: a demo's Job, submitted and deleted as a tenant would)

    def create_job(self, namespace: str, job: dict) -> dict:
        """Create a batch/v1 Job; TenantAPIError with status 409 when one of that name exists."""
        name = (job.get("metadata") or {}).get("name", "?")
        with self._client() as api:
            created = self._call(f"create job {namespace}/{name}", client.BatchV1Api(api).create_namespaced_job,
                                 namespace, job)
            return api.sanitize_for_serialization(created)

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete a Job and, in the background, its pods (the API's default for Jobs would orphan them); False
        when there was no such Job."""
        with self._client() as api:
            return self._call(f"delete job {namespace}/{name}", client.BatchV1Api(api).delete_namespaced_job, name,
                              namespace, propagation_policy="Background", tolerate=(404,)) is not None

    def list_jobs(self, namespace: str | None = None) -> list[dict]:
        with self._client() as api:
            batch = client.BatchV1Api(api)
            jobs = (self._call("list jobs", batch.list_job_for_all_namespaces) if namespace is None else
                    self._call(f"list jobs in {namespace}", batch.list_namespaced_job, namespace))
            return [api.sanitize_for_serialization(job) for job in jobs.items]

    def list_pods(self, namespace: str | None = None, label_selector: str = "") -> list[dict]:
        with self._client() as api:
            v1 = client.CoreV1Api(api)
            pods = (self._call("list pods", v1.list_pod_for_all_namespaces, label_selector=label_selector)
                    if namespace is None else
                    self._call(f"list pods in {namespace}", v1.list_namespaced_pod, namespace,
                               label_selector=label_selector))
            return [api.sanitize_for_serialization(pod) for pod in pods.items]
